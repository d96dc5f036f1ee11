// guard: the divergence guard's bookkeeping (train.divergence_steps, train.divergence_factor).
// A step is bad when its loss is not finite, when its gradient is not finite and no dynamic
// loss scale explains it (fp16's scaler halves its scale on an overflow and skips the step: that
// is calibration, not divergence), or when its loss is a spike: above divergence_factor times the
// running mean of the good steps' losses (an exponential mean over about the last 10 steps). When
// divergence_steps bad steps come in a row the run goes back to its newest checkpoint and skips
// the data those steps read (train_gpt.c). Every rank sees the same all-reduced loss and norm, so
// every rank decides alike.
#pragma once
#include <stdint.h>

#include "common/config.h"
#include "trainer/train_step.h"

typedef struct {
    int steps;              // train.divergence_steps; 0: the guard is off
    double factor;          // train.divergence_factor
    double mean;            // running mean loss of the good steps; 0: none yet
    int streak;             // consecutive bad steps up to the last one observed
    long long first_step;   // the first step of the streak (1-based)
    uint64_t first_data;    // the data position that step started from
} Guard;

// mean: the running mean to start from (a checkpoint's TrainState.guard_loss_mean; 0: none).
void guard_init(Guard *g, const Config *c, double mean);
// Observes step `step` (1-based, just completed) whose batches started at data position
// data_before, with stats s; dynamic_scale: the loss scale is dynamic (fp16). Returns 1 when the
// streak of bad steps has reached g->steps (the caller goes back and resets the streak).
int guard_observe(Guard *g, long long step, const StepStats *s, int dynamic_scale,
                  uint64_t data_before);
