// ops_cuda_xent: the fused classifier: softmax, cross-entropy loss and dlogits over logits
// (N, Vp) in the compute dtype. One block per row: a first sweep computes the row's max and
// sum of exponentials together (online softmax, fp32), a second writes dlogits over the logits
// in place. No fp32 copy of the logits is ever made.
#include <math.h>

#include "model/cuda_common.cuh"

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

template <typename T>
__global__ void softmax_xent_kernel(T *logits, float *losses, const int *targets, int V, int Vp,
                                    float dscale) {
    __shared__ float sh_m[XENT_THREADS / 32], sh_s[XENT_THREADS / 32];
    __shared__ float sh_lse;
    const int row = blockIdx.x, tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    T *z = logits + (size_t)row * Vp;  // (Vp)
    const int tgt = targets[row];
    if (tgt < 0) {
        if (tid == 0) losses[row] = 0.0f;
        if (dscale != 0.0f)
            for (int j = tid; j < Vp; j += XENT_THREADS) z[j] = from_f32<T>(0.0f);
        return;
    }
    // Read before the barriers below: the gradient sweep overwrites z[tgt].
    const float z_tgt = to_f32(z[tgt]);
    float m = -INFINITY, s = 0.0f;
    for (int j = tid; j < V; j += XENT_THREADS) {
        const float x = to_f32(z[j]);
        if (x > m) {
            s = (m == -INFINITY ? 0.0f : s * expf(m - x)) + 1.0f;
            m = x;
        } else {
            s += expf(x - m);
        }
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
        sh_lse = bm + logf(bs);
        losses[row] = sh_lse - z_tgt;
    }
    __syncthreads();
    if (dscale == 0.0f) return;
    const float lse = sh_lse;
    for (int j = tid; j < Vp; j += XENT_THREADS) {
        const float g =
            j < V ? dscale * (expf(to_f32(z[j]) - lse) - (j == tgt ? 1.0f : 0.0f)) : 0.0f;
        z[j] = from_f32<T>(g);
    }
}

void cuda_softmax_xent(Backend *be, void *logits, float *losses, const int *targets, int N, int V,
                       int Vp, float dscale) {
    dispatch_dtype(be->dtype, [&](auto tag) {
        using E = decltype(tag);
        softmax_xent_kernel<E><<<N, XENT_THREADS, 0, cuda_ctx(be)->stream>>>(
            (E *)logits, losses, targets, V, Vp, dscale);
    });
    CUDA_CHECK_LAUNCH();
}
