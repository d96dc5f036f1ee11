// sparse_lists: attention.sparse's block lists per attention shape, in backend memory.
#include "model/sparse_lists.h"

#include <stdlib.h>

#include "common/check.h"

_Static_assert(ATTN_SPARSE_NONE == 0 && ATTN_SPARSE_LOCAL_GLOBAL == 1 && ATTN_SPARSE_STRIDED == 2 &&
                   ATTN_SPARSE_BIGBIRD == 3,
               "attention.sparse stores these values (common/config.c)");

// One shape's lists: q_offsets, q_blocks, k_offsets, k_blocks in backend memory, each with room
// for cap[i] ints (kept across rebuilds that fit).
typedef struct {
    int T_q, T_k, causal;  // T_q 0: empty
    int *dev[4];
    size_t cap[4];
} Slot;

struct SparseLists {
    Backend *be;
    AttnSparseSpec spec;
    int every;
    Slot slots[2];  // [0] T_q == T_k (training, evaluation), [1] T_q != T_k (decoding)
};

AttnSparseSpec sparse_lists_spec(const Config *run) {
    return (AttnSparseSpec){(AttnSparsePattern)run->attention.sparse,
                            run->attention.sparse_band / ATTN_SPARSE_BLOCK,
                            run->attention.sparse_global / ATTN_SPARSE_BLOCK,
                            run->attention.sparse_stride / ATTN_SPARSE_BLOCK,
                            run->attention.sparse_random,
                            (uint64_t)run->attention.sparse_seed};
}

SparseLists *sparse_lists_create(Backend *be, const Config *run) {
    if (!run || run->attention.sparse == ATTN_SPARSE_NONE) return NULL;
    SparseLists *s = xcalloc(1, sizeof *s);
    s->be = be;
    s->every = run->attention.sparse_every > 0 ? run->attention.sparse_every : 1;
    s->spec = sparse_lists_spec(run);
    return s;
}

void sparse_lists_free(SparseLists *s) {
    if (!s) return;
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 4; i++)
            if (s->slots[k].dev[i]) s->be->release(s->be, s->slots[k].dev[i]);
    free(s);
}

// Builds the lists of (T_q, T_k, causal) into slot sl (host, then one upload per array).
static void build(SparseLists *s, Slot *sl, int T_q, int T_k, int causal) {
    AttnBlockMask m;
    char err[256];
    if (attn_block_mask_build(&m, &s->spec, T_q, T_k, causal, err, sizeof err) != 0)
        fatal(EXIT_USAGE, "%s\n  (in the config: attention.sparse and its sparse_* keys)", err);
    const int *host[4] = {m.q_offsets, m.q_blocks, m.k_offsets, m.k_blocks};
    const size_t n[4] = {(size_t)m.n_qb + 1, (size_t)m.nnz, (size_t)m.n_kb + 1, (size_t)m.nnz};
    for (int i = 0; i < 4; i++) {
        if (n[i] > sl->cap[i]) {
            if (sl->dev[i]) s->be->release(s->be, sl->dev[i]);
            sl->cap[i] = n[i] + n[i] / 4;
            sl->dev[i] = s->be->alloc(s->be, sl->cap[i] * sizeof(int));
        }
        if (n[i] > 0) s->be->upload(s->be, sl->dev[i], host[i], n[i] * sizeof(int));
    }
    attn_block_mask_free(&m);
    sl->T_q = T_q;
    sl->T_k = T_k;
    sl->causal = causal;
}

void sparse_lists_apply(SparseLists *s, AttnParams *p, int layer) {
    if (!s || layer % s->every != 0) return;
    Slot *sl = &s->slots[p->T_q == p->T_k ? 0 : 1];
    if (sl->T_q != p->T_q || sl->T_k != p->T_k || sl->causal != p->causal) build(s, sl, p->T_q, p->T_k, p->causal);
    p->sparse_q_offsets = sl->dev[0];
    p->sparse_q_blocks = sl->dev[1];
    p->sparse_k_offsets = sl->dev[2];
    p->sparse_k_blocks = sl->dev[3];
}
