// decode_cuda: attn_decode's split-KV kernel (FlashDecoding). A decode step has a few queries
// (T_q <= ATTN_DECODE_MAX_TQ) against a long key cache, too little work per (batch row, head)
// for the flash kernels' one block per query tile to fill the GPU. Here the visible key range
// is cut into splits, one block per (split, batch row, K/V head, query-row chunk); each of the
// block's warps walks its own key steps and writes a partial output normalised by its own
// softmax sum, with that sum's log-sum-exp, and a second kernel merges the partials of every
// query row exactly through their log-sum-exp, in fp32.
//
// GQA: a block holds the query rows of one K/V head's group (its NH / NKV heads times T_q
// queries, up to 8 of them per block: decode_plan.h), so each key and value is read once for all of them.
// Masking is mask.h's key range per row (causal with bottom-right alignment, windows,
// explicit positions) and ALiBi its bias, the rules every other path uses. Every key is
// checked against its row's range: a decode step is bound by reading the cache, and two
// comparisons per score cost nothing beside that, so there is no separate unmasked loop.
//
// Work per warp step: lane j scores key j0 + j against every row (its key row read whole, in
// 16-byte loads; the queries from shared memory, pre-scaled), the row maxima are reduced over
// the warp, the probabilities go through shared memory, and for P @ V the lanes cover the head
// dimension (one value row per key, coalesced). How a problem is cut (rows per block, splits)
// is decode_plan.c's.
#include "attention/decode_cuda.cuh"
#include "attention/decode_plan.h"
#include "attention/flash_common.cuh"
#include "attention/mask.h"

#include <stdio.h>

namespace {

constexpr int MERGE_WARPS = 8;   // query rows per block of the merge kernel

// Two elements to fp32.
__device__ __forceinline__ float2 pair_f32(uint32_t x, __nv_bfloat16) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&x));
}
__device__ __forceinline__ float2 pair_f32(uint32_t x, __half) {
    return __half22float2(*reinterpret_cast<const __half2 *>(&x));
}

// N consecutive elements (N = 2, 4 or 8, aligned to N elements) to fp32, in one load.
template <typename T, int N> __device__ __forceinline__ void load_f32(const T *src, float *dst) {
    uint32_t w[N / 2];
    if constexpr (N == 8) *reinterpret_cast<uint4 *>(w) = *reinterpret_cast<const uint4 *>(src);
    else if constexpr (N == 4) *reinterpret_cast<uint2 *>(w) = *reinterpret_cast<const uint2 *>(src);
    else w[0] = *reinterpret_cast<const uint32_t *>(src);
#pragma unroll
    for (int i = 0; i < N / 2; i++) {
        const float2 f = pair_f32(w[i], T());
        dst[2 * i] = f.x;
        dst[2 * i + 1] = f.y;
    }
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// Where query row r of a block lives: its head h and query i, and its index among the
// (B, NH, T_q) rows of the partial buffers.
struct DecRow {
    int h, i;
    int64_t index;
};
__device__ __forceinline__ DecRow dec_row(const AttnParams &p, int b, int kvh, int gr) {
    const int G = p.NH / p.NKV;
    DecRow d;
    d.h = kvh * G + gr / p.T_q;
    d.i = gr % p.T_q;
    d.index = ((int64_t)b * p.NH + d.h) * p.T_q + d.i;
    return d;
}

// grid (B * NKV, splits, row chunks): the batch rows in x, whose limit is 2^31 - 1. Partial p
// of row index x: its output (HS floats) at part_o + (x * parts + p) * HS and its log-sum-exp
// at part_lse[x * parts + p] (-inf when it saw no key), parts = splits * DECODE_WARPS.
template <typename T, int HS, int ROWS>
__global__ void __launch_bounds__(DECODE_WARPS * 32)
decode_split_kernel(const AttnParams p, int keys_per_split, int k_begin, int k_end, float *part_o,
                    float *part_lse) {
    constexpr int EPL = HS / 32;   // value elements per lane in P @ V
    __shared__ __align__(16) float q_s[ROWS][HS];
    __shared__ float p_s[DECODE_WARPS][ROWS][DECODE_KEYS];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int b = blockIdx.x / p.NKV, kvh = blockIdx.x % p.NKV;
    const int row0 = blockIdx.z * ROWS, rows = min(ROWS, p.NH / p.NKV * p.T_q - row0);

    for (int x = threadIdx.x; x < ROWS * HS; x += blockDim.x) {
        const int r = x / HS, d = x % HS;
        float val = 0.f;
        if (r < rows) {
            const DecRow dr = dec_row(p, b, kvh, row0 + r);
            const T *q = static_cast<const T *>(p.q) + b * p.q_st.batch + dr.i * p.q_st.row + dr.h * p.q_st.head;
            val = ElemTraits<T>::to_float(q[d]) * p.scale;
        }
        q_s[r][d] = val;
    }
    int lo[ROWS], hi[ROWS], pos[ROWS];
    float slope[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        lo[r] = hi[r] = pos[r] = 0;
        slope[r] = 0.f;
        if (r < rows) {
            const DecRow dr = dec_row(p, b, kvh, row0 + r);
            const AttnKeyRange kr = attn_key_range(&p, b, dr.i);
            lo[r] = kr.lo;
            hi[r] = kr.hi;
            pos[r] = (int)(dr.i + attn_query_shift(&p));
            if (p.alibi_slopes) slope[r] = attn_alibi_slope(&p, b, dr.h);
        }
    }
    __syncthreads();

    const T *kbase = static_cast<const T *>(p.k) + b * p.k_st.batch + kvh * p.k_st.head;
    const T *vbase = static_cast<const T *>(p.v) + b * p.v_st.batch + kvh * p.v_st.head + lane * EPL;
    const int s0 = k_begin + blockIdx.y * keys_per_split, s1 = min(k_end, s0 + keys_per_split);
    float m[ROWS], l[ROWS], acc[ROWS][EPL];   // l: this lane's share of the softmax sum
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        m[r] = -INFINITY;
        l[r] = 0.f;
#pragma unroll
        for (int e = 0; e < EPL; e++) acc[r][e] = 0.f;
    }
    for (int j0 = s0 + warp * DECODE_KEYS; j0 < s1; j0 += DECODE_WARPS * DECODE_KEYS) {
        const int j = j0 + lane;
        float s[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; r++) s[r] = 0.f;
        if (j < s1) {
            const T *kr = kbase + (int64_t)j * p.k_st.row;
#pragma unroll
            for (int c = 0; c < HS / 8; c++) {
                float kf[8];
                load_f32<T, 8>(kr + c * 8, kf);
#pragma unroll
                for (int r = 0; r < ROWS; r++) {
                    const float4 qa = *reinterpret_cast<const float4 *>(&q_s[r][c * 8]);
                    const float4 qb = *reinterpret_cast<const float4 *>(&q_s[r][c * 8 + 4]);
                    s[r] += qa.x * kf[0] + qa.y * kf[1] + qa.z * kf[2] + qa.w * kf[3] + qb.x * kf[4] +
                            qb.y * kf[5] + qb.z * kf[6] + qb.w * kf[7];
                }
            }
        }
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            const bool vis = j < s1 && j >= lo[r] && j < hi[r];
            if (p.alibi_slopes) s[r] += attn_alibi_bias(slope[r], pos[r], j);
            s[r] = vis ? s[r] : -INFINITY;
            const float m_new = fmaxf(m[r], warp_max(s[r]));
            // A row with nothing visible yet keeps max -inf: its probabilities are 0, not NaN.
            const float corr = m_new == -INFINITY ? 1.f : __expf(m[r] - m_new);
            const float pr = m_new == -INFINITY ? 0.f : __expf(s[r] - m_new);
            m[r] = m_new;
            l[r] = l[r] * corr + pr;
#pragma unroll
            for (int e = 0; e < EPL; e++) acc[r][e] *= corr;
            p_s[warp][r][lane] = pr;
        }
        __syncwarp();
        const int n = min(DECODE_KEYS, s1 - j0);
#pragma unroll 4
        for (int kk = 0; kk < n; kk++) {
            float vf[EPL];
            load_f32<T, EPL>(vbase + (int64_t)(j0 + kk) * p.v_st.row, vf);
#pragma unroll
            for (int r = 0; r < ROWS; r++) {
                const float pr = p_s[warp][r][kk];
#pragma unroll
                for (int e = 0; e < EPL; e++) acc[r][e] += pr * vf[e];
            }
        }
        __syncwarp();   // p_s is rewritten by the next step
    }

    const int parts = gridDim.y * DECODE_WARPS, part = blockIdx.y * DECODE_WARPS + warp;
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        const float sum = warp_sum(l[r]);
        if (r >= rows) continue;
        const int64_t x = dec_row(p, b, kvh, row0 + r).index * parts + part;
        const float inv = sum > 0.f ? 1.f / sum : 0.f;
#pragma unroll
        for (int e = 0; e < EPL; e++) part_o[x * HS + lane * EPL + e] = acc[r][e] * inv;
        if (lane == 0) part_lse[x] = sum > 0.f ? m[r] + logf(sum) : -INFINITY;
    }
}

// One warp per query row (b, h, i): out = sum_p exp(lse_p - lse) * out_p with lse the
// log-sum-exp of the parts' lse_p; a row no part saw gets out 0 and lse +inf (attention.h).
template <typename T>
__global__ void __launch_bounds__(MERGE_WARPS * 32)
decode_merge_kernel(const AttnParams p, int parts, const float *part_o, const float *part_lse) {
    const int64_t x = (int64_t)blockIdx.x * MERGE_WARPS + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (x >= (int64_t)p.B * p.NH * p.T_q) return;
    const int i = (int)(x % p.T_q), h = (int)(x / p.T_q % p.NH), b = (int)(x / ((int64_t)p.T_q * p.NH));
    const float *lp = part_lse + x * parts;
    float mx = -INFINITY;
    for (int q = lane; q < parts; q += 32) mx = fmaxf(mx, lp[q]);
    mx = warp_max(mx);
    float sum = 0.f;
    if (mx != -INFINITY)
        for (int q = lane; q < parts; q += 32) sum += __expf(lp[q] - mx);
    sum = warp_sum(sum);
    const float lse = mx == -INFINITY ? INFINITY : mx + logf(sum);
    T *o = static_cast<T *>(p.out) + b * p.o_st.batch + i * p.o_st.row + h * p.o_st.head;
    for (int d = lane; d < p.HS; d += 32) {
        float y = 0.f;
        if (mx != -INFINITY)
            for (int q = 0; q < parts; q++) y += __expf(lp[q] - lse) * part_o[(x * parts + q) * p.HS + d];
        o[d] = ElemTraits<T>::from_float(y);
    }
    if (lane == 0) p.lse[attn_lse_offset(&p, b, h) + i] = lse;
}

template <typename T, int HS, int ROWS>
void launch_split(const AttnParams &p, const DecodePlan &d, float *part_o, float *part_lse, cudaStream_t s) {
    const dim3 grid((unsigned)(p.B * p.NKV), (unsigned)d.splits, (unsigned)d.row_chunks);
    decode_split_kernel<T, HS, ROWS><<<grid, DECODE_WARPS * 32, 0, s>>>(p, d.keys_per_split, d.k_begin,
                                                                        d.k_end, part_o, part_lse);
}

template <typename T, int HS>
void launch_rows(const AttnParams &p, const DecodePlan &d, float *part_o, float *part_lse, cudaStream_t s) {
    switch (d.rows) {
    case 1: launch_split<T, HS, 1>(p, d, part_o, part_lse, s); break;
    case 4: launch_split<T, HS, 4>(p, d, part_o, part_lse, s); break;
    default: launch_split<T, HS, 8>(p, d, part_o, part_lse, s); break;
    }
}

template <typename T>
void launch_decode(const AttnParams &p, const DecodePlan &d, cudaStream_t s) {
    const int parts = d.splits * DECODE_WARPS;
    float *part_o = static_cast<float *>(p.workspace);   // (B, NH, T_q, parts, HS)
    float *part_lse = part_o + (size_t)p.B * p.NH * p.T_q * parts * p.HS;   // (B, NH, T_q, parts)
    if (p.HS == 64) launch_rows<T, 64>(p, d, part_o, part_lse, s);
    else launch_rows<T, 128>(p, d, part_o, part_lse, s);
    const int64_t rows = (int64_t)p.B * p.NH * p.T_q;
    decode_merge_kernel<T><<<(unsigned)((rows + MERGE_WARPS - 1) / MERGE_WARPS), MERGE_WARPS * 32, 0, s>>>(
        p, parts, part_o, part_lse);
}

}  // namespace

int decode_run_cuda(const AttnParams &p, const DecodePlan &d, char *err, size_t errlen) {
    cudaStream_t s = static_cast<cudaStream_t>(p.stream);
    if (p.dtype == DTYPE_BF16) launch_decode<__nv_bfloat16>(p, d, s);
    else launch_decode<__half>(p, d, s);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        snprintf(err, errlen, "attention: the split-KV decode kernels' launch failed: %s", cudaGetErrorString(e));
        return -1;
    }
    return 0;
}
