// ring_attention: the ring over the zigzag layout (model/ring_attention.h), written over the
// Backend's ops (attention with explicit chunk positions, the lse merge, strided copies), so it
// never touches backend memory itself.
#include "model/ring_attention.h"

#include <string.h>

#include "attention/mask.h"
#include "common/check.h"

struct RingAttention {
    Backend *be;
    RingLink link;
    int B, T, c;          // largest batch, local tokens, tokens per chunk (T / 2)
    int NH, NKV, HS;
    size_t ds;            // bytes per element
    int kvw;              // elements per token of a block: [k (NKV * HS) | v (NKV * HS)]
    // (B, T, kvw) each: the block held and the one arriving. dkv is in the backend's dtype,
    // fp32 on the CPU (the only backend that runs the ring so far); a 16-bit backend must keep
    // these accumulators in fp32, or every ring step rounds the running dK/dV sums.
    void *kv[2], *dkv[2];
    void *part_out;       // (B, c, NH * HS) one chunk pair's output before it is merged
    float *part_lse;      // (B, NH, c) its lse
};

static int chunk_of(int rank, int size, int half) { return half ? 2 * size - 1 - rank : rank; }

int ring_global_pos(int rank, int size, int T_local, int t) {
    const int c = T_local / 2, half = t >= c;
    return chunk_of(rank, size, half) * c + (t - half * c);
}

static void *at(const void *base, int64_t elems, size_t ds) {
    return (char *)base + elems * (int64_t)ds;
}

RingAttention *ring_attention_create(Backend *be, const RingLink *link, int B, int T_local, int NH,
                                     int NKV, int HS) {
    CHECK(link->size >= 1 && link->rank >= 0 && link->rank < link->size && T_local % 2 == 0);
    RingAttention *ra = xcalloc(1, sizeof *ra);
    ra->be = be;
    ra->link = *link;
    ra->B = B;
    ra->T = T_local;
    ra->c = T_local / 2;
    ra->NH = NH;
    ra->NKV = NKV;
    ra->HS = HS;
    ra->ds = dtype_size(be->dtype);
    ra->kvw = 2 * NKV * HS;
    const size_t block = (size_t)B * T_local * ra->kvw * ra->ds;
    for (int i = 0; i < 2; i++) {
        ra->kv[i] = be->alloc(be, block);
        ra->dkv[i] = be->alloc(be, block);
    }
    ra->part_out = be->alloc(be, (size_t)B * ra->c * NH * HS * ra->ds);
    ra->part_lse = be->alloc(be, (size_t)B * NH * ra->c * sizeof(float));
    return ra;
}

void ring_attention_free(RingAttention *ra) {
    if (!ra) return;
    Backend *be = ra->be;
    for (int i = 0; i < 2; i++) {
        be->release(be, ra->kv[i]);
        be->release(be, ra->dkv[i]);
    }
    be->release(be, ra->part_out);
    be->release(be, ra->part_lse);
    free(ra);
}

// The model's problem must be the fused QKV layout: k and v adjacent in each token's row, so a
// block is one strided copy; anything else is a caller bug.
static void check_layout(const RingAttention *ra, const AttnParams *p, int backward) {
    const int64_t kv_off = (int64_t)ra->NKV * ra->HS;
    CHECK(p->T_q == ra->T && p->T_k == ra->T && p->B >= 1 && p->B <= ra->B);
    CHECK(p->NH == ra->NH && p->NKV == ra->NKV && p->HS == ra->HS && !p->cu_seqlens &&
          p->dropout_p == 0.0f && !p->pos_explicit);
    CHECK(p->v == at(p->k, kv_off, ra->ds) && p->k_st.row == p->v_st.row && p->k_st.head == ra->HS);
    if (backward)
        CHECK(p->dv == at(p->dk, kv_off, ra->ds) && p->dk_st.row == p->dv_st.row &&
              p->dk_st.head == ra->HS);
}

// The block's strides: (B, T, kvw) rows of [k | v].
static AttnStrides block_strides(const RingAttention *ra) {
    return (AttnStrides){(int64_t)ra->T * ra->kvw, ra->kvw, ra->HS};
}

// The chunk pair (local query half qh) x (half kh of the block of ring rank `origin`, held in
// kv, its dK/dV accumulator in dkv): p narrowed to the pair, with explicit positions. out and
// lse are the local ones (chunk qh of p's).
static AttnParams pair_params(const RingAttention *ra, const AttnParams *p, int qh, int origin,
                              int kh, const void *kv, void *dkv) {
    const int c = ra->c, size = ra->link.size;
    const int64_t q0 = (int64_t)qh * c, k0 = (int64_t)kh * c * ra->kvw;
    const int64_t lse_h = p->lse_head_stride ? p->lse_head_stride : p->T_q;
    const int64_t lse_b = p->lse_batch_stride ? p->lse_batch_stride : (int64_t)p->NH * p->T_q;
    AttnParams a = *p;
    a.q = at(p->q, q0 * p->q_st.row, ra->ds);
    a.out = at(p->out, q0 * p->o_st.row, ra->ds);
    a.lse = p->lse + q0;
    a.lse_batch_stride = lse_b;
    a.lse_head_stride = lse_h;
    a.k = at(kv, k0, ra->ds);
    a.v = at(kv, k0 + (int64_t)ra->NKV * ra->HS, ra->ds);
    a.k_st = a.v_st = block_strides(ra);
    a.T_q = a.T_k = c;
    a.pos_explicit = 1;
    a.q_pos0 = (int64_t)chunk_of(ra->link.rank, size, qh) * c;
    a.k_pos0 = (int64_t)chunk_of(origin, size, kh) * c;
    if (dkv) {
        a.dout = at(p->dout, q0 * p->do_st.row, ra->ds);
        a.dq = at(p->dq, q0 * p->dq_st.row, ra->ds);
        a.dk = at(dkv, k0, ra->ds);
        a.dv = at(dkv, k0 + (int64_t)ra->NKV * ra->HS, ra->ds);
        a.dk_st = a.dv_st = block_strides(ra);
        a.accumulate = 1;
    }
    return a;
}

// Whether any query of the pair sees any key (causal future and out-of-window pairs do not).
// The mask depends only on positions here (no documents), so batch row 0 stands for all.
static int pair_visible(const AttnParams *a) {
    for (int i = 0; i < a->T_q; i++) {
        AttnKeyRange r = attn_key_range(a, 0, i);
        if (r.lo < r.hi) return 1;
    }
    return 0;
}

// The pairs of ring step s in the order they run: at step 0 (the rank's own block) the two
// diagonal pairs first. Every query sees at least its own key, so they are the first result of
// each query half (forward: written in place, the rest merged in) and the first dQ of each
// half (backward: they overwrite dQ and their own dK/dV chunk, the rest accumulate).
static void step_pairs(int s, int qh[4], int kh[4]) {
    static const int diag_q[4] = {0, 1, 0, 1}, diag_k[4] = {0, 1, 1, 0};
    static const int all_q[4] = {0, 0, 1, 1}, all_k[4] = {0, 1, 0, 1};
    memcpy(qh, s == 0 ? diag_q : all_q, sizeof diag_q);
    memcpy(kh, s == 0 ? diag_k : all_k, sizeof diag_k);
}

// Packs the local k and v of every token into a block (one row of [k | v] per token).
static void pack_block(RingAttention *ra, void *dst, const AttnParams *p) {
    const size_t row = (size_t)ra->kvw * ra->ds;
    ra->be->copy_2d(ra->be, dst, row, p->k, (size_t)p->k_st.row * ra->ds, row, (size_t)p->B * ra->T);
}

static size_t block_bytes(const RingAttention *ra, const AttnParams *p) {
    return (size_t)p->B * ra->T * ra->kvw * ra->ds;
}

void ring_attention_forward(RingAttention *ra, const AttnParams *p) {
    Backend *be = ra->be;
    check_layout(ra, p, 0);
    const int size = ra->link.size, rank = ra->link.rank;
    const size_t bytes = block_bytes(ra, p);
    pack_block(ra, ra->kv[0], p);
    int have[2] = {0, 0};   // query half written yet (by its step-0 diagonal)
    for (int s = 0; s < size; s++) {
        const int cur = s & 1, origin = (rank - s + size) % size;
        if (s < size - 1) ra->link.start(ra->link.ctx, ra->kv[cur], ra->kv[1 - cur], bytes);
        int qh[4], kh[4];
        step_pairs(s, qh, kh);
        for (int k = 0; k < 4; k++) {
            AttnParams a = pair_params(ra, p, qh[k], origin, kh[k], ra->kv[cur], NULL);
            if (!pair_visible(&a)) {
                CHECK(!(s == 0 && k < 2));  // the diagonals start each half (step_pairs)
                continue;
            }
            if (!have[qh[k]]) {
                backend_attention(be, &a, 0);
                have[qh[k]] = 1;
                continue;
            }
            const AttnParams acc = a;
            a.out = ra->part_out;
            a.o_st = (AttnStrides){(int64_t)ra->c * ra->NH * ra->HS, (int64_t)ra->NH * ra->HS, ra->HS};
            a.lse = ra->part_lse;
            a.lse_batch_stride = a.lse_head_stride = 0;
            backend_attention(be, &a, 0);
            backend_attention_merge(be, &acc, &a);
        }
        if (s < size - 1) ra->link.wait(ra->link.ctx);
    }
}

void ring_attention_backward(RingAttention *ra, const AttnParams *p) {
    Backend *be = ra->be;
    check_layout(ra, p, 1);
    const int size = ra->link.size, rank = ra->link.rank;
    const size_t bytes = block_bytes(ra, p);
    pack_block(ra, ra->kv[0], p);
    be->fill_zero(be, ra->dkv[0], bytes);
    for (int s = 0; s < size; s++) {
        const int cur = s & 1, origin = (rank - s + size) % size;
        if (s < size - 1) ra->link.start(ra->link.ctx, ra->kv[cur], ra->kv[1 - cur], bytes);
        int qh[4], kh[4];
        step_pairs(s, qh, kh);
        for (int k = 0; k < 4; k++) {
            AttnParams a = pair_params(ra, p, qh[k], origin, kh[k], ra->kv[cur], ra->dkv[cur]);
            if (!pair_visible(&a)) {
                CHECK(!(s == 0 && k < 2));  // dQ would never be started
                continue;
            }
            a.accumulate = !(s == 0 && k < 2);  // the diagonals of step 0 start dQ (step_pairs)
            backend_attention(be, &a, 1);
        }
        // The accumulator follows its block: after `size` sends it is back with its owner.
        ra->link.start(ra->link.ctx, ra->dkv[cur], ra->dkv[1 - cur], bytes);
        ra->link.wait(ra->link.ctx);
    }
    const size_t row = (size_t)ra->kvw * ra->ds;
    be->copy_2d(be, p->dk, (size_t)p->dk_st.row * ra->ds, ra->dkv[size & 1], row, row,
                (size_t)p->B * ra->T);
}
