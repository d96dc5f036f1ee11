// train_step: one optimizer step of the GPT: grad_accum micro-batches of forward + backward,
// global gradient norm (with the non-finite check), clipping, the loss scaler, the learning-rate
// schedule and AdamW. Shared by the training loop and the oracle tests so both run the same code.
#pragma once
#include <stdint.h>

#include "common/config.h"
#include "model/gpt.h"
#include "optim/optim.h"

typedef struct Trainer Trainer;   // opaque

// Fills the next micro-batch: inputs (B,T), targets (B,T) host int32.
typedef void (*NextBatchFn)(void *ctx, int *inputs, int *targets);

typedef struct {
    float loss;        // mean loss over the step's micro-batches
    float lr;
    float grad_norm;   // global norm of the (unscaled, unclipped) gradient; inf/nan if not finite
    int skipped;       // 1 when the step was skipped (non-finite gradients)
    float loss_scale;  // scale used during this step
} StepStats;

Trainer *trainer_create(GPT *m, const Config *c);
void trainer_free(Trainer *t);
// Runs optimizer step `step` (0-based) of c->train.steps.
StepStats trainer_step(Trainer *t, long long step, NextBatchFn next, void *ctx);
AdamW *trainer_optimizer(Trainer *t);      // for checkpoints: moments, step count
LossScaler *trainer_scaler(Trainer *t);
