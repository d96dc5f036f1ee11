// optim: AdamW, learning-rate schedules, global gradient norm and the loss scaler. It sees the
// parameters as one flat vector cut into spans, never as layer structs.
#pragma once
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "common/config.h"
#include "common/dtype.h"

typedef struct {
    size_t offset, n;  // elements of the flat vector
    int decay;         // weight decay applies
} OptimSpan;

typedef struct {
    size_t n;            // elements of the flat parameter vector
    float *m, *v;        // fp32 moments (n), host memory for the CPU implementation
    OptimSpan *spans;
    int n_spans;
    float beta1, beta2, eps, weight_decay;
} AdamW;

void adamw_init(AdamW *opt, size_t n, const OptimSpan *spans, int n_spans, const Config *c);
void adamw_free(AdamW *opt);
// AdamW step number t (1-based: the bias corrections of step t) on fp32 params/grads (host):
// g = grads * grad_mult (unscale and clip), then decoupled decay p -= lr * wd * p for decayed
// spans, then the Adam update with bias correction. The caller holds the step count.
void adamw_step_cpu(AdamW *opt, float *params, const float *grads, long long t, float lr,
                    float grad_mult);

// One step as the host reports it: what a step decided on the device writes into its record.
typedef struct {
    float loss;        // mean loss over the step's micro-batches
    float lr;
    float grad_norm;   // global norm of the unscaled gradient; inf/nan if not finite
    float loss_scale;  // the scale this step's backward used
    int skipped;       // 1: non-finite gradients, the step changed nothing but the scaler
} StepRecord;

typedef struct LossScaler LossScaler;

// ---- the optimizer the trainer steps ----
// AdamW behind one interface, as Backend is for the model's ops: on the CPU the parameters are
// fp32 host memory and are themselves the master weights (adamw_step_cpu); on a CUDA GPU the
// fp32 master weights and moments live on the device beside the compute-dtype parameters
// (optim/optim_cuda.h). It covers n elements of the flat parameter vector (one rank's shard).
typedef struct Optimizer Optimizer;
struct Optimizer {
    Device device;
    size_t n;
    int has_master;    // 1: fp32 master weights kept apart from the parameters
    void *ctx;         // implementation state
    void (*destroy)(Optimizer *o);
    // Sum of squares of grads (n, the parameters' dtype) in double, deterministic (fixed order);
    // +inf or NaN when any gradient is non-finite. Waits for the result.
    double (*grad_sumsq)(Optimizer *o, const void *grads);
    // One step (t + 1): g = grads * grad_mult, decoupled decay for decayed spans, the Adam update
    // with bias correction; writes params (n, dtype) and the master weights. Asynchronous on a GPU.
    void (*step)(Optimizer *o, void *params, const void *grads, float lr, float grad_mult);
    // The completed (non-skipped) steps, for bias correction: held once, by the implementation
    // (on a GPU in device memory, so get_t waits for the device).
    long long (*get_t)(Optimizer *o);
    void (*set_t)(Optimizer *o, long long t);
    // The state as host fp32 (n each), for checkpoints; any pointer may be NULL (master is
    // ignored without has_master). Both wait for their copies.
    void (*get_state)(Optimizer *o, float *master, float *m, float *v);
    void (*set_state)(Optimizer *o, const float *master, const float *m, const float *v);
    // The master weights (n fp32) into dst, memory of the optimizer's device; NULL without
    // has_master. Waits for the copy.
    void (*copy_master)(Optimizer *o, float *dst);

    // ---- steps decided on the device (CUDA; all NULL on the CPU) ----
    void *dev_state;   // their implementation state
    // The gradient norm, the non-finite check, the loss scaler, clipping and the AdamW skip are
    // decided by kernels from device memory, and each step's numbers land in a device ring of
    // StepRecords read back when the host asks: a step needs no host wait, and its kernels can be
    // captured once as a CUDA graph and replayed.
    // dev_open: the ring of n_records records; loss_div: what the summed micro-batch losses divide
    // by (grad_accum x ranks); clip: optim.grad_clip.
    void (*dev_open)(Optimizer *o, int n_records, double loss_div, float clip);
    // Before a step (a kernel, no wait): its lr and record slot; clears the loss accumulator.
    void (*dev_begin)(Optimizer *o, float lr, int slot);
    // The loss accumulator (1, device fp64) the micro-batches add their mean losses into.
    double *(*dev_loss)(Optimizer *o);
    // After the gradients: their sum of squares, the norm, the scaler's update, the multiplier
    // (unscale and clip) and the AdamW step, which a non-finite gradient turns into no change;
    // then the step's record into its slot. Asynchronous.
    void (*dev_step)(Optimizer *o, void *params, const void *grads);
    // n records from slot first on (wrapping around the ring) into host; waits for them.
    void (*dev_records)(Optimizer *o, StepRecord *host, int first, int n);
    // The loss scaler's device state: get waits for the device, set is a kernel (no wait).
    void (*dev_get_scaler)(Optimizer *o, LossScaler *s);
    void (*dev_set_scaler)(Optimizer *o, const LossScaler *s);
};

// AdamW for parameters of dtype on device (DEVICE_CUDA: kernels on stream, a cudaStream_t;
// DEVICE_CPU: fp32 only) over n elements cut into spans; hyperparameters from c->optim. Master
// weights (CUDA) start at zero: set them with set_state. Exits with a message when this build
// has no such device.
Optimizer *optimizer_create(Device device, DType dtype, void *stream, size_t n,
                            const OptimSpan *spans, int n_spans, const Config *c);
// Bytes of device memory the state of n elements needs (0 on the CPU, where it is host memory).
size_t optimizer_device_bytes(Device device, size_t n);

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
// The two decisions below are written once for the host and the GPU (optim/step_cuda.cu runs
// them in a kernel): the same source, the same IEEE operations, the same results.
#ifdef __CUDACC__
#define OPTIM_HOST_DEVICE __host__ __device__
#else
#define OPTIM_HOST_DEVICE
#endif

// The multiplier applied to gradients: 1/loss_scale, times clip/(norm + 1e-6) when that is
// below 1 and clip > 0 (as torch.nn.utils.clip_grad_norm_).
static inline OPTIM_HOST_DEVICE float grad_multiplier(double grad_norm_unscaled, float clip,
                                                      float loss_scale) {
    double mult = 1.0 / (double)loss_scale;
    if (clip > 0) {
        const double coef = (double)clip / (grad_norm_unscaled + 1e-6);
        if (coef < 1.0) mult *= coef;
    }
    return (float)mult;
}

// Loss scaler (precision.*): dynamic scaling for fp16, a fixed scale, or scale 1. Every dtype
// skips a step whose gradients are non-finite.
struct LossScaler {
    float scale;
    int dynamic;
    int window;           // clean steps before doubling
    int clean_steps;      // since the last change
    long long skipped;    // total skipped steps
};

void scaler_init(LossScaler *s, const Config *c, int use_scaling);
// Report whether this step's gradients were finite; returns 1 when the step must be skipped.
// Dynamic: x0.5 on an overflow, x2 after `window` clean steps in a row.
static inline OPTIM_HOST_DEVICE int scaler_update(LossScaler *s, int grads_finite) {
    if (!grads_finite) {
        s->skipped++;
        s->clean_steps = 0;
        if (s->dynamic) s->scale *= 0.5f;
        return 1;
    }
    s->clean_steps++;
    if (s->dynamic && s->clean_steps >= s->window) {
        // The scale stops growing where doubling would overflow fp32 (a run that never
        // overflows fp16 would otherwise reach inf after ~100 windows).
        if (isfinite(s->scale * 2.0f)) s->scale *= 2.0f;
        s->clean_steps = 0;
    }
    return 0;
}
