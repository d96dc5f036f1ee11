// optim_cuda: AdamW on the GPU (built only with CUDA). The whole flat parameter vector is updated
// in ONE launch (multi-tensor: a table of fixed-size chunks covers every span, each chunk knowing
// whether it decays), with fp32 master weights and moments, writing both the fp32 master and the
// compute-dtype parameters the model reads. The math is adamw_step_cpu's, operation for
// operation with the same roundings (no fused multiply-adds), so fp32 master weights and moments
// are bitwise those of the CPU implementation given the same gradients.
//
// The global gradient sum of squares (for the norm and clipping) carries the non-finite check:
// an inf or NaN gradient makes it inf or NaN.
//
// Every pointer below is device memory unless it says host. Kernels run on `stream` (a
// cudaStream_t; NULL = the legacy default stream, which is ordered with the CUDA backend's
// blocking stream).
#pragma once
#include <stddef.h>

#include "common/config.h"
#include "common/dtype.h"
#include "optim/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

// Per-step scalars, computed on the device by adamw_scalars_kernel exactly as adamw_step_cpu
// computes them on the host.
typedef struct {
    float grad_mult, decay_mul;
    float beta1, one_minus_beta1, beta2, one_minus_beta2, eps;
    float step_size, bc2_sqrt;
} AdamWScalars;

// The optimizer's device state between the host and the kernels (AdamWCuda.dev): the step count
// lives here and only here, so a step needs nothing from the host but lr and grad_mult, which
// kernels write too (adamw_inputs_kernel, or the device decisions of optim/step_cuda.cu).
typedef struct AdamWDev {
    float lr, grad_mult;   // this step's inputs
    int skip;              // 1: this step leaves parameters, moments and t alone
    long long t;           // completed steps, for bias correction
    AdamWScalars s;        // the step's scalars (adamw_scalars_kernel)
} AdamWDev;


typedef struct {
    size_t n;                 // elements of the flat vector
    float *master, *m, *v;    // (n) fp32 master weights and moments, device
    AdamWDev *dev;            // device: lr, grad_mult, skip, the step count t and its scalars
    float beta1, beta2, eps, weight_decay;
    DType dtype;
    void *stream;             // cudaStream_t
    void *chunks;             // (n_chunks) device work table, one entry per block
    int n_chunks;
    double *partial;          // (n_partial + 1) sum-of-squares partials, then the total
    size_t n_partial;
} AdamWCuda;

// Allocates the state (moments zero, master weights zero until adamw_cuda_upload) for the spans
// of a flat vector of n elements; hyperparameters from c->optim.
void adamw_cuda_init(AdamWCuda *opt, size_t n, const OptimSpan *spans, int n_spans,
                     const Config *c, DType dtype, void *stream);
void adamw_cuda_free(AdamWCuda *opt);
// Host fp32 (n) <-> device state, for initialisation and checkpoints; any pointer may be NULL.
// Both wait for the copies to finish.
void adamw_cuda_upload(AdamWCuda *opt, const float *master, const float *m, const float *v);
void adamw_cuda_download(const AdamWCuda *opt, float *master, float *m, float *v);
// The master weights (n) into dst, device memory; waits for the copy.
void adamw_cuda_copy_master(const AdamWCuda *opt, float *dst);

// Sum of squares of the gradients (n, dtype) in double, deterministic (fixed blocks summed in a
// fixed order); +inf or NaN when any gradient is non-finite. Waits for the result.
double adamw_cuda_grad_sumsq(AdamWCuda *opt, const void *grads);
// The same without waiting: returns the device double that will hold it.
const double *adamw_cuda_grad_sumsq_async(AdamWCuda *opt, const void *grads);

// One step: g = grads * grad_mult, decoupled decay for decayed spans, Adam update with bias
// correction of step t + 1 (t: the count on the device); writes master (fp32) and params (n,
// dtype). Asynchronous: lr and grad_mult travel as kernel arguments.
void adamw_cuda_step(AdamWCuda *opt, void *params, const void *grads, float lr, float grad_mult);
// The step with lr, grad_mult and the skip flag already in opt->dev (written by a kernel of
// optim/step_cuda.cu): t + 1 and the scalars on the device (the bias corrections' powers in
// double-double, so they round as the host's pow), then the update; a skip changes nothing.
void adamw_cuda_apply(AdamWCuda *opt, void *params, const void *grads);
// The step count on the device: get waits for it, set is a kernel.
long long adamw_cuda_get_t(const AdamWCuda *opt);
void adamw_cuda_set_t(AdamWCuda *opt, long long t);

// Fills o's dev_* functions (optim/optim.h) for the AdamW a, and frees their state
// (optim/step_cuda.cu).
void step_cuda_attach(Optimizer *o, AdamWCuda *a);
void step_cuda_detach(Optimizer *o);

// The same AdamW behind the Optimizer interface (optimizer_create picks it for DEVICE_CUDA).
Optimizer *adamw_cuda_optimizer_create(size_t n, const OptimSpan *spans, int n_spans,
                                       const Config *c, DType dtype, void *stream);

#ifdef __cplusplus
}
#endif
