// mask: the visibility, ALiBi and dropout rules of attention/attention.h as small inline functions
// (ATTN_HD: host and device), so the CPU reference and the CUDA kernels use the very same rules.
//
// Every rule (causal, sliding window, documents) keeps a contiguous run of keys per query, so the
// whole mask of query i is one half-open key range [lo, hi). Kernels use it to skip tiles that are
// entirely masked and to run the unmasked bulk without per-element checks.
#pragma once
#include "attention/attention.h"
#include "attention/philox.h"

#include <math.h>

typedef struct {
    int lo, hi;  // visible keys j satisfy lo <= j < hi; empty (fully masked row) when lo >= hi
} AttnKeyRange;

// Where query i sits, in key-index coordinates: at key i + shift. Bottom-right alignment
// (shift = T_k - T_q) or, with pos_explicit, the difference of the chunks' first positions.
ATTN_HD int64_t attn_query_shift(const AttnParams *p) {
    return p->pos_explicit ? p->q_pos0 - p->k_pos0 : (int64_t)p->T_k - p->T_q;
}
// Offset of lse element (b, h, 0) (attention.h: contiguous when both strides are 0).
ATTN_HD int64_t attn_lse_offset(const AttnParams *p, int b, int h) {
    const int64_t hs = p->lse_head_stride ? p->lse_head_stride : p->T_q;
    const int64_t bs = p->lse_batch_stride ? p->lse_batch_stride : (int64_t)p->NH * p->T_q;
    return (int64_t)b * bs + (int64_t)h * hs;
}

// The document [*start, *end) of flattened token index g (b*T + t): cu_seqlens[0..n_docs] are
// non-decreasing cumulative offsets from 0 to B*T, so the document is the last d with
// cu_seqlens[d] <= g (binary search, O(log n_docs)).
ATTN_HD void attn_doc_bounds(const int *cu_seqlens, int n_docs, int64_t g, int64_t *start,
                             int64_t *end) {
    int lo = 0, hi = n_docs - 1;  // invariant: the answer d lies in [lo, hi]
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (cu_seqlens[mid] <= g) lo = mid;
        else hi = mid - 1;
    }
    *start = cu_seqlens[lo];
    *end = cu_seqlens[lo + 1];
}

// The visible key range of query i in batch row b. 64-bit intermediates: window_right may be
// large enough that p + window_right + 1 overflows an int.
ATTN_HD AttnKeyRange attn_key_range(const AttnParams *p, int b, int i) {
    int64_t pos = (int64_t)i + attn_query_shift(p);
    int64_t lo = 0, hi = p->T_k;
    if (p->causal && pos + 1 < hi) hi = pos + 1;
    if (p->window_left >= 0 && pos - p->window_left > lo) lo = pos - p->window_left;
    if (p->window_right >= 0 && pos + p->window_right + 1 < hi) hi = pos + p->window_right + 1;
    if (p->cu_seqlens) {  // T_q == T_k here (attn_check), so row b starts at b * T_k
        int64_t row0 = (int64_t)b * p->T_k, start, end;
        attn_doc_bounds(p->cu_seqlens, p->n_docs, row0 + i, &start, &end);
        if (start - row0 > lo) lo = start - row0;
        if (end - row0 < hi) hi = end - row0;
    }
    if (hi < lo) hi = lo;
    AttnKeyRange r = {(int)lo, (int)hi};
    return r;
}

// ---- block-sparse attention (attention.h's sparse fields) ----
ATTN_HD int attn_sparse(const AttnParams *p) { return p->sparse_q_offsets != NULL; }
ATTN_HD int attn_sparse_blocks(int T) { return (T + ATTN_SPARSE_BLOCK - 1) / ATTN_SPARSE_BLOCK; }

// First position e in the sorted idx[lo, hi) with idx[e] >= x (hi when there is none).
ATTN_HD int attn_lower_bound(const int *idx, int lo, int hi, int x) {
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (idx[mid] < x) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

// Whether row `row` of a block list (offsets, idx) holds block `col`.
ATTN_HD int attn_sparse_has(const int *offsets, const int *idx, int row, int col) {
    const int e = attn_lower_bound(idx, offsets[row], offsets[row + 1], col);
    return e < offsets[row + 1] && idx[e] == col;
}

// Whether the block mask (if any) lets query i read key j.
ATTN_HD int attn_block_present(const AttnParams *p, int i, int j) {
    return !attn_sparse(p) || attn_sparse_has(p->sparse_q_offsets, p->sparse_q_blocks, i / ATTN_SPARSE_BLOCK,
                                              j / ATTN_SPARSE_BLOCK);
}

// The tiles (of `tile` rows or keys, a divisor of ATTN_SPARSE_BLOCK) of the range
// [t_begin, t_end) that row `row` of a block list reaches, in ascending order: tile(it) for
// it < count. Dense (offsets NULL): every tile of the range. Sparse: the tiles of the row's
// present blocks, clipped to the range; the loop counter maps to a tile in O(1), so a kernel
// walks present tiles only and never touches an absent block.
typedef struct {
    const int *idx;   // NULL: dense
    int first;        // dense: the first tile; sparse: the row's first entry in idx that counts
    int skip;         // sparse: tiles of entry `first`'s block that lie before t_begin
    int per_block;    // tiles per block
    int count;
} AttnTileSpan;

ATTN_HD AttnTileSpan attn_tile_span(const int *offsets, const int *idx, int row, int t_begin,
                                    int t_end, int tile) {
    AttnTileSpan s = {NULL, t_begin, 0, 1, t_end > t_begin ? t_end - t_begin : 0};
    if (!offsets || s.count == 0) return s;
    const int per = ATTN_SPARSE_BLOCK / tile;
    const int e0 = attn_lower_bound(idx, offsets[row], offsets[row + 1], t_begin / per);
    const int e1 = attn_lower_bound(idx, e0, offsets[row + 1], (t_end + per - 1) / per);
    s.idx = idx;
    s.first = e0;
    s.per_block = per;
    if (e1 == e0) {
        s.count = 0;
        return s;
    }
    const int head = t_begin - idx[e0] * per, tail = (idx[e1 - 1] + 1) * per - t_end;
    s.skip = head > 0 ? head : 0;
    s.count = (e1 - e0) * per - s.skip - (tail > 0 ? tail : 0);
    return s;
}

ATTN_HD int attn_span_tile(const AttnTileSpan *s, int it) {
    if (!s->idx) return s->first + it;
    const int v = it + s->skip;
    return s->idx[s->first + v / s->per_block] * s->per_block + v % s->per_block;
}

// ALiBi bias of key j for aligned query position pos (added to the scaled, capped score).
ATTN_HD float attn_alibi_bias(float slope, int pos, int j) {
    int dist = pos > j ? pos - j : j - pos;
    return -slope * (float)dist;
}
// The ALiBi slope of query head h in batch row b: (NH) slopes shared by every row when
// alibi_batch_stride is 0, row b's own (B, NH) slopes otherwise. Only with alibi_slopes set.
ATTN_HD float attn_alibi_slope(const AttnParams *p, int b, int h) {
    return p->alibi_slopes[(int64_t)b * p->alibi_batch_stride + h];
}

// Logit soft-capping of a scaled score s: softcap * tanh(s / softcap) (softcap > 0), applied
// before ALiBi and the masks; cap_grad is its derivative, 1 - tanh^2(s / softcap), which the
// backward multiplies into dS. tanh saturates to +-1 for large |s|, so neither can overflow.
ATTN_HD float attn_softcap(float softcap, float s) { return softcap * tanhf(s / softcap); }
ATTN_HD float attn_softcap_grad(float softcap, float s) {
    const float t = tanhf(s / softcap);
    return 1.0f - t * t;
}

// Dropout draws one byte per element of the (B, NH, T_q, T_k) probability tensor, 16 bytes to a
// Philox block. Each (b, h) matrix is cut into 16 x 16 tiles, tile (I, J) holding the 16 blocks
// from 16 n on, n = ((b NH + h) ceil(T_q / 16) + I) ceil(T_k / 16) + J. Within a tile, element
// (r, c) (tile-relative row and column) is in block 4 ((r >> 1) & 3) + ((c >> 1) & 3): rows
// {2a, 2a + 1, 2a + 8, 2a + 9} times the same four columns, which is what two lanes of a warp's
// MMA fragment hold between them whether the tile's rows are the fragment's rows (the forward's
// scores) or its columns (the backward's transposed ones), so a lane draws once per 16 elements
// (flash_mask.cuh). The element's byte is 4 w + k of the block's 16 (its word w, byte k), with
// w = 2 (r & 1) + (r >> 3) and k = 2 (c & 1) + (c >> 3).
ATTN_HD uint64_t attn_dropout_block(const AttnParams *p, int b, int h, int i, int j) {
    const uint64_t tq = (uint64_t)(p->T_q + 15) >> 4, tk = (uint64_t)(p->T_k + 15) >> 4;
    const uint64_t tile = (((uint64_t)b * (uint64_t)p->NH + (uint64_t)h) * tq + (uint64_t)(i >> 4)) * tk +
                          (uint64_t)(j >> 4);
    return (tile << 4) | (uint64_t)(((i >> 1) & 3) << 2) | (uint64_t)((j >> 1) & 3);
}
// Its steps: 16 rows further (i) add attn_dropout_row_step(p) to a block, 16 keys further (j) add
// 16 (one tile's blocks), so the flash kernels step along a tile instead of recomputing it.
ATTN_HD uint64_t attn_dropout_row_step(const AttnParams *p) { return ((uint64_t)(p->T_k + 15) >> 4) << 4; }
ATTN_HD int attn_dropout_byte_index(int i, int j) {
    return 4 * (2 * (i & 1) + ((i >> 3) & 1)) + 2 * (j & 1) + ((j >> 3) & 1);
}

// The Philox offset of the params' dropout: offset, plus *offset_dev where the caller keeps a
// part of it in memory (read here, so a kernel calls this once, not per draw).
ATTN_HD uint64_t attn_dropout_offset(const AttnParams *p) {
    return p->offset + (p->offset_dev ? *p->offset_dev : 0);
}

// 1 when element (b, h, i, j) survives dropout under Philox offset `offset` (attn_dropout_offset):
// one Philox block per call (the kernels share a block between 16 elements instead).
ATTN_HD int attn_dropout_keep_at(const AttnParams *p, uint64_t offset, int b, int h, int i, int j) {
    const Philox4 r = attn_philox_block(p->seed, offset, attn_dropout_block(p, b, h, i, j));
    return attn_philox_byte(r, attn_dropout_byte_index(i, j)) >= attn_dropout_threshold(p->dropout_p);
}

// The fp32 dQ accumulator of the non-deterministic CUDA backward holds, per (batch row, head), the
// T_q rows rounded up to whole 64-row blocks and the HS columns rounded up to whole 64-column
// blocks (its tiled layout: flash_mask.cuh; HS 32 and 96 leave the last block's right half unused).
ATTN_HD int attn_dq_acc_row_blocks(int T_q) { return (T_q + 63) / 64; }
ATTN_HD int attn_dq_acc_col_blocks(int HS) { return (HS + 63) / 64; }
// Its size in floats: (B, NH, 64 x row blocks, 64 x column blocks).
ATTN_HD size_t attn_dq_acc_floats(const AttnParams *p) {
    return (size_t)p->B * p->NH * attn_dq_acc_row_blocks(p->T_q) * 64 * attn_dq_acc_col_blocks(p->HS) * 64;
}
