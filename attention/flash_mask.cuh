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

// ALiBi bias in the log2 domain the kernels work in (slope pre-multiplied by log2(e)).
__device__ __forceinline__ float alibi_bias_log2(float slope_log2, int pos, int j) {
    return attn_alibi_bias(slope_log2, pos, j);
}

// Dropout keep-decision of element (b, h, i, j): the same Philox draw as attn_dropout_keep().
__device__ __forceinline__ bool dropout_keep(const AttnParams &p, int b, int h, int i, int j) {
    return attn_dropout_keep_elem(&p, attn_dropout_elem(&p, b, h, i, j));
}
