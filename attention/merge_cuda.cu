// merge_cuda: attn_merge on the GPU (attention/attention.h), the same exact combination as
// merge_cpu.c: a partial result over other keys (out of dtype, fp32 lse) into an fp32
// accumulator, through their log-sum-exp, from the larger lse down. A group of LANES threads of
// one warp per query row (b, h, i), each VEC elements of the head dimension per pass. Every load
// of a thread (both lse, its output chunks) is issued at once, so the kernel waits for memory
// once per row instead of three times; the group's first thread writes the row's new lse after
// the whole group has read the old one.
#include <type_traits>

#include "attention/attention_gpu.h"
#include "attention/flash_common.cuh"
#include "attention/mask.h"

namespace {

constexpr int MERGE_THREADS = 256;

// VEC elements of T from p (VEC * sizeof(T)-aligned) as floats.
template <typename T, int VEC>
__device__ __forceinline__ void load_elems(float *x, const T *p) {
    if constexpr (VEC == 1) {
        x[0] = ElemTraits<T>::to_float(p[0]);
    } else {
        static_assert(VEC == 4, "chunks of 1 or 4 elements");
        using Raw = std::conditional_t<sizeof(T) == 4, float4, uint2>;
        const Raw r = *reinterpret_cast<const Raw *>(p);
        const T *e = reinterpret_cast<const T *>(&r);
#pragma unroll
        for (int k = 0; k < 4; k++) x[k] = ElemTraits<T>::to_float(e[k]);
    }
}

// VEC floats to p (VEC * 4-aligned).
template <int VEC>
__device__ __forceinline__ void store_elems(float *p, const float *x) {
    if constexpr (VEC == 1)
        p[0] = x[0];
    else
        *reinterpret_cast<float4 *>(p) = make_float4(x[0], x[1], x[2], x[3]);
}

template <typename T, int VEC, int LANES>
__global__ void __launch_bounds__(MERGE_THREADS) merge_kernel(const AttnParams acc, const AttnParams part) {
    // Blocks (x, h, b): the rows of head h of batch row b in x order, so that a thread finds
    // its row by a shift instead of 64-bit divisions (which bound the kernel when it had them).
    const int gid = blockIdx.x * MERGE_THREADS + threadIdx.x;
    const int i = gid / LANES, sub = gid % LANES, h = blockIdx.y, b = blockIdx.z;
    const bool live = i < acc.T_q;
    float *la = acc.lse + attn_lse_offset(&acc, b, h) + i;
    const float lp = live ? part.lse[attn_lse_offset(&part, b, h) + i] : INFINITY;
    const float a = live ? *la : INFINITY;
    float *o = static_cast<float *>(acc.out) + b * acc.o_st.batch + i * acc.o_st.row + h * acc.o_st.head;
    const T *op = static_cast<const T *>(part.out) + b * part.o_st.batch + i * part.o_st.row + h * part.o_st.head;
    // The first chunk is loaded with the lse, before they are tested; more chunks only where the
    // head dimension exceeds one pass (HS 96 and 256).
    const int d0 = sub * VEC;
    float x[VEC], y[VEC];
    if (live && d0 < acc.HS) {
        load_elems<float, VEC>(x, o + d0);
        load_elems<T, VEC>(y, op + d0);
    }
    float wa = 0.f, wp = 1.f, lse = lp;  // an empty accumulator (lse +inf) takes the part
    if (a != INFINITY) {
        const float hi = fmaxf(a, lp), lo = fminf(a, lp);
        lse = hi + log1pf(expf(lo - hi));
        wa = expf(a - lse);
        wp = expf(lp - lse);
    }
    // +inf in the part marks a row with no visible key there: it adds nothing.
    if (live && lp != INFINITY)
        for (int d = d0; d < acc.HS; d += LANES * VEC) {
            if (d != d0) {
                load_elems<float, VEC>(x, o + d);
                load_elems<T, VEC>(y, op + d);
            }
#pragma unroll
            for (int k = 0; k < VEC; k++) x[k] = (a == INFINITY ? 0.f : x[k] * wa) + y[k] * wp;
            store_elems<VEC>(o + d, x);
        }
    __syncwarp();  // every thread of the group has read the old lse
    if (live && lp != INFINITY && sub == 0) *la = lse;
}

template <typename T, int VEC>
void merge_launch(const AttnParams &acc, const AttnParams &part, cudaStream_t s) {
    int lanes = 1;  // the largest power of two up to 32 that the row's chunks fill
    while (lanes < 32 && 2 * lanes * VEC <= acc.HS) lanes *= 2;
    const dim3 grid((unsigned)(((int64_t)acc.T_q * lanes + MERGE_THREADS - 1) / MERGE_THREADS), acc.NH, acc.B);
    switch (lanes) {
    case 32: merge_kernel<T, VEC, 32><<<grid, MERGE_THREADS, 0, s>>>(acc, part); break;
    case 16: merge_kernel<T, VEC, 16><<<grid, MERGE_THREADS, 0, s>>>(acc, part); break;
    case 8: merge_kernel<T, VEC, 8><<<grid, MERGE_THREADS, 0, s>>>(acc, part); break;
    case 4: merge_kernel<T, VEC, 4><<<grid, MERGE_THREADS, 0, s>>>(acc, part); break;
    case 2: merge_kernel<T, VEC, 2><<<grid, MERGE_THREADS, 0, s>>>(acc, part); break;
    default: merge_kernel<T, VEC, 1><<<grid, MERGE_THREADS, 0, s>>>(acc, part); break;
    }
}

// Whether both outputs' rows can be read in chunks of 4 (every stride and the bases aligned).
bool chunks_of_4(const AttnParams &acc, const AttnParams &part, size_t part_elem) {
    const auto st4 = [](const AttnStrides &st) { return st.batch % 4 == 0 && st.row % 4 == 0 && st.head % 4 == 0; };
    return acc.HS % 4 == 0 && st4(acc.o_st) && st4(part.o_st) && (uintptr_t)acc.out % 16 == 0 &&
           (uintptr_t)part.out % (4 * part_elem) == 0;
}

template <typename T>
void merge_dispatch(const AttnParams &acc, const AttnParams &part, cudaStream_t s) {
    if (chunks_of_4(acc, part, sizeof(T)))
        merge_launch<T, 4>(acc, part, s);
    else
        merge_launch<T, 1>(acc, part, s);
}

}  // namespace

int attn_gpu_merge(AttnGpu *g, const AttnParams *acc, const AttnParams *part, char *err, size_t errlen) {
    cudaStream_t s = (cudaStream_t)attn_gpu_stream(g);
    switch (part->dtype) {
    case DTYPE_BF16: merge_dispatch<__nv_bfloat16>(*acc, *part, s); break;
    case DTYPE_F16: merge_dispatch<__half>(*acc, *part, s); break;
    default: merge_dispatch<float>(*acc, *part, s); break;
    }
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        snprintf(err, errlen, "attention: the merge kernel failed to launch: %s", cudaGetErrorString(e));
        return -1;
    }
    return 0;
}
