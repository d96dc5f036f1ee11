// ops_cuda_xent: the fused classifier: softmax, cross-entropy loss and dlogits over logits
// (N, Vp) in the compute dtype. One block per row. The forward's sweep computes the row's max
// and sum of exponentials together (online softmax, fp32) and keeps the log-sum-exp; the
// backward's sweep reads it and writes dlogits over the logits in place. Each is one pass over
// the logits; no fp32 copy of them is ever made.
#include <math.h>

#include "model/cuda/cuda_common.cuh"

#define XENT_THREADS 512

// Merges the running (max, sum of exp(x - max)) pair (m2, s2) into (m, s). A side that has seen
// nothing yet (max -inf) is skipped so -inf - -inf never produces NaN.
__device__ __forceinline__ void online_merge(float &m, float &s, float m2, float s2) {
    if (m2 == -INFINITY) return;
    if (m == -INFINITY) {
        m = m2;
        s = s2;
        return;
    }
    const float mx = fmaxf(m, m2);
    s = s * expf(m - mx) + s2 * expf(m2 - mx);
    m = mx;
}

// losses[row] = lse - z[target], lse[row] = log sum exp z[0..V): one sweep over the row, VEC
// logits per step folded into the thread's running (max, sum) with one rescale.
template <typename T, int VEC>
__global__ void xent_loss_kernel(const T *logits, float *losses, float *lse, const int *targets,
                                 int V, int Vp) {
    __shared__ float sh_m[XENT_THREADS / 32], sh_s[XENT_THREADS / 32];
    const int row = blockIdx.x, tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const T *z = logits + (size_t)row * Vp;  // (Vp)
    const int tgt = targets[row];
    if (tgt < 0) {
        if (tid == 0) losses[row] = lse[row] = 0.0f;
        return;
    }
    float m = -INFINITY, s = 0.0f;
    for (int j = tid * VEC; j < V; j += XENT_THREADS * VEC) {
        float x[VEC];
        load_f32<T, VEC>(x, z + j);   // j + VEC <= Vp: rows are whole vectors
        float vm = -INFINITY;
#pragma unroll
        for (int k = 0; k < VEC; k++) {
            if (j + k >= V) x[k] = -INFINITY;
            vm = fmaxf(vm, x[k]);
        }
        if (vm > m) {
            s = m == -INFINITY ? 0.0f : s * expf(m - vm);
            m = vm;
        }
#pragma unroll
        for (int k = 0; k < VEC; k++) s += expf(x[k] - m);
    }
    for (int o = 16; o > 0; o >>= 1)
        online_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
    if (lane == 0) {
        sh_m[warp] = m;
        sh_s[warp] = s;
    }
    __syncthreads();
    if (tid == 0) {
        float bm = sh_m[0], bs = sh_s[0];
        for (int w = 1; w < XENT_THREADS / 32; w++) online_merge(bm, bs, sh_m[w], sh_s[w]);
        const float l = bm + logf(bs);
        lse[row] = l;
        losses[row] = l - to_f32(z[tgt]);
    }
}

// z = dscale * (exp(z - lse) - onehot(target)) on the real columns, 0 on the padded ones and on
// ignored rows: one read and one write of the row.
template <typename T, int VEC>
__global__ void xent_grad_kernel(T *logits, const float *lse, const int *targets, int V, int Vp,
                                 float dscale) {
    const int row = blockIdx.x, tgt = targets[row];
    T *z = logits + (size_t)row * Vp;  // (Vp)
    const float l = lse[row];
    for (int j = threadIdx.x * VEC; j < Vp; j += XENT_THREADS * VEC) {
        float x[VEC];
        load_f32<T, VEC>(x, z + j);
#pragma unroll
        for (int k = 0; k < VEC; k++)
            x[k] = tgt < 0 || j + k >= V ? 0.0f
                                         : dscale * (expf(x[k] - l) - (j + k == tgt ? 1.0f : 0.0f));
        store_f32<T, VEC>(z + j, x);
    }
}

void cuda_softmax_xent(Backend *be, void *logits, float *losses, float *lse, const int *targets,
                       int N, int V, int Vp, float dscale) {
    dispatch_dtype(be->dtype, [&](auto tag) {
        using E = decltype(tag);
        dispatch_vec<E>(Vp, {logits}, [&](auto vec) {
            constexpr int VEC = decltype(vec)::value;
            if (dscale == 0.0f)
                xent_loss_kernel<E, VEC><<<N, XENT_THREADS, 0, cuda_ctx(be)->stream>>>(
                    (const E *)logits, losses, lse, targets, V, Vp);
            else
                xent_grad_kernel<E, VEC><<<N, XENT_THREADS, 0, cuda_ctx(be)->stream>>>(
                    (E *)logits, lse, targets, V, Vp, dscale);
        });
    });
    CUDA_CHECK_LAUNCH();
}
