// flash_mask: the masking rules of attention.h (causal, sliding window, packed documents,
// bottom-right alignment, ragged T_k) as the GPU kernels use them, plus ALiBi and dropout.
//
// Every rule keeps a contiguous range of keys, so the visible keys of query row i are one
// interval [lo(i), hi(i)), and lo and hi never decrease as i grows. The kernels therefore
// classify a whole tile with its first and last row: skipped (nothing visible), full (every
// element visible: the bulk, no per-element masking) or partial (diagonal, window edges,
// document edges, ragged tails: masked per element). The rules themselves are mask.h's, shared
// with the CPU reference.
#pragma once
#include <type_traits>

#include "attention/flash_common.cuh"
#include "attention/mask.h"

typedef AttnKeyRange RowRange;  // visible keys lo <= j < hi; empty when lo >= hi

// Visible key range of query row i (0 <= i < T_q) in batch row b (attention/mask.h's rule).
__device__ __forceinline__ RowRange row_range(const AttnParams &p, int b, int i) {
    return attn_key_range(&p, b, i);
}

// Tile classes for rows [m0, m_last] x keys [n0, n1).
enum TileClass { TILE_EMPTY = 0, TILE_FULL = 1, TILE_PARTIAL = 2 };

__device__ __forceinline__ TileClass tile_class(RowRange first, RowRange last, int n0, int n1) {
    if (n1 <= first.lo || n0 >= last.hi) return TILE_EMPTY;
    if (n0 >= last.lo && n1 <= first.hi) return TILE_FULL;
    return TILE_PARTIAL;
}

// The tile class as a compile-time parameter of a kernel's tile step: the step is written once
// as a template (a generic lambda taking `auto masked`) whose Masked<true> instance masks per
// element and whose Masked<false> instance, the full tiles of the bulk, has no masking code.
template <bool M> using Masked = std::integral_constant<bool, M>;
template <typename Step> __device__ __forceinline__ void step_by_class(bool partial, Step &&step) {
    if (partial) step(Masked<true>());
    else step(Masked<false>());
}
// A step's flag when the instance is chosen per tile, inside the step (step_by_class there).
struct TileByClass {};

// Scores of one m16 tile's C fragments (NS n8 tiles, s[4 nt + e]: row 8 (e >> 1) + g, key
// n0 + 8 nt + 2t + (e & 1)) set to -inf outside the visible keys rr[0] (row g) and rr[1] (row
// g + 8): the per-element masking of a partial tile.
template <int NS>
__device__ __forceinline__ void mask_scores(float *s, const RowRange (&rr)[2], int n0, int t) {
#pragma unroll
    for (int nt = 0; nt < NS; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int r = e >> 1, j = n0 + nt * 8 + 2 * t + (e & 1);
            if (j < rr[r].lo || j >= rr[r].hi) s[nt * 4 + e] = -INFINITY;
        }
}

// Query rows [q_begin, q_end) that see at least one key of [n0, n1) (binary searches on the
// monotone row ranges), for the backward kernels that walk query tiles for a key tile.
__device__ __forceinline__ void query_span(const AttnParams &p, int b, int n0, int n1, int *q_begin,
                                           int *q_end) {
    int lo = 0, hi = p.T_q;  // first row with hi(i) > n0
    while (lo < hi) {
        int mid = (lo + hi) >> 1;
        if (row_range(p, b, mid).hi > n0) hi = mid; else lo = mid + 1;
    }
    *q_begin = lo;
    hi = p.T_q;  // first row with lo(i) >= n1
    while (lo < hi) {
        int mid = (lo + hi) >> 1;
        if (row_range(p, b, mid).lo >= n1) hi = mid; else lo = mid + 1;
    }
    *q_end = lo;
}

// Element (b, row, h, 0) of a tensor addressed as attention.h describes (strides in elements).
template <typename P>
__device__ __forceinline__ P *tensor_at(P *base, const AttnStrides &st, int b, int64_t row, int h) {
    return base + b * st.batch + row * st.row + h * st.head;
}

// The fp32 dQ accumulator of the non-deterministic backward (workspace layout: attention_cuda.cu).
// Per (b, h) it holds the (T_q rounded up to 64, HS rounded up to 64) matrix (attn_dq_acc_floats
// in mask.h) as 64 x 64 blocks, row blocks outer; inside a block, 8 x 8 row-major sub-tiles in the order
// (row / 16, column / 8, row / 8 % 2).
// A warp's m16n8 MMA fragment of a block (rows 16w + 8r + g, columns 8j + 2t + {0, 1}) is then
// one run of 64 floats with lane (g, t)'s pair at 2 * lane: the sm90 backward stages a warpgroup's
// 64 x 64 block in shared memory without bank conflicts and adds it with one bulk reduction.
// Float offset of block (row block rb, column block cb) of head (b, h).
__device__ __forceinline__ int64_t dq_acc_block(const AttnParams &p, int b, int h, int rb, int cb) {
    return ((((int64_t)b * p.NH + h) * attn_dq_acc_row_blocks(p.T_q) + rb) * attn_dq_acc_col_blocks(p.HS) + cb) * 4096;
}
// Float offset of element (i, c) of head (b, h); c and c + 1 are adjacent when c is even, and
// c .. c + 7 when c is a multiple of 8.
__device__ __forceinline__ int64_t dq_acc_offset(const AttnParams &p, int b, int h, int i, int c) {
    const int r = i & 63, cc = c & 63;
    const int sub = (((r >> 4) * 8 + (cc >> 3)) * 2 + ((r >> 3) & 1));
    return dq_acc_block(p, b, h, i >> 6, c >> 6) + sub * 64 + (r & 7) * 8 + (cc & 7);
}

// The query tile of a forward-style block (grid: query tiles of BM rows, query heads, batch
// rows; causal blocks late in the sequence carry the most key tiles, so they start first), the
// visible keys of its first and last row (tile_class classifies every key tile with them) and
// the key tiles of BN keys it visits: key_tile(it) for it < n_tiles, ascending, the tiles of
// [nb_begin, nb_end) that its block mask row holds (all of them when dense). With a block mask
// BM divides ATTN_SPARSE_BLOCK, so the tile lies in one query block. SPARSE (the kernels'
// feature instances) reads the mask; without it the span is every tile, known at compile time.
struct QueryBlock {
    int h, b, kvh, m0, m_valid;
    RowRange first, last;
    int nb_begin, nb_end;
    AttnTileSpan keys;
    __device__ __forceinline__ int n_tiles() const { return keys.count; }
    __device__ __forceinline__ int key_tile(int it) const { return attn_span_tile(&keys, it); }
};
template <bool SPARSE>
__device__ __forceinline__ QueryBlock query_block(const AttnParams &p, int BM, int BN) {
    QueryBlock q;
    const int m_block = p.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
    q.h = blockIdx.y;
    q.b = blockIdx.z;
    q.kvh = q.h / (p.NH / p.NKV);
    q.m0 = m_block * BM;
    q.m_valid = min(BM, p.T_q - q.m0);
    q.first = row_range(p, q.b, q.m0);
    q.last = row_range(p, q.b, q.m0 + q.m_valid - 1);
    q.nb_begin = max(q.first.lo, 0) / BN;
    q.nb_end = max((min(q.last.hi, p.T_k) + BN - 1) / BN, q.nb_begin);
    q.keys = attn_tile_span(SPARSE ? p.sparse_q_offsets : nullptr, p.sparse_q_blocks, q.m0 / ATTN_SPARSE_BLOCK, q.nb_begin,
                            q.nb_end, BN);
    return q;
}

// A query block's first row of Q (head h) and row 0 of K and V (its KV head).
template <typename T> struct QueryBases {
    const T *q, *k, *v;
};
template <typename T> __device__ __forceinline__ QueryBases<T> query_bases(const AttnParams &p, const QueryBlock &qb) {
    return {tensor_at(static_cast<const T *>(p.q), p.q_st, qb.b, qb.m0, qb.h),
            tensor_at(static_cast<const T *>(p.k), p.k_st, qb.b, 0, qb.kvh),
            tensor_at(static_cast<const T *>(p.v), p.v_st, qb.b, 0, qb.kvh)};
}

// The forward kernels walk a block's key tiles from last to first, walk position w visiting
// key_tile(n_tiles - 1 - w). The row ranges being monotone, a tile is full (tile_class) iff its
// keys lie in [last.lo, first.hi): the full tiles are one run of walk positions [lo, hi), with
// partial tiles before it (the diagonal, the ragged end of T_k) and after it (window and document
// edges). With a block mask the run is found by binary search over the present tiles.
__device__ __forceinline__ int span_first_from(const AttnTileSpan &s, int BN, int key) {
    key = max(key, 0);  // the first span index whose tile starts at key or later
    if (!s.idx) return min(max((key + BN - 1) / BN - s.first, 0), s.count);
    int lo = 0, hi = s.count;
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (attn_span_tile(&s, mid) * BN >= key) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}
struct TileRuns {
    int lo, hi, n;  // walk positions [lo, hi) of n are full
};
__device__ __forceinline__ TileRuns tile_runs(const QueryBlock &q, int BN) {
    const int n = q.n_tiles();
    const int full_begin = span_first_from(q.keys, BN, q.last.lo);  // span indices of the full run
    const int full_end = max(span_first_from(q.keys, BN, q.first.hi - BN + 1), full_begin);
    return TileRuns{n - full_end, n - full_begin, n};
}
// Runs step(w, Masked<M>()) for w in [begin, n) in order, M false on the full run alone: the
// masked and unmasked steps are two instances, each in a loop of its own, so no loop carries
// both (nor a branch per tile).
template <typename Step> __device__ __forceinline__ void for_tile_runs(const TileRuns &r, int begin, Step &&step) {
    int w = begin;
#pragma unroll 1
    for (int run = 0; run < 3; run++) {  // partial, full, partial: one copy of each instance
        const int end = run == 0 ? r.lo : run == 1 ? r.hi : r.n;
        if (run == 1)
            for (; w < end; w++) step(w, Masked<false>());
        else
            for (; w < end; w++) step(w, Masked<true>());
    }
}

// Backward: the (query head, query tile) pairs a block of key tile [n0, n0 + n_valid) and KV head
// kvh visits, head-major: pair `it` is query head head(it), query rows from m0(it). GQA: the G
// query heads sharing the KV head follow each other, so dK and dV sum them in registers. The
// n_mb query tiles of a head are tile_m0(0 .. n_mb - 1): those that see a key of the tile and,
// with a block mask (read by SPARSE instances only), whose query block reads its key block (n0 is
// then a multiple of ATTN_SPARSE_BLOCK: the key tile is one block, BN == ATTN_SPARSE_BLOCK).
struct BwdPairs {
    int G, kvh, n_mb, total;
    AttnTileSpan queries;
    __device__ __forceinline__ int head(int it) const { return kvh * G + it / n_mb; }
    __device__ __forceinline__ int tile_m0(int mb, int BM) const { return attn_span_tile(&queries, mb) * BM; }
    __device__ __forceinline__ int m0(int it, int BM) const { return tile_m0(it % n_mb, BM); }
};
template <bool SPARSE>
__device__ __forceinline__ BwdPairs bwd_pairs(const AttnParams &p, int b, int kvh, int n0, int n_valid, int BM) {
    int q_begin, q_end;
    query_span(p, b, n0, n0 + n_valid, &q_begin, &q_end);
    BwdPairs w;
    w.G = p.NH / p.NKV;
    w.kvh = kvh;
    const int mb_begin = q_begin / BM;
    // The dense span in this order keeps the plain kernels' PTX what it was before block masks:
    // computed through attn_tile_span, the sm90 backward at D 64 measured 3-5% slower
    // (docs/PERFORMANCE.md, "Refactors measured").
    if constexpr (SPARSE) {
        const int mb_end = q_end > q_begin ? (q_end + BM - 1) / BM : mb_begin;
        w.queries = attn_tile_span(p.sparse_k_offsets, p.sparse_k_blocks, n0 / ATTN_SPARSE_BLOCK, mb_begin, mb_end, BM);
    } else {
        w.queries = AttnTileSpan{nullptr, mb_begin, 0, 1, q_end > q_begin ? (q_end + BM - 1) / BM - mb_begin : 0};
    }
    w.n_mb = w.queries.count;
    w.total = w.G * w.n_mb;
    return w;
}

// Backward: LSE (by attention.h's lse strides) and D (contiguous (B, NH, T_q)) of query rows
// [m0, m0 + BM) of head h into sLse and sD with 4-byte cp.async (zeros from m_valid on); threads
// tid of NT.
template <int BM, int NT>
__device__ __forceinline__ void load_lse_d(float *sLse, float *sD, const AttnParams &p, const float *dsum, int b,
                                           int h, int m0, int m_valid, int tid) {
    const float *lse = p.lse + attn_lse_offset(&p, b, h) + m0;
    const float *d = dsum + ((int64_t)b * p.NH + h) * p.T_q + m0;
    for (int r = tid; r < BM; r += NT) {
        const bool ok = r < m_valid;
        cp_async_4(smem_u32(sLse + r), ok ? lse + r : p.lse, ok ? 4 : 0);
        cp_async_4(smem_u32(sD + r), ok ? d + r : dsum, ok ? 4 : 0);
    }
}

// The ALiBi slope of query head h in batch row b (attention.h: shared by every row when
// alibi_batch_stride is 0).
__device__ __forceinline__ float alibi_slope(const AttnParams &p, int b, int h) {
    return p.alibi_slopes[b * p.alibi_batch_stride + h];
}

// ALiBi bias in the log2 domain the kernels work in (slope pre-multiplied by log2(e)).
__device__ __forceinline__ float alibi_bias_log2(float slope_log2, int pos, int j) {
    return attn_alibi_bias(slope_log2, pos, j);
}

// Dropout keep-decision of element (b, h, i, j) under the Philox offset the kernel read once
// (attn_dropout_offset): the same draw as attn_dropout_keep().
__device__ __forceinline__ bool dropout_keep(const AttnParams &p, uint64_t offset, int b, int h, int i, int j) {
    return attn_dropout_keep_elem(&p, offset, attn_dropout_elem(&p, b, h, i, j));
}

// tanh(x) from one exponential and one division, 1 - 2 / (e^2x + 1): within a few fp32 ulps of
// 1 in absolute terms, +-1 in the limits (the exponential saturates to inf or flushes to 0).
__device__ __forceinline__ float tanh_exp2(float x) {
    return 1.f - __fdividef(2.f, exp2_ftz(2.f * LOG2E_F * x) + 1.f);
}

// The score rules of the feature instances of the sm90 kernels, in attention.h's order: the raw
// score times scale, soft-capped (cap > 0), to the log2 domain, plus ALiBi (slope_log2 is the
// slope times log2(e), 0 without ALiBi, whose bias is then -0).
struct ScoreRule {
    float scale, cap, inv_cap, slope_log2;
};
__device__ __forceinline__ ScoreRule score_rule(const AttnParams &p, int b, int h) {
    ScoreRule r;
    r.scale = p.scale;
    r.cap = p.softcap;
    r.inv_cap = p.softcap > 0.f ? 1.f / p.softcap : 0.f;
    r.slope_log2 = p.alibi_slopes ? alibi_slope(p, b, h) * LOG2E_F : 0.f;
    return r;
}
// The log2-domain score of raw score `raw` for aligned query position pos and key j; *dcap gets
// the cap's derivative 1 - tanh^2 (1 without the cap).
__device__ __forceinline__ float score_log2(const ScoreRule &r, float raw, int pos, int j, float *dcap) {
    float x = raw * r.scale;
    *dcap = 1.f;
    if (r.cap > 0.f) {
        const float t = tanh_exp2(x * r.inv_cap);
        x = r.cap * t;
        *dcap = 1.f - t * t;
    }
    return fmaf(x, LOG2E_F, alibi_bias_log2(r.slope_log2, pos, j));
}

// Keep bits of the 4 adjacent elements (b, h, i, j0 + m) (bit m) under the Philox offset the
// kernel read once (attn_dropout_offset) and the draw threshold thresh (attn_philox_threshold):
// one Philox block when they are one block's draws, two when they straddle blocks (rows of a
// T_k that is not a multiple of 4).
__device__ __forceinline__ unsigned dropout_keep_quad(const AttnParams &p, uint64_t offset, uint32_t thresh, int b,
                                                      int h, int i, int j0) {
    const uint64_t e = attn_dropout_elem(&p, b, h, i, j0);
    const unsigned k = (unsigned)e & 3;
    const Philox4 r0 = attn_philox_block(p.seed, offset, e >> 2);
    Philox4 r1 = r0;
    if (k != 0) r1 = attn_philox_block(p.seed, offset, (e >> 2) + 1);
    // draws 0..7 of the two blocks, element m at draw k + m
    const uint32_t u[8] = {r0.x[0], r0.x[1], r0.x[2], r0.x[3], r1.x[0], r1.x[1], r1.x[2], r1.x[3]};
    unsigned bits = 0;
#pragma unroll
    for (int m = 0; m < 4; m++) {
        const uint32_t d = k == 0 ? u[m] : k == 1 ? u[m + 1] : k == 2 ? u[m + 2] : u[m + 3];
        bits |= (unsigned)(d >= thresh) << m;
    }
    return bits;
}
