// step_cuda: the decisions of a training step made on the GPU (optim/optim.h's dev_* functions
// over the AdamW of optim/adamw_cuda.cu): the gradient norm and its non-finite check, the loss
// scaler, clipping and the AdamW skip, with the step's numbers written into a ring of records
// the host reads back when it reports. Nothing here waits for the device but the readbacks, so
// a whole step can be captured as a CUDA graph and replayed.
#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>

#include "common/cuda_check.cuh"

extern "C" {
#include "common/check.h"
#include "optim/optim_cuda.h"
}

// The decision state in device memory: this step's inputs, its loss, the scaler across steps.
typedef struct {
    double loss;       // the micro-batches' mean losses, summed
    float lr;
    int slot;          // this step's record
    LossScaler scaler;
} StepDev;

// The host side of it (AdamWCuda's companion, freed with the optimizer).
typedef struct {
    AdamWCuda *adamw;
    StepDev *dev;         // (1) device
    StepRecord *records;  // (n_records) device ring
    int n_records;
    double loss_div;      // grad_accum x ranks
    float clip;           // optim.grad_clip
} StepCuda;

static StepCuda *step_cuda(Optimizer *o) { return (StepCuda *)o->dev_state; }
static cudaStream_t step_stream(const StepCuda *s) { return (cudaStream_t)s->adamw->stream; }

__global__ void step_begin_kernel(StepDev *d, float lr, int slot) {
    d->loss = 0.0;
    d->lr = lr;
    d->slot = slot;
}

// One thread, in the host's order of operations (trainer/train_step.c's host decisions): the
// unscaled norm in double, the scaler's update, the multiplier; the record and AdamW's inputs.
__global__ void step_decide_kernel(StepDev *d, const double *sumsq, AdamWDev *a,
                                   StepRecord *records, double loss_div, float clip) {
    const float scale = d->scaler.scale;
    const double norm = __ddiv_rn(__dsqrt_rn(*sumsq), (double)scale);
    const int skip = scaler_update(&d->scaler, isfinite(norm));
    StepRecord r;
    r.loss = (float)__ddiv_rn(d->loss, loss_div);
    r.lr = d->lr;
    r.grad_norm = (float)norm;
    r.loss_scale = scale;
    r.skipped = skip;
    records[d->slot] = r;
    a->lr = d->lr;
    a->skip = skip;
    a->grad_mult = skip ? 0.0f : grad_multiplier(norm, clip, scale);
}

__global__ void step_set_scaler_kernel(StepDev *d, LossScaler s) { d->scaler = s; }

static void dev_open(Optimizer *o, int n_records, double loss_div, float clip) {
    StepCuda *s = step_cuda(o);
    CHECK(n_records > 0 && !s->records);
    s->n_records = n_records;
    s->loss_div = loss_div;
    s->clip = clip;
    CUDA_CHECK(cudaMalloc(&s->records, (size_t)n_records * sizeof(StepRecord)));
    CUDA_CHECK(cudaMemsetAsync(s->records, 0, (size_t)n_records * sizeof(StepRecord),
                               step_stream(s)));
}

static void dev_begin(Optimizer *o, float lr, int slot) {
    StepCuda *s = step_cuda(o);
    CHECK(slot >= 0 && slot < s->n_records);
    step_begin_kernel<<<1, 1, 0, step_stream(s)>>>(s->dev, lr, slot);
    CUDA_CHECK(cudaGetLastError());
}

static double *dev_loss(Optimizer *o) { return &step_cuda(o)->dev->loss; }

static void dev_step(Optimizer *o, void *params, const void *grads) {
    StepCuda *s = step_cuda(o);
    const double *sumsq = adamw_cuda_grad_sumsq_async(s->adamw, grads);
    step_decide_kernel<<<1, 1, 0, step_stream(s)>>>(s->dev, sumsq, s->adamw->dev, s->records,
                                                    s->loss_div, s->clip);
    CUDA_CHECK(cudaGetLastError());
    adamw_cuda_apply(s->adamw, params, grads);
}

static void dev_records(Optimizer *o, StepRecord *host, int first, int n) {
    StepCuda *s = step_cuda(o);
    CHECK(first >= 0 && first < s->n_records && n >= 0 && n <= s->n_records);
    cudaStream_t st = step_stream(s);
    const int head = n < s->n_records - first ? n : s->n_records - first;
    CUDA_CHECK(cudaMemcpyAsync(host, s->records + first, (size_t)head * sizeof(StepRecord),
                               cudaMemcpyDeviceToHost, st));
    if (n > head)
        CUDA_CHECK(cudaMemcpyAsync(host + head, s->records, (size_t)(n - head) * sizeof(StepRecord),
                                   cudaMemcpyDeviceToHost, st));
    CUDA_CHECK(cudaStreamSynchronize(st));
}

static void dev_get_scaler(Optimizer *o, LossScaler *out) {
    StepCuda *s = step_cuda(o);
    cudaStream_t st = step_stream(s);
    CUDA_CHECK(cudaMemcpyAsync(out, &s->dev->scaler, sizeof *out, cudaMemcpyDeviceToHost, st));
    CUDA_CHECK(cudaStreamSynchronize(st));
}

static void dev_set_scaler(Optimizer *o, const LossScaler *in) {
    StepCuda *s = step_cuda(o);
    step_set_scaler_kernel<<<1, 1, 0, step_stream(s)>>>(s->dev, *in);
    CUDA_CHECK(cudaGetLastError());
}

void step_cuda_attach(Optimizer *o, AdamWCuda *a) {
    StepCuda *s = (StepCuda *)xcalloc(1, sizeof *s);
    s->adamw = a;
    CUDA_CHECK(cudaMalloc(&s->dev, sizeof(StepDev)));
    CUDA_CHECK(cudaMemsetAsync(s->dev, 0, sizeof(StepDev), step_stream(s)));
    o->dev_state = s;
    o->dev_open = dev_open;
    o->dev_begin = dev_begin;
    o->dev_loss = dev_loss;
    o->dev_step = dev_step;
    o->dev_records = dev_records;
    o->dev_get_scaler = dev_get_scaler;
    o->dev_set_scaler = dev_set_scaler;
}

void step_cuda_detach(Optimizer *o) {
    StepCuda *s = step_cuda(o);
    CUDA_CHECK(cudaStreamSynchronize(step_stream(s)));
    CUDA_CHECK(cudaFree(s->dev));
    CUDA_CHECK(cudaFree(s->records));
    free(s);
    o->dev_state = NULL;
}
