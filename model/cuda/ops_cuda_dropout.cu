// ops_cuda_dropout: the CUDA backend's dropout (Backend.dropout), in place in the compute dtype,
// and the same mask on the way into a residual add (cuda_dropout_add: Backend.add's DropMask).
// One thread per Philox block of 16 consecutive elements (16-byte accesses where the pointers
// allow); the keep decisions come from model/dropout.h, the same as the CPU backend's, and the
// product is computed in fp32 and rounded once to the dtype (bitwise the CPU's result in fp32),
// then added to the addend in fp32 and rounded again, as Backend.add would.
#include "model/cuda/cuda_common.cuh"

#define DROPOUT_THREADS 256   // threads per block, each deciding 16 elements

DropArgs drop_args(const DropMask *d) {
    DropArgs a = {};
    if (!d || d->p <= 0.0f) return a;
    if (!(d->p < 1.0f)) fatal(EXIT_RUNTIME, "cuda dropout: p = %g must be below 1", (double)d->p);
    a.on = true;
    a.thresh = attn_dropout_threshold(d->p);
    a.scale = attn_dropout_scale(d->p);
    a.seed = d->seed;
    a.offset = d->offset;
    a.offset_dev = d->offset_dev;
    return a;
}

// out = a + dropout(x), or dropout(x) without a (n elements; out may alias a or x: each thread
// reads its elements before writing them).
template <typename T>
__global__ void dropout_kernel(T *out, const T *a, const T *x, size_t n, DropArgs d, bool aligned) {
    const size_t blk = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t e0 = blk * 16;
    if (e0 >= n) return;
    const uint32_t keep = drop_keep16(d, blk);
    auto one = [&](float v, int j, const T *addend) {   // element e0 + j; NaN stays NaN, as in PyTorch
        // __fmul_rn: the product rounded on its own (in fp32 no FMA may fuse it with the add).
        const T dropped = from_f32<T>(__fmul_rn(v, keep >> j & 1 ? d.scale : 0.0f));
        return addend ? from_f32<T>(to_f32(*addend) + to_f32(dropped)) : dropped;
    };
    if (aligned && e0 + 16 <= n) {
        constexpr int V = 16 / sizeof(T);   // elements per 16-byte vector
#pragma unroll
        for (int q = 0; q < 16 / V; q++) {
            uint4 u = reinterpret_cast<const uint4 *>(x + e0)[q], ua = {};
            if (a) ua = reinterpret_cast<const uint4 *>(a + e0)[q];
            T *el = reinterpret_cast<T *>(&u);
            const T *ael = reinterpret_cast<const T *>(&ua);
#pragma unroll
            for (int k = 0; k < V; k++) el[k] = one(to_f32(el[k]), q * V + k, a ? ael + k : nullptr);
            reinterpret_cast<uint4 *>(out + e0)[q] = u;
        }
        return;
    }
    for (int j = 0; j < 16 && e0 + j < n; j++) out[e0 + j] = one(to_f32(x[e0 + j]), j, a ? a + e0 + j : nullptr);
}

void cuda_dropout_add(Backend *be, void *out, const void *a, const void *x, size_t n, const DropMask *d) {
    if (n == 0) return;
    const DropArgs args = drop_args(d);
    const long long n_blk = (long long)((n + 15) / 16);
    const bool aligned = (uintptr_t)x % 16 == 0 && (uintptr_t)out % 16 == 0 && (uintptr_t)a % 16 == 0;
    dispatch_dtype(be->dtype, [&](auto tag) {
        using E = decltype(tag);
        dropout_kernel<E><<<cdiv(n_blk, DROPOUT_THREADS), DROPOUT_THREADS, 0, cuda_ctx(be)->stream>>>(
            (E *)out, (const E *)a, (const E *)x, n, args, aligned);
    });
    CUDA_CHECK_LAUNCH();
}

void cuda_dropout(Backend *be, void *x, size_t n, const DropMask *d) {
    if (d && d->p > 0.0f) cuda_dropout_add(be, x, NULL, x, n, d);
}
