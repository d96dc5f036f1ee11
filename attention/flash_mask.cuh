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

// Row (b, h, i) of a (B, NH, T_q) row index (i fastest), as the per-row kernels number rows.
__device__ __forceinline__ void split_row(const AttnParams &p, int64_t row, int *b, int *h, int *i) {
    *i = (int)(row % p.T_q);
    *h = (int)((row / p.T_q) % p.NH);
    *b = (int)(row / ((int64_t)p.T_q * p.NH));
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
// Whether the feature instance's scores take a rule (soft-capping or ALiBi) before the
// exponential; with dropout alone they stay as the plain instance has them.
__device__ __forceinline__ bool score_rule_applies(const AttnParams &p) { return p.softcap > 0.f || p.alibi_slopes; }
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

// Dropout in the MMA fragments (attention/mask.h's 16 x 16 tiles of one byte per element). Of
// each tile, lane (g, t) of a warp holds 8 elements of one block and lane (g ^ 1, t) (lane ^ 4)
// the other 8: in the forward's scores, rows g, g + 8 and columns 2t, 2t + 1, 2t + 8, 2t + 9 of
// block (g >> 1, t); in the backward's transposed ones (keys as fragment rows), queries 2t,
// 2t + 1, 2t + 8, 2t + 9 and keys g, g + 8 of block (t, g >> 1). Over two tiles each lane of the
// pair draws one block and they swap the halves the other holds: one Philox block per 16
// elements. Element keeps when its byte is at least thresh (attn_dropout_threshold): shifted to
// the top of the word, the byte decides the comparison with thresh << 24 alone (the bytes below it
// only break a tie, which keeps anyway), one shift and one compare.
__device__ __forceinline__ bool dropout_byte_keeps(uint32_t word, int byte, uint32_t thresh) {
    return (word << (24 - 8 * byte)) >= (thresh << 24);
}

// Forward: the Philox block lane (g, t) draws for the rows row0 + g and row0 + g + 8 of a warp
// (row0 a multiple of 16) at key 0; at keys from j0 (a multiple of 16) it is this plus j0
// (attn_dropout_row_step's rule).
__device__ __forceinline__ uint64_t dropout_lane_block_fwd(const AttnParams &p, int b, int h, int row0, int g, int t) {
    return attn_dropout_block(&p, b, h, row0 + g, 16 * (g & 1) + 2 * t);
}

// Forward: the bytes of the two tiles at keys j0 .. j0 + 31 (j0 a multiple of 16) for those rows,
// from blk = dropout_lane_block_fwd(...) + j0. w[a][r] is tile a's word of row g + 8 r; its byte
// 2 e + n holds column 8 n + 2 t + e of the tile (n = 0, 1).
__device__ __forceinline__ void dropout_bytes_fwd(const AttnParams &p, uint64_t offset, uint64_t blk, int g,
                                                  uint32_t w[2][2]) {
    const bool odd = g & 1;  // draws tile `odd`; holds words 2 odd, 2 odd + 1 of each block
    const Philox4 d = attn_philox_block(p.seed, offset, blk);
    const uint32_t own0 = odd ? d.x[2] : d.x[0], own1 = odd ? d.x[3] : d.x[1];
    const uint32_t got0 = __shfl_xor_sync(0xffffffffu, odd ? d.x[0] : d.x[2], 4);
    const uint32_t got1 = __shfl_xor_sync(0xffffffffu, odd ? d.x[1] : d.x[3], 4);
    w[0][0] = odd ? got0 : own0, w[0][1] = odd ? got1 : own1;
    w[1][0] = odd ? own0 : got0, w[1][1] = odd ? own1 : got1;
}

// The keep masks of the packed pairs of one word of dropout_bytes_fwd: bytes 0 and 2 (`even`, the
// pair of n8 tile 2a) and bytes 1 and 3 (`odd`, tile 2a + 1) become 0xffff in their 16-bit lane
// where they keep and 0 where they drop, to AND into the packed 16-bit probabilities. Each byte b
// sits at bits 7..14 of its lane beside bias = (256 - thresh) << 7 in both lanes: the lane's top
// bit is set exactly when b + 256 - thresh >= 256, i.e. b >= thresh, with no carry past the lane,
// and prmt's sign mode spreads that bit over the lane: six instructions per word of four bytes
// and an AND per pair, instead of a compare and a select per element.
__device__ __forceinline__ uint32_t dropout_lane_bias(uint32_t thresh) { return ((256u - thresh) << 7) * 0x00010001u; }
__device__ __forceinline__ uint32_t dropout_lane_mask(uint32_t lanes) {
    uint32_t m;
    asm("prmt.b32 %0, %1, 0, 0xbb99;\n" : "=r"(m) : "r"(lanes));  // sign of bytes 1 and 3, each over 16 bits
    return m;
}
__device__ __forceinline__ void dropout_pair_masks(uint32_t word, uint32_t bias, uint32_t &even, uint32_t &odd) {
    even = dropout_lane_mask((word & 0x00ff00ffu) * 128u + bias);
    odd = dropout_lane_mask(__byte_perm(word, 0u, 0x4341u) * 128u + bias);  // bytes 1, 3 down to 0, 2
}

// The keep decisions of a forward-layout fragment: NT n8 tiles (NT even) from key j0 (a multiple of
// 16) for rows row0 + g, row0 + g + 8 (row0 a multiple of 16); apply(nt, e, keep) gets element e
// (row g + 8 (e >> 1), column 8 nt + 2t + (e & 1)). 32 keys at a time with the lane pair's swap;
// a last lone 16-key tile has both lanes of the pair draw its block (one per 8 elements).
template <int NT, typename Apply>
__device__ __forceinline__ void dropout_fragment_fwd(const AttnParams &p, uint64_t offset, uint32_t thresh, int b,
                                                     int h, int row0, int j0, int g, int t, Apply &&apply) {
    static_assert(NT % 2 == 0, "dropout draws whole 16-key tiles");
    const uint64_t lane = dropout_lane_block_fwd(p, b, h, row0, g, t) + (uint64_t)j0;
#pragma unroll
    for (int k = 0; k < NT / 4; k++) {
        uint32_t w[2][2];
        dropout_bytes_fwd(p, offset, lane + 32 * k, g, w);
#pragma unroll
        for (int x = 0; x < 16; x++) {
            const int nt = 4 * k + (x >> 2), e = x & 3;
            apply(nt, e, dropout_byte_keeps(w[(nt >> 1) & 1][e >> 1], 2 * (e & 1) + (nt & 1), thresh));
        }
    }
    if constexpr (NT % 4 == 2) {
        const Philox4 d = attn_philox_block(p.seed, offset, lane - 16 * (g & 1) + 8 * (NT - 2));  // keys j0 + 8 (NT - 2) + 2t
#pragma unroll
        for (int x = 0; x < 8; x++) {
            const int nt = NT - 2 + (x >> 2), e = x & 3;
            apply(nt, e, dropout_byte_keeps(d.x[2 * (g & 1) + (e >> 1)], 2 * (e & 1) + (nt & 1), thresh));
        }
    }
}

// Backward: the Philox block lane (g, t) draws for the keys key0 + g and key0 + g + 8 of a warp
// (key0 a multiple of 16) at queries from q0 (a multiple of 16); at q0 + 16 k it is the block at
// q0 plus k times attn_dropout_row_step.
__device__ __forceinline__ uint64_t dropout_lane_block_bwd(const AttnParams &p, int b, int h, int q0, int key0, int g,
                                                          int t) {
    return attn_dropout_block(&p, b, h, q0 + 16 * (g & 1) + 2 * t, key0 + g);
}

// Backward: the bytes of the two tiles at queries q0 .. q0 + 31 for those keys, from blk (above).
// v[a][x] packs tile a's halves g & 1 of words 2x (low 16 bits) and 2x + 1: its byte 2 n + y
// holds query 8 n + 2t + x, key g + 8 y of the tile (n = 0, 1).
__device__ __forceinline__ void dropout_bytes_bwd(const AttnParams &p, uint64_t offset, uint64_t blk, int g,
                                                  uint32_t v[2][2]) {
    const bool odd = g & 1;  // draws tile `odd`; holds half `odd` of every word
    const Philox4 d = attn_philox_block(p.seed, offset, blk);
    const uint32_t mine = odd ? 0x7632u : 0x5410u, other = odd ? 0x5410u : 0x7632u;
    const uint32_t own0 = __byte_perm(d.x[0], d.x[1], mine), own1 = __byte_perm(d.x[2], d.x[3], mine);
    const uint32_t got0 = __shfl_xor_sync(0xffffffffu, __byte_perm(d.x[0], d.x[1], other), 4);
    const uint32_t got1 = __shfl_xor_sync(0xffffffffu, __byte_perm(d.x[2], d.x[3], other), 4);
    v[0][0] = odd ? got0 : own0, v[0][1] = odd ? got1 : own1;
    v[1][0] = odd ? own0 : got0, v[1][1] = odd ? own1 : got1;
}
