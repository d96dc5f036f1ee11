// adamw_cuda: fused multi-tensor AdamW and the global gradient sum of squares on the GPU
// (interface and contract in optim/optim_cuda.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common/cuda_check.cuh"

extern "C" {
#include "optim/optim_cuda.h"
}

// One block updates one chunk of at most ADAMW_CHUNK elements of one span: 64 elements per
// thread, and ~7.6K blocks for GPT-2 124M, enough to fill any GPU.
#define ADAMW_CHUNK (1 << 14)
#define ADAMW_THREADS 256
// Elements per sum-of-squares partial: the same blocking as sumsq_cpu (optim/grad_norm.c).
#define SUMSQ_BLOCK (1 << 16)
#define SUMSQ_THREADS 256

typedef struct {
    size_t offset;   // first element in the flat vector
    uint32_t n;      // elements, <= ADAMW_CHUNK
    uint32_t decay;  // weight decay applies
} AdamWChunk;

static cudaStream_t opt_stream(const AdamWCuda *opt) { return (cudaStream_t)opt->stream; }

// Every operation explicitly rounded (__f*_rn): nvcc would otherwise contract a * b + c into a
// fused multiply-add, and the results would no longer match adamw_step_cpu bit for bit.
template <typename T>
__global__ void adamw_kernel(T *params, float *master, float *m, float *v, const T *grads,
                             const AdamWChunk *chunks, const AdamWDev *dev) {
    if (dev->skip) return;
    const AdamWScalars s = dev->s;
    const AdamWChunk c = chunks[blockIdx.x];
    const float decay = c.decay ? s.decay_mul : 1.0f;
    for (uint32_t j = threadIdx.x; j < c.n; j += ADAMW_THREADS) {
        const size_t i = c.offset + j;
        const float gi = __fmul_rn(static_cast<float>(grads[i]), s.grad_mult);
        const float pi = __fmul_rn(master[i], decay);
        const float mi = __fadd_rn(__fmul_rn(s.beta1, m[i]), __fmul_rn(s.one_minus_beta1, gi));
        const float vi =
            __fadd_rn(__fmul_rn(s.beta2, v[i]), __fmul_rn(__fmul_rn(s.one_minus_beta2, gi), gi));
        const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), s.bc2_sqrt), s.eps);
        const float p = __fsub_rn(pi, __fmul_rn(s.step_size, __fdiv_rn(mi, denom)));
        m[i] = mi;
        v[i] = vi;
        master[i] = p;
        params[i] = T(p);  // round to nearest even into the compute dtype
    }
}

// partial[b] = sum of squares of block b (SUMSQ_BLOCK elements) in double, fixed tree order.
template <typename T> __global__ void sumsq_kernel(double *partial, const T *g, size_t n) {
    __shared__ double sh[SUMSQ_THREADS];
    const size_t b0 = (size_t)blockIdx.x * SUMSQ_BLOCK;
    const size_t end = b0 + SUMSQ_BLOCK < n ? b0 + SUMSQ_BLOCK : n;
    double s = 0.0;
    for (size_t i = b0 + threadIdx.x; i < end; i += SUMSQ_THREADS) {
        const double x = static_cast<float>(g[i]);
        s += x * x;
    }
    sh[threadIdx.x] = s;
    __syncthreads();
    for (int o = SUMSQ_THREADS / 2; o > 0; o >>= 1) {
        if (threadIdx.x < o) sh[threadIdx.x] += sh[threadIdx.x + o];
        __syncthreads();
    }
    if (threadIdx.x == 0) partial[blockIdx.x] = sh[0];
}

// partial[n_partial] = the partials added in order (one thread: a few thousand doubles). A
// non-finite square is inf or NaN and survives the sum (squares are never negative).
__global__ void sumsq_total_kernel(double *partial, size_t n_partial) {
    double total = 0.0;
    for (size_t b = 0; b < n_partial; b++) total += partial[b];
    partial[n_partial] = total;
}

// (ah, al) *= (bh, bl) in double-double arithmetic (about 106 significant bits).
__device__ static void dd_mul(double &ah, double &al, double bh, double bl) {
    const double p = __dmul_rn(ah, bh);
    double e = __fma_rn(ah, bh, -p);
    e = __dadd_rn(e, __dadd_rn(__dmul_rn(ah, bl), __dmul_rn(al, bh)));
    const double sum = __dadd_rn(p, e);
    al = __dsub_rn(e, __dsub_rn(sum, p));
    ah = sum;
}

// b^e for e >= 0 by squaring in double-double, rounded once to double: the correctly rounded
// power, which is what the host's pow returns for these arguments (glibc's pow is accurate to
// well under one unit in the last place).
__device__ static double pow_int(double b, long long e) {
    double rh = 1.0, rl = 0.0, bh = b, bl = 0.0;
    while (e > 0) {
        if (e & 1) dd_mul(rh, rl, bh, bl);
        e >>= 1;
        if (e > 0) dd_mul(bh, bl, bh, bl);
    }
    return __dadd_rn(rh, rl);
}

// One thread: this step's inputs from the host (a kernel argument, so no copy waits).
__global__ void adamw_inputs_kernel(AdamWDev *dev, float lr, float grad_mult) {
    dev->lr = lr;
    dev->grad_mult = grad_mult;
    dev->skip = 0;
}

__global__ void adamw_set_t_kernel(AdamWDev *dev, long long t) { dev->t = t; }

// One thread: t + 1 and the step's scalars, operation for operation as adamw_step_cpu (bias
// corrections in double, as torch computes them from Python floats); nothing on a skipped step.
__global__ void adamw_scalars_kernel(AdamWDev *dev, float beta1, float beta2, float eps,
                                     float weight_decay) {
    if (dev->skip) return;
    const long long t = ++dev->t;
    const double lr = (double)dev->lr;
    AdamWScalars s;
    s.grad_mult = dev->grad_mult;
    s.decay_mul = __double2float_rn(__dsub_rn(1.0, __dmul_rn(lr, (double)weight_decay)));
    s.beta1 = beta1;
    s.one_minus_beta1 = __fsub_rn(1.0f, beta1);
    s.beta2 = beta2;
    s.one_minus_beta2 = __fsub_rn(1.0f, beta2);
    s.eps = eps;
    s.step_size = __double2float_rn(__ddiv_rn(lr, __dsub_rn(1.0, pow_int((double)beta1, t))));
    s.bc2_sqrt = __double2float_rn(__dsqrt_rn(__dsub_rn(1.0, pow_int((double)beta2, t))));
    dev->s = s;
}

void adamw_cuda_init(AdamWCuda *opt, size_t n, const OptimSpan *spans, int n_spans,
                     const Config *c, DType dtype, void *stream) {
    memset(opt, 0, sizeof *opt);
    opt->n = n;
    opt->dtype = dtype;
    opt->stream = stream;
    opt->beta1 = c->optim.beta1;
    opt->beta2 = c->optim.beta2;
    opt->eps = c->optim.eps;
    opt->weight_decay = c->optim.weight_decay;

    size_t n_chunks = 0;
    for (int i = 0; i < n_spans; i++) {
        CHECK(spans[i].offset + spans[i].n <= n);
        n_chunks += (spans[i].n + ADAMW_CHUNK - 1) / ADAMW_CHUNK;
    }
    CHECK(n_chunks < (1u << 31));
    AdamWChunk *table =
        (AdamWChunk *)xcalloc(n_chunks ? n_chunks : 1, sizeof *table);  // (n_chunks)
    size_t k = 0;
    for (int i = 0; i < n_spans; i++)
        for (size_t j = 0; j < spans[i].n; j += ADAMW_CHUNK) {
            table[k].offset = spans[i].offset + j;
            table[k].n = (uint32_t)(spans[i].n - j < ADAMW_CHUNK ? spans[i].n - j : ADAMW_CHUNK);
            table[k].decay = spans[i].decay ? 1u : 0u;
            k++;
        }
    opt->n_chunks = (int)n_chunks;
    opt->n_partial = (n + SUMSQ_BLOCK - 1) / SUMSQ_BLOCK;

    const size_t nb = (n ? n : 1) * sizeof(float);
    CUDA_CHECK(cudaMalloc(&opt->master, nb));
    CUDA_CHECK(cudaMalloc(&opt->m, nb));
    CUDA_CHECK(cudaMalloc(&opt->v, nb));
    CUDA_CHECK(cudaMalloc(&opt->chunks, (n_chunks ? n_chunks : 1) * sizeof(AdamWChunk)));
    CUDA_CHECK(cudaMalloc(&opt->partial, (opt->n_partial + 1) * sizeof(double)));
    CUDA_CHECK(cudaMalloc(&opt->dev, sizeof(AdamWDev)));
    cudaStream_t st = opt_stream(opt);
    CUDA_CHECK(cudaMemsetAsync(opt->dev, 0, sizeof(AdamWDev), st));
    CUDA_CHECK(cudaMemsetAsync(opt->master, 0, nb, st));
    CUDA_CHECK(cudaMemsetAsync(opt->m, 0, nb, st));
    CUDA_CHECK(cudaMemsetAsync(opt->v, 0, nb, st));
    CUDA_CHECK(cudaMemcpyAsync(opt->chunks, table, n_chunks * sizeof(AdamWChunk),
                                   cudaMemcpyHostToDevice, st));
    CUDA_CHECK(cudaStreamSynchronize(st));
    free(table);
}

void adamw_cuda_free(AdamWCuda *opt) {
    CUDA_CHECK(cudaStreamSynchronize(opt_stream(opt)));
    CUDA_CHECK(cudaFree(opt->master));
    CUDA_CHECK(cudaFree(opt->m));
    CUDA_CHECK(cudaFree(opt->v));
    CUDA_CHECK(cudaFree(opt->chunks));
    CUDA_CHECK(cudaFree(opt->partial));
    CUDA_CHECK(cudaFree(opt->dev));
    memset(opt, 0, sizeof *opt);
}

void adamw_cuda_upload(AdamWCuda *opt, const float *master, const float *m, const float *v) {
    cudaStream_t st = opt_stream(opt);
    const size_t nb = opt->n * sizeof(float);
    if (master)
        CUDA_CHECK(cudaMemcpyAsync(opt->master, master, nb, cudaMemcpyHostToDevice, st));
    if (m) CUDA_CHECK(cudaMemcpyAsync(opt->m, m, nb, cudaMemcpyHostToDevice, st));
    if (v) CUDA_CHECK(cudaMemcpyAsync(opt->v, v, nb, cudaMemcpyHostToDevice, st));
    CUDA_CHECK(cudaStreamSynchronize(st));
}

void adamw_cuda_download(const AdamWCuda *opt, float *master, float *m, float *v) {
    cudaStream_t st = opt_stream(opt);
    const size_t nb = opt->n * sizeof(float);
    if (master)
        CUDA_CHECK(cudaMemcpyAsync(master, opt->master, nb, cudaMemcpyDeviceToHost, st));
    if (m) CUDA_CHECK(cudaMemcpyAsync(m, opt->m, nb, cudaMemcpyDeviceToHost, st));
    if (v) CUDA_CHECK(cudaMemcpyAsync(v, opt->v, nb, cudaMemcpyDeviceToHost, st));
    CUDA_CHECK(cudaStreamSynchronize(st));
}

void adamw_cuda_copy_master(const AdamWCuda *opt, float *dst) {
    cudaStream_t st = opt_stream(opt);
    CUDA_CHECK(cudaMemcpyAsync(dst, opt->master, opt->n * sizeof(float), cudaMemcpyDeviceToDevice,
                               st));
    CUDA_CHECK(cudaStreamSynchronize(st));
}

// Runs f with a value of the element type of `dtype` (the run-time dtype switch of this file).
template <typename F> static void dispatch_optim_dtype(DType dtype, F &&f) {
    switch (dtype) {
    case DTYPE_F32: f(float{}); return;
    case DTYPE_BF16: f(__nv_bfloat16{}); return;
    case DTYPE_F16: f(__half{}); return;
    default: break;
    }
    fatal(EXIT_RUNTIME, "adamw_cuda: unknown dtype %d", (int)dtype);
}

const double *adamw_cuda_grad_sumsq_async(AdamWCuda *opt, const void *grads) {
    cudaStream_t st = opt_stream(opt);
    if (opt->n == 0) {
        CUDA_CHECK(cudaMemsetAsync(opt->partial, 0, sizeof(double), st));
        return opt->partial;
    }
    dispatch_optim_dtype(opt->dtype, [&](auto tag) {
        using E = decltype(tag);
        sumsq_kernel<E><<<(unsigned)opt->n_partial, SUMSQ_THREADS, 0, st>>>(
            opt->partial, (const E *)grads, opt->n);
    });
    CUDA_CHECK(cudaGetLastError());
    sumsq_total_kernel<<<1, 1, 0, st>>>(opt->partial, opt->n_partial);
    CUDA_CHECK(cudaGetLastError());
    return opt->partial + opt->n_partial;
}

double adamw_cuda_grad_sumsq(AdamWCuda *opt, const void *grads) {
    const double *dev = adamw_cuda_grad_sumsq_async(opt, grads);
    double total = 0.0;
    cudaStream_t st = opt_stream(opt);
    CUDA_CHECK(cudaMemcpyAsync(&total, dev, sizeof total, cudaMemcpyDeviceToHost, st));
    CUDA_CHECK(cudaStreamSynchronize(st));
    return total;
}

void adamw_cuda_apply(AdamWCuda *opt, void *params, const void *grads) {
    cudaStream_t st = opt_stream(opt);
    adamw_scalars_kernel<<<1, 1, 0, st>>>(opt->dev, opt->beta1, opt->beta2, opt->eps,
                                          opt->weight_decay);
    CUDA_CHECK(cudaGetLastError());
    if (opt->n_chunks == 0) return;
    dispatch_optim_dtype(opt->dtype, [&](auto tag) {
        using E = decltype(tag);
        adamw_kernel<E><<<opt->n_chunks, ADAMW_THREADS, 0, st>>>(
            (E *)params, opt->master, opt->m, opt->v, (const E *)grads,
            (const AdamWChunk *)opt->chunks, opt->dev);
    });
    CUDA_CHECK(cudaGetLastError());
}

void adamw_cuda_step(AdamWCuda *opt, void *params, const void *grads, float lr, float grad_mult) {
    adamw_inputs_kernel<<<1, 1, 0, opt_stream(opt)>>>(opt->dev, lr, grad_mult);
    CUDA_CHECK(cudaGetLastError());
    adamw_cuda_apply(opt, params, grads);
}

long long adamw_cuda_get_t(const AdamWCuda *opt) {
    long long t = 0;
    cudaStream_t st = opt_stream(opt);
    CUDA_CHECK(cudaMemcpyAsync(&t, &opt->dev->t, sizeof t, cudaMemcpyDeviceToHost, st));
    CUDA_CHECK(cudaStreamSynchronize(st));
    return t;
}

void adamw_cuda_set_t(AdamWCuda *opt, long long t) {
    adamw_set_t_kernel<<<1, 1, 0, opt_stream(opt)>>>(opt->dev, t);
    CUDA_CHECK(cudaGetLastError());
}

// ---- the Optimizer interface (optim/optim.h) over AdamWCuda ----

static AdamWCuda *cuda_adamw(Optimizer *o) { return (AdamWCuda *)o->ctx; }

static void cuda_destroy(Optimizer *o) {
    step_cuda_detach(o);
    adamw_cuda_free(cuda_adamw(o));
    free(o->ctx);
    free(o);
}

static double cuda_grad_sumsq(Optimizer *o, const void *grads) {
    return adamw_cuda_grad_sumsq(cuda_adamw(o), grads);
}

static void cuda_step(Optimizer *o, void *params, const void *grads, float lr, float grad_mult) {
    adamw_cuda_step(cuda_adamw(o), params, grads, lr, grad_mult);
}

static long long cuda_get_t(Optimizer *o) { return adamw_cuda_get_t(cuda_adamw(o)); }
static void cuda_set_t(Optimizer *o, long long t) { adamw_cuda_set_t(cuda_adamw(o), t); }

static void cuda_get_state(Optimizer *o, float *master, float *m, float *v) {
    adamw_cuda_download(cuda_adamw(o), master, m, v);
}

static void cuda_set_state(Optimizer *o, const float *master, const float *m, const float *v) {
    adamw_cuda_upload(cuda_adamw(o), master, m, v);
}

static void cuda_copy_master(Optimizer *o, float *dst) { adamw_cuda_copy_master(cuda_adamw(o), dst); }

Optimizer *adamw_cuda_optimizer_create(size_t n, const OptimSpan *spans, int n_spans,
                                       const Config *c, DType dtype, void *stream) {
    Optimizer *o = (Optimizer *)xcalloc(1, sizeof *o);
    AdamWCuda *a = (AdamWCuda *)xcalloc(1, sizeof *a);
    adamw_cuda_init(a, n, spans, n_spans, c, dtype, stream);
    o->device = DEVICE_CUDA;
    o->n = n;
    o->has_master = 1;
    o->ctx = a;
    o->destroy = cuda_destroy;
    o->grad_sumsq = cuda_grad_sumsq;
    o->step = cuda_step;
    o->get_t = cuda_get_t;
    o->set_t = cuda_set_t;
    step_cuda_attach(o, a);
    o->get_state = cuda_get_state;
    o->set_state = cuda_set_state;
    o->copy_master = cuda_copy_master;
    return o;
}
