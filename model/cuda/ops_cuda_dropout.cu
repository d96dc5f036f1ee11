// ops_cuda_dropout: the CUDA backend's dropout (Backend.dropout), in place in the compute dtype.
// One thread per Philox block of 16 consecutive elements (16-byte loads where x is aligned); the
// keep decisions come from model/dropout.h, the same as the CPU backend's, and the product is
// computed in fp32 and rounded once to the dtype (bitwise the CPU's result in fp32).
#include "model/cuda/cuda_common.cuh"
#include "model/dropout.h"

#define DROPOUT_THREADS 256   // threads per block, each deciding 16 elements

template <typename T>
__global__ void dropout_kernel(T *x, size_t n, uint32_t thresh, float scale, uint64_t seed,
                               uint64_t offset, const uint64_t *offset_dev, bool aligned) {
    const size_t blk = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t e0 = blk * 16;
    if (e0 >= n) return;
    const uint32_t keep = dropout_keep16(seed, offset + (offset_dev ? *offset_dev : 0), blk, thresh);
    if (aligned && e0 + 16 <= n) {
        constexpr int V = 16 / sizeof(T);   // elements per 16-byte vector
        uint4 *v = reinterpret_cast<uint4 *>(x + e0);
#pragma unroll
        for (int q = 0; q < 16 / V; q++) {
            uint4 u = v[q];
            T *el = reinterpret_cast<T *>(&u);
#pragma unroll
            for (int k = 0; k < V; k++)   // NaN stays NaN, as in PyTorch
                el[k] = from_f32<T>(to_f32(el[k]) * (keep >> (q * V + k) & 1 ? scale : 0.0f));
            v[q] = u;
        }
        return;
    }
    for (int j = 0; j < 16 && e0 + j < n; j++)
        x[e0 + j] = from_f32<T>(to_f32(x[e0 + j]) * (keep >> j & 1 ? scale : 0.0f));
}

static void launch_dropout(Backend *be, void *x, size_t n, uint32_t thresh, float scale,
                           uint64_t seed, uint64_t offset, const uint64_t *offset_dev) {
    const long long n_blk = (long long)((n + 15) / 16);
    const bool aligned = (uintptr_t)x % 16 == 0;
    dispatch_dtype(be->dtype, [&](auto tag) {
        using E = decltype(tag);
        dropout_kernel<E><<<cdiv(n_blk, DROPOUT_THREADS), DROPOUT_THREADS, 0,
                            cuda_ctx(be)->stream>>>((E *)x, n, thresh, scale, seed, offset,
                                                    offset_dev, aligned);
    });
    CUDA_CHECK_LAUNCH();
}

void cuda_dropout(Backend *be, void *x, size_t n, float p, uint64_t seed, uint64_t offset,
                  const uint64_t *offset_dev) {
    if (n == 0 || p <= 0.0f) return;
    if (!(p < 1.0f)) fatal(EXIT_RUNTIME, "cuda dropout: p = %g must be below 1", (double)p);
    launch_dropout(be, x, n, attn_dropout_threshold(p), attn_dropout_scale(p), seed, offset, offset_dev);
}
