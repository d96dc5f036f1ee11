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

typedef struct {
    size_t n;                 // elements of the flat vector
    float *master, *m, *v;    // (n) fp32 master weights and moments, device
    long long t;              // completed (non-skipped) steps, for bias correction
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

// One step: g = grads * grad_mult, decoupled decay for decayed spans, Adam update with bias
// correction of step t + 1; writes master (fp32) and params (n, dtype). Asynchronous.
void adamw_cuda_step(AdamWCuda *opt, void *params, const void *grads, float lr, float grad_mult);

// The same AdamW behind the Optimizer interface (optimizer_create picks it for DEVICE_CUDA).
Optimizer *adamw_cuda_optimizer_create(size_t n, const OptimSpan *spans, int n_spans,
                                       const Config *c, DType dtype, void *stream);

#ifdef __cplusplus
}
#endif
