// optim: AdamW, learning-rate schedules, global gradient norm and the loss scaler. It sees the
// parameters as one flat vector cut into spans, never as layer structs.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "common/config.h"

typedef struct {
    size_t offset, n;  // elements of the flat vector
    int decay;         // weight decay applies
} OptimSpan;

typedef struct {
    size_t n;            // elements of the flat parameter vector
    float *m, *v;        // fp32 moments (n), host memory for the CPU implementation
    long long t;         // completed (non-skipped) steps, used for bias correction
    OptimSpan *spans;
    int n_spans;
    float beta1, beta2, eps, weight_decay;
} AdamW;

void adamw_init(AdamW *opt, size_t n, const OptimSpan *spans, int n_spans, const Config *c);
void adamw_free(AdamW *opt);
// One AdamW step on fp32 params/grads (host): g = grads * grad_mult (unscale and clip), then
// decoupled decay p -= lr * wd * p for decayed spans, then the Adam update with bias correction.
void adamw_step_cpu(AdamW *opt, float *params, const float *grads, float lr, float grad_mult);

// Learning rate at `step` (0-based) of `total`. With W = optim.warmup_steps:
//   step < W:  lr * (step + 1) / W                              (linear warmup, reaches lr)
//   otherwise: p = (step - W) / (total - 1 - W), clamped to [0, 1] (p = 1 when total - 1 <= W)
//     cosine:   min_lr + (lr - min_lr) * (1 + cos(pi * p)) / 2
//     linear:   lr - (lr - min_lr) * p
//     constant: lr                                               (min_lr unused)
// so the first step after warmup uses lr and the last step (total - 1) uses min_lr.
float lr_at(const Config *c, long long step, long long total);

// Sum of squares of n fp32 values in double; +inf or NaN when any value is non-finite.
double sumsq_cpu(const float *x, size_t n);
// The multiplier applied to gradients: 1/loss_scale, times clip/(norm + 1e-6) when that is
// below 1 and clip > 0 (as torch.nn.utils.clip_grad_norm_).
float grad_multiplier(double grad_norm_unscaled, float clip, float loss_scale);

// Loss scaler (precision.*): dynamic scaling for fp16, a fixed scale, or scale 1. Every dtype
// skips a step whose gradients are non-finite.
typedef struct {
    float scale;
    int dynamic;
    int window;           // clean steps before doubling
    int clean_steps;      // since the last change
    long long skipped;    // total skipped steps
} LossScaler;

void scaler_init(LossScaler *s, const Config *c, int use_scaling);
// Report whether this step's gradients were finite; returns 1 when the step must be skipped.
int scaler_update(LossScaler *s, int grads_finite);
