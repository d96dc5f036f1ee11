// sparse: the host-side block lists of block-sparse attention (attention.h): the patterns built
// from a few numbers, a caller's own lists checked and transposed, and their density.
#include <stdlib.h>
#include <string.h>

#include "attention/attention.h"
#include "attention/mask.h"
#include "common/check.h"
#include "common/rng.h"

void attn_block_mask_free(AttnBlockMask *m) {
    free(m->q_offsets); free(m->q_blocks); free(m->k_offsets); free(m->k_blocks);
    memset(m, 0, sizeof *m);
}

static int out_of_memory(AttnBlockMask *m, char *err, size_t errlen) {
    attn_block_mask_free(m);
    return set_error(err, errlen, "attention: out of host memory for the block lists");
}

// The transposed lists (per key block its query blocks, ascending) from the per-query-block
// ones: a counting pass, then rows visited in order so every key block's list comes out sorted.
static int add_transpose(AttnBlockMask *m, char *err, size_t errlen) {
    m->k_offsets = calloc((size_t)m->n_kb + 1, sizeof(int));
    m->k_blocks = malloc(sizeof(int) * (size_t)(m->nnz > 0 ? m->nnz : 1));
    int *cursor = malloc(sizeof(int) * (size_t)m->n_kb);
    if (!m->k_offsets || !m->k_blocks || !cursor) {
        free(cursor);
        return out_of_memory(m, err, errlen);
    }
    for (int e = 0; e < m->nnz; e++) m->k_offsets[m->q_blocks[e] + 1]++;
    for (int kb = 0; kb < m->n_kb; kb++) {
        m->k_offsets[kb + 1] += m->k_offsets[kb];
        cursor[kb] = m->k_offsets[kb];
    }
    for (int qb = 0; qb < m->n_qb; qb++)
        for (int e = m->q_offsets[qb]; e < m->q_offsets[qb + 1]; e++) m->k_blocks[cursor[m->q_blocks[e]]++] = qb;
    free(cursor);
    return 0;
}

static int init_mask(AttnBlockMask *m, int T_q, int T_k, size_t cap, char *err, size_t errlen) {
    memset(m, 0, sizeof *m);
    if (T_q < 1 || T_k < 1)
        return set_error(err, errlen, "attention: block lists need positive T_q and T_k, got %d and %d", T_q, T_k);
    m->T_q = T_q;
    m->T_k = T_k;
    m->n_qb = attn_sparse_blocks(T_q);
    m->n_kb = attn_sparse_blocks(T_k);
    m->q_offsets = calloc((size_t)m->n_qb + 1, sizeof(int));
    m->q_blocks = malloc(sizeof(int) * (cap > 0 ? cap : 1));
    return m->q_offsets && m->q_blocks ? 0 : out_of_memory(m, err, errlen);
}

int attn_block_mask_from_lists(AttnBlockMask *m, int T_q, int T_k, const int *q_offsets,
                               const int *q_blocks, char *err, size_t errlen) {
    const int n_qb = attn_sparse_blocks(T_q > 0 ? T_q : 1), n_kb = attn_sparse_blocks(T_k > 0 ? T_k : 1);
    if (q_offsets[0] != 0)
        return set_error(err, errlen, "attention: block list offsets[0] is %d, must be 0", q_offsets[0]);
    for (int qb = 0; qb < n_qb; qb++) {
        if (q_offsets[qb + 1] < q_offsets[qb])
            return set_error(err, errlen, "attention: block list offsets decrease at query block %d", qb + 1);
        for (int e = q_offsets[qb]; e < q_offsets[qb + 1]; e++)
            if (q_blocks[e] < 0 || q_blocks[e] >= n_kb || (e > q_offsets[qb] && q_blocks[e] <= q_blocks[e - 1]))
                return set_error(err, errlen,
                                 "attention: the key blocks of query block %d must be distinct, "
                                 "ascending and in [0, %d): entry %d is %d",
                                 qb, n_kb, e - q_offsets[qb], q_blocks[e]);
    }
    if (init_mask(m, T_q, T_k, (size_t)q_offsets[n_qb], err, errlen) != 0) return -1;
    memcpy(m->q_offsets, q_offsets, sizeof(int) * ((size_t)n_qb + 1));
    memcpy(m->q_blocks, q_blocks, sizeof(int) * (size_t)q_offsets[n_qb]);
    m->nnz = q_offsets[n_qb];
    return add_transpose(m, err, errlen);
}

// Parameters wider than the problem are clipped to it, not refused: a decoding step (T_q = 1,
// T_k = t + 1) early in a sequence has fewer blocks than the band. Callers refuse a pattern
// wider than their sequence in their own terms.
static int check_spec(const AttnSparseSpec *s, char *err, size_t errlen) {
    if (s->pattern < ATTN_SPARSE_LOCAL_GLOBAL || s->pattern > ATTN_SPARSE_BIGBIRD)
        return set_error(err, errlen, "attention: block pattern %d is not local_global, strided or bigbird",
                         (int)s->pattern);
    if (s->band < 1)
        return set_error(err, errlen, "attention: the local band of %d blocks must be at least 1 (the "
                                      "diagonal block)", s->band);
    if (s->global < 0 || s->random < 0)
        return set_error(err, errlen, "attention: global (%d) and random (%d) blocks must be >= 0",
                         s->global, s->random);
    if (s->pattern == ATTN_SPARSE_STRIDED && s->stride < 1)
        return set_error(err, errlen, "attention: the stride of %d blocks must be at least 1", s->stride);
    return 0;
}

// Marks the blocks of pattern s in row[n_kb] (0/1) for the query block whose first aligned
// position lies in key block diag; last: the last key block any causal query of it can see.
// Everything depends on diag, not on the query block's index, so a decoding step (one query
// against the cache) reads the blocks its position's query block reads in training.
static void mark_row(unsigned char *row, const AttnSparseSpec *s, int n_kb, int diag, int last) {
    memset(row, 0, (size_t)n_kb);
    for (int kb = diag - s->band + 1; kb < diag + s->band; kb++)
        if (kb >= 0 && kb < n_kb) row[kb] = 1;
    if (s->pattern == ATTN_SPARSE_STRIDED)
        for (int kb = s->stride - 1; kb < n_kb; kb += s->stride) row[kb] = 1;
    else {
        for (int kb = 0; kb < s->global && kb < n_kb; kb++) row[kb] = 1;
        if (diag < s->global) memset(row, 1, (size_t)n_kb);
    }
    if (s->pattern == ATTN_SPARSE_BIGBIRD && s->random > 0 && last >= 0) {
        Rng r;
        rng_seed(&r, s->seed ^ (0x9E3779B97F4A7C15ull * (uint64_t)(diag + 1)));
        for (int i = 0; i < s->random; i++) row[rng_below(&r, (uint64_t)(last + 1))] = 1;
    }
}

int attn_block_mask_build(AttnBlockMask *m, const AttnSparseSpec *s, int T_q, int T_k, int causal,
                          char *err, size_t errlen) {
    memset(m, 0, sizeof *m);
    if (T_q < 1 || T_k < 1)
        return set_error(err, errlen, "attention: block lists need positive T_q and T_k, got %d and %d", T_q, T_k);
    const int n_qb = attn_sparse_blocks(T_q), n_kb = attn_sparse_blocks(T_k);
    if (check_spec(s, err, errlen) != 0) return -1;
    unsigned char *row = malloc((size_t)n_kb);
    size_t cap = (size_t)n_qb * 4 + 16;
    if (!row || init_mask(m, T_q, T_k, cap, err, errlen) != 0) {
        free(row);
        return row ? -1 : out_of_memory(m, err, errlen);
    }
    const int64_t shift = (int64_t)T_k - T_q;  // bottom-right alignment (attention.h)
    for (int qb = 0; qb < n_qb; qb++) {
        const int64_t p0 = (int64_t)qb * ATTN_SPARSE_BLOCK + shift;
        const int64_t p1 = (int64_t)(qb == n_qb - 1 ? T_q - 1 : qb * ATTN_SPARSE_BLOCK + ATTN_SPARSE_BLOCK - 1) + shift;
        const int diag = (int)(p0 >= 0 ? p0 / ATTN_SPARSE_BLOCK : -((-p0 + ATTN_SPARSE_BLOCK - 1) / ATTN_SPARSE_BLOCK));
        int last = n_kb - 1;  // causal: nothing after the row's last aligned position
        if (causal) last = p1 < 0 ? -1 : (int)(p1 / ATTN_SPARSE_BLOCK < last ? p1 / ATTN_SPARSE_BLOCK : last);
        mark_row(row, s, n_kb, diag, last);
        for (int kb = 0; kb <= last; kb++) {
            if (!row[kb]) continue;
            if ((size_t)m->nnz == cap) {
                int *grown = realloc(m->q_blocks, sizeof(int) * cap * 2);
                if (!grown) {
                    free(row);
                    return out_of_memory(m, err, errlen);
                }
                m->q_blocks = grown;
                cap *= 2;
            }
            m->q_blocks[m->nnz++] = kb;
        }
        m->q_offsets[qb + 1] = m->nnz;
    }
    free(row);
    return add_transpose(m, err, errlen);
}

double attn_block_mask_density(const AttnBlockMask *m) {
    return (double)m->nnz / ((double)m->n_qb * m->n_kb);
}

void attn_set_block_mask(AttnParams *p, const AttnBlockMask *m) {
    p->sparse_q_offsets = m->q_offsets;
    p->sparse_q_blocks = m->q_blocks;
    p->sparse_k_offsets = m->k_offsets;
    p->sparse_k_blocks = m->k_blocks;
}
