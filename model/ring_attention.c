// ring_attention: the ring over the zigzag layout (model/ring_attention.h), written over the
// Backend's ops (attention with explicit chunk positions, the lse merge, strided copies, fp32
// accumulators), so it never touches backend memory itself.
#include "model/ring_attention.h"

#include <math.h>
#include <string.h>

#include "attention/mask.h"
#include "common/check.h"

struct RingAttention {
    Backend *be;
    RingLink link;
    int B, T, c;          // largest batch, local tokens, tokens per chunk (T / 2)
    int NH, NKV, HS;
    size_t ds;            // bytes per element of the backend's dtype
    int kvw;              // elements per token of a block: [k (NKV * HS) | v (NKV * HS)]
    int qw;               // elements per token of the queries and the output: NH * HS
    void *kv_own;         // (B, T, kvw) this rank's block, packed from the fused layout
    void *kv_in[2];       // (B, T, kvw) the block of the step in hand and the next one's
    float *dkv_own;       // (B, T, kvw) fp32: this rank's dK/dV, the returned chains added in
    float *chain[3];      // (B, T, kvw) fp32: chain[s % 3], the chain buffer of step s (backward)
    float *dkv_in;        // (B, T, kvw) fp32: a chain of this rank's dK/dV come back
    float *out_acc;       // (B, T, qw) fp32: the merged output; (B, T, qw) fp32 dQ in backward
    void *part_out;       // (B, T, qw) one call's output (up to two chunks) before its merge
    float *part_lse;      // (B, NH, T) its lse
    // Backward, per span kind (span_kind): the state its calls share (attention.h's dsum and
    // dq_accum), and the last call of each kind, whose params store the dQ accumulator.
    float *dsum[3];       // (B, NH, kind's queries) fp32 D
    float *dq_acc[3];     // attn_dq_accum_floats of the kind's calls (largest batch): their dQ
                          // summed; made on the kind's first use (most rings use two kinds)
    AttnParams kind_call[3];
    int kinds_used;       // bit k: kind k has run in the backward in hand
    // ring_attention_time: marks[i] follows the op of phase mark_phase[i] (i >= 1) of the call in
    // hand; marks[0] precedes its first op.
    RingTimes *times;
    void **marks;
    int *mark_phase;
    int n_marks, n_made;
};

const char *const RING_PHASE_NAMES[RING_N_PHASES] = {"pack", "kernel", "merge", "fill", "add", "store"};

// The query sets of the calls (Span's qh, nq): all the local queries, or the first or second half.
enum { KIND_ALL = 0, KIND_HALF0 = 1, KIND_HALF1 = 2, N_KINDS = 3 };

static int chunk_of(int rank, int size, int half) { return half ? 2 * size - 1 - rank : rank; }

int ring_global_pos(int rank, int size, int T_local, int t) {
    const int c = T_local / 2, half = t >= c;
    return chunk_of(rank, size, half) * c + (t - half * c);
}

static void *at(const void *base, int64_t elems, size_t ds) {
    return (char *)base + elems * (int64_t)ds;
}

static size_t block_elems(const RingAttention *ra) { return (size_t)ra->B * ra->T * ra->kvw; }

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
    ra->qw = NH * HS;
    const size_t block = block_elems(ra);
    ra->kv_own = be->alloc(be, block * ra->ds);
    ra->dkv_own = be->alloc(be, block * sizeof(float));
    ra->dkv_in = be->alloc(be, block * sizeof(float));
    for (int i = 0; i < 2; i++) ra->kv_in[i] = be->alloc(be, block * ra->ds);
    for (int i = 0; i < 3; i++) ra->chain[i] = be->alloc(be, block * sizeof(float));
    ra->out_acc = be->alloc(be, (size_t)B * T_local * ra->qw * sizeof(float));
    ra->part_out = be->alloc(be, (size_t)B * T_local * ra->qw * ra->ds);
    ra->part_lse = be->alloc(be, (size_t)B * NH * T_local * sizeof(float));
    for (int k = 0; k < N_KINDS; k++)
        ra->dsum[k] = be->alloc(be, (size_t)B * NH * (k == KIND_ALL ? T_local : ra->c) * sizeof(float));
    return ra;
}

void ring_attention_free(RingAttention *ra) {
    if (!ra) return;
    Backend *be = ra->be;
    be->release(be, ra->kv_own);
    be->release(be, ra->dkv_own);
    be->release(be, ra->dkv_in);
    for (int i = 0; i < 2; i++) be->release(be, ra->kv_in[i]);
    for (int i = 0; i < 3; i++) be->release(be, ra->chain[i]);
    be->release(be, ra->out_acc);
    be->release(be, ra->part_out);
    be->release(be, ra->part_lse);
    for (int k = 0; k < N_KINDS; k++) {
        be->release(be, ra->dsum[k]);
        if (ra->dq_acc[k]) be->release(be, ra->dq_acc[k]);
    }
    for (int i = 0; i < ra->n_made; i++) be->mark_free(be, ra->marks[i]);
    free(ra->marks);
    free(ra->mark_phase);
    free(ra);
}

void ring_attention_time(RingAttention *ra, RingTimes *t) { ra->times = t; }

// With timing on: a mark after the op just queued, which was of phase ph (-1: before the first).
static void timed(RingAttention *ra, int ph) {
    if (!ra->times) return;
    Backend *be = ra->be;
    if (ra->n_marks == ra->n_made) {
        ra->marks = xrealloc(ra->marks, (size_t)(ra->n_made + 1) * sizeof *ra->marks);
        ra->mark_phase = xrealloc(ra->mark_phase, (size_t)(ra->n_made + 1) * sizeof *ra->mark_phase);
        ra->marks[ra->n_made++] = be->mark_create(be);
    }
    ra->mark_phase[ra->n_marks] = ph;
    be->mark_record(be, ra->marks[ra->n_marks++]);
}

// The end of a timed call of direction dir (0 forward, 1 backward): each op's time into times.
static void timed_end(RingAttention *ra, int dir) {
    if (!ra->times) return;
    for (int i = 1; i < ra->n_marks; i++) {
        ra->times->ms[dir][ra->mark_phase[i]] +=
            ra->be->mark_elapsed_ms(ra->be, ra->marks[i - 1], ra->marks[i]);
        ra->times->ops[dir][ra->mark_phase[i]]++;
    }
    ra->n_marks = 0;
}

// The ring's ops, each followed by its mark when timed.
static void zero(RingAttention *ra, void *p, size_t bytes) {
    ra->be->fill_zero(ra->be, p, bytes);
    timed(ra, RING_FILL);
}

static void attend(RingAttention *ra, AttnParams *a, int backward) {
    backend_attention(ra->be, a, backward);
    timed(ra, RING_KERNEL);
}

// The rows [row0, row0 + rows) (of the B x T local tokens) of width elements of the fp32
// accumulator src (pitch width), plus those of add (the same layout) unless it is NULL, into
// dst of the dtype (pitch dst_pitch elements).
static void store_rows(RingAttention *ra, void *dst, int64_t dst_pitch, const float *src, const float *add,
                       int width, size_t row0, size_t rows) {
    if (!rows) return;
    const int64_t at_src = (int64_t)row0 * width;
    ra->be->store_f32(ra->be, at(dst, (int64_t)row0 * dst_pitch, ra->ds), (size_t)dst_pitch, src + at_src,
                      add ? add + at_src : NULL, (size_t)width, (size_t)width, rows);
    timed(ra, RING_STORE);
}

static void store(RingAttention *ra, void *dst, int64_t dst_pitch, const float *src, int width, int B) {
    store_rows(ra, dst, dst_pitch, src, NULL, width, 0, (size_t)B * ra->T);
}

// The model's problem must be the fused QKV layout (k and v adjacent in each token's row, so a
// block is one strided copy) with contiguous batch rows and lse; anything else is a caller bug.
static void check_layout(const RingAttention *ra, const AttnParams *p, int backward) {
    const int64_t kv_off = (int64_t)ra->NKV * ra->HS;
    CHECK(p->T_q == ra->T && p->T_k == ra->T && p->B >= 1 && p->B <= ra->B);
    CHECK(p->NH == ra->NH && p->NKV == ra->NKV && p->HS == ra->HS && !p->cu_seqlens &&
          p->dropout_p == 0.0f && !p->pos_explicit && !p->lse_batch_stride &&
          !p->lse_head_stride);
    CHECK(p->v == at(p->k, kv_off, ra->ds) && p->k_st.row == p->v_st.row &&
          p->k_st.head == ra->HS && p->o_st.batch == (int64_t)ra->T * p->o_st.row);
    if (backward)
        CHECK(p->dv == at(p->dk, kv_off, ra->ds) && p->dk_st.row == p->dv_st.row &&
              p->dk_st.head == ra->HS && p->dq_st.batch == (int64_t)ra->T * p->dq_st.row &&
              p->dk_st.batch == (int64_t)ra->T * p->dk_st.row);
}

// A block's strides: (B, T, kvw) rows of [k | v].
static AttnStrides block_strides(const RingAttention *ra) {
    return (AttnStrides){(int64_t)ra->T * ra->kvw, ra->kvw, ra->HS};
}

// The strides of the fp32 (B, T, qw) output and dQ accumulators.
static AttnStrides acc_strides(const RingAttention *ra) {
    return (AttnStrides){(int64_t)ra->T * ra->qw, ra->qw, ra->HS};
}

// A call of a ring step: query halves [qh, qh + nq) of the local tokens against key halves
// [kh, kh + nk) of a block (each half one chunk of c tokens). own_causal: the whole own block,
// causal in local order (own_block_causal).
typedef struct {
    int qh, nq, kh, nk;
    int own_causal;
} Span;

// The span of the queries of ring rank `rank` against the block of ring rank `origin` held in
// kv (its fp32 dK/dV accumulator in dkv, backward only): p narrowed to it. One chunk against one
// chunk takes explicit positions; a span of two (their positions are not contiguous) is only
// made of pairs in which every query sees every key (step_spans), so it runs unmasked, unless
// it is the own block under own_block_causal, which keeps p's mask on local positions. lse is
// the local one (the span's query rows of p's); forward writes into the fp32 output
// accumulator's rows, backward reads p's out and adds into the fp32 dQ accumulator's rows.
static AttnParams span_params(const RingAttention *ra, const AttnParams *p, int rank, int origin,
                              Span sp, const void *kv, float *dkv) {
    const int c = ra->c, size = ra->link.size;
    const int64_t q0 = (int64_t)sp.qh * c, k0 = (int64_t)sp.kh * c * ra->kvw;
    const int64_t kv_off = (int64_t)ra->NKV * ra->HS;
    AttnParams a = *p;
    a.q = at(p->q, q0 * p->q_st.row, ra->ds);
    a.out = dkv ? at(p->out, q0 * p->o_st.row, ra->ds) : (void *)(ra->out_acc + q0 * ra->qw);
    if (!dkv) a.o_st = acc_strides(ra);
    a.lse = p->lse + q0;
    a.lse_batch_stride = (int64_t)p->NH * p->T_q;
    a.lse_head_stride = p->T_q;
    a.k = at(kv, k0, ra->ds);
    a.v = at(kv, k0 + kv_off, ra->ds);
    a.k_st = a.v_st = block_strides(ra);
    a.T_q = sp.nq * c;
    a.T_k = sp.nk * c;
    if (sp.nq == 1 && sp.nk == 1) {
        a.pos_explicit = 1;
        a.q_pos0 = (int64_t)chunk_of(rank, size, sp.qh) * c;
        a.k_pos0 = (int64_t)chunk_of(origin, size, sp.kh) * c;
    } else if (!sp.own_causal) {
        a.causal = 0;
        a.window_left = a.window_right = -1;
    }
    if (dkv) {
        a.dout = at(p->dout, q0 * p->do_st.row, ra->ds);
        a.dq = ra->out_acc + q0 * ra->qw;
        a.dq_st = acc_strides(ra);
        a.dk = dkv + k0;
        a.dv = dkv + k0 + kv_off;
        a.dk_st = a.dv_st = block_strides(ra);
        a.accumulate = 1;
    }
    return a;
}

// The query set of a span (its kind).
static int span_kind(Span sp) { return sp.nq == 2 ? KIND_ALL : sp.qh ? KIND_HALF1 : KIND_HALF0; }

// Chunk pair k (0..3): query half k / 2 against key half k % 2.
static AttnParams pair_params(const RingAttention *ra, const AttnParams *p, int rank, int origin,
                              int k, const void *kv, float *dkv) {
    return span_params(ra, p, rank, origin, (Span){k >> 1, 1, k & 1, 1, 0}, kv, dkv);
}

// Whether any query of the pair sees any key, in O(1) (it is asked several times per ring step
// and layer). With no documents (check_layout) key j is visible to query i, at key position pos
// = i + shift, iff the offset j - pos lies in [-window_left, causal ? min(0, window_right) :
// window_right] (unbounded where -1); the pair's offsets cover [-(T_q - 1 + shift), T_k - 1 -
// shift] without gaps, so some query sees some key iff the two intervals meet.
static int pair_visible(const AttnParams *a) {
    const int64_t shift = attn_query_shift(a);
    int64_t lo = -((int64_t)a->T_q - 1 + shift), hi = (int64_t)a->T_k - 1 - shift;
    if (a->window_left >= 0 && lo < -(int64_t)a->window_left) lo = -(int64_t)a->window_left;
    if (a->causal && hi > 0) hi = 0;
    if (a->window_right >= 0 && hi > a->window_right) hi = a->window_right;
    return lo <= hi;
}

// Whether every query of the pair sees every key: the key ranges only grow along the rows, so
// the first row's end and the last row's start tell.
static int pair_full(const AttnParams *a) {
    return attn_key_range(a, 0, 0).hi >= a->T_k && attn_key_range(a, 0, a->T_q - 1).lo <= 0;
}

// Whether the own block runs as one call, causal over the local tokens: their global positions
// rise with the local index (chunk rank before chunk 2 * size - 1 - rank), so the causal mask on
// local positions is the global one. A window or ALiBi compares distances, which differ between
// the two chunks, so those keep the pairs.
static int own_block_causal(const AttnParams *p) {
    return p->causal && p->window_left < 0 && !p->alibi_slopes;
}

// The calls of the step of the queries of `rank` against the block of `origin`: the own block
// as one causal call where own_block_causal allows, else its visible chunk pairs, where two
// fully visible pairs that share a query or a key half (and no ALiBi, which depends on
// positions) run as one unmasked call over both. Under the causal zigzag every step but the
// first is such a pair of pairs. Returns how many (at most 4).
static int step_spans(const RingAttention *ra, const AttnParams *p, int rank, int origin,
                      Span sp[4]) {
    if (origin == rank && own_block_causal(p)) {
        sp[0] = (Span){0, 2, 0, 2, 1};
        return 1;
    }
    int vis = 0, full = 0;  // bit k: chunk pair k is visible, fully visible
    for (int k = 0; k < 4; k++) {
        const AttnParams a = pair_params(ra, p, rank, origin, k, ra->kv_own, NULL);
        if (pair_visible(&a)) vis |= 1 << k;
        if ((vis >> k & 1) && pair_full(&a)) full |= 1 << k;
    }
    if (!p->alibi_slopes && vis == full) {
        for (int h = 0; h < 2; h++) {
            if (vis == (1 << h | 1 << (2 + h))) {  // both query halves against key half h
                sp[0] = (Span){0, 2, h, 1, 0};
                return 1;
            }
            if (vis == (3 << (2 * h))) {  // query half h against both key halves
                sp[0] = (Span){h, 1, 0, 2, 0};
                return 1;
            }
        }
    }
    int n = 0;
    for (int k = 0; k < 4; k++)
        if (vis >> k & 1) sp[n++] = (Span){k >> 1, 1, k & 1, 1, 0};
    return n;
}

// The rows of the block of ring rank `origin` that the queries of ring rank `rank` read, as the
// elements [off, off + n) of its (B, T, kvw) layout (n = 0: none, so the block is neither sent
// nor computed): the key halves of step_spans, one half's rows where that is contiguous (B = 1;
// under the causal zigzag an origin before this rank shows only its first chunk), else all of
// them. Both sides of an exchange derive it from positions alone; the fp32 dK/dV parts of the
// same keys take the same range.
typedef struct {
    size_t off, n;
} BlockPart;

static BlockPart block_part(const RingAttention *ra, const AttnParams *p, int rank, int origin) {
    Span sp[4];
    const int n_sp = step_spans(ra, p, rank, origin, sp);
    int halves = 0;  // bit h: key half h is read
    for (int k = 0; k < n_sp; k++)
        for (int h = sp[k].kh; h < sp[k].kh + sp[k].nk; h++) halves |= 1 << h;
    const size_t half = (size_t)ra->c * ra->kvw;
    if (!halves) return (BlockPart){0, 0};
    if (halves == 3 || p->B > 1) return (BlockPart){0, (size_t)p->B * ra->T * ra->kvw};
    return (BlockPart){(size_t)(halves >> 1) * half, half};
}

static int ring_rank(const RingAttention *ra, int r) {
    const int n = ra->link.size;
    return ((r % n) + n) % n;
}

enum { NO_EXCHANGE = -1 };  // the handle of an exchange not started: nothing to wait for

// Starts the exchange of the part `out` of send (elements of es bytes) to dst and of the part
// `in` of src's into recv; a part of no elements stays out. Returns its handle, or NO_EXCHANGE
// when nothing moves.
static int start_parts(RingAttention *ra, const void *send, BlockPart out, int dst, void *recv,
                       BlockPart in, int src, size_t es) {
    if (!out.n && !in.n) return NO_EXCHANGE;
    return ra->link.start(ra->link.ctx, out.n ? at(send, (int64_t)out.off, es) : NULL,
                          out.n * es, dst, in.n ? at(recv, (int64_t)in.off, es) : NULL,
                          in.n * es, src);
}

static void wait_exchange(RingAttention *ra, int handle) {
    if (handle != NO_EXCHANGE) ra->link.wait(ra->link.ctx, handle);
}

// Starts step s's exchange of the own block and into kv_in[s & 1]: the part of this rank's that
// rank + s reads goes to it, the part of rank - s's that this rank reads comes in.
static int start_step(RingAttention *ra, const AttnParams *p, int s) {
    const int rank = ra->link.rank, dst = ring_rank(ra, rank + s), src = ring_rank(ra, rank - s);
    return start_parts(ra, ra->kv_own, block_part(ra, p, dst, rank), dst, ra->kv_in[s & 1],
                       block_part(ra, p, rank, src), src, ra->ds);
}

// Packs the local k and v of every token into the own block (one row of [k | v] per token).
static void pack_block(RingAttention *ra, const AttnParams *p) {
    const size_t row = (size_t)ra->kvw * ra->ds;
    ra->be->copy_2d(ra->be, ra->kv_own, row, p->k, (size_t)p->k_st.row * ra->ds, row,
                    (size_t)p->B * ra->T);
    timed(ra, RING_PACK);
}

// The block of step s: the own one at step 0, else the one received for it.
static const void *step_block(const RingAttention *ra, int s) {
    return s == 0 ? ra->kv_own : ra->kv_in[s & 1];
}

// Forward: step s waits for its own block alone (the exchange started one step earlier, which
// overlapped step s - 1); the first merge of every row finds the lse +INFINITY and takes the
// part as it is, and every row has one at step 0 (each query sees its own key), so the output
// accumulator needs no zeroing.
void ring_attention_forward(RingAttention *ra, const AttnParams *p) {
    Backend *be = ra->be;
    check_layout(ra, p, 0);
    const int size = ra->link.size, rank = ra->link.rank;
    timed(ra, -1);
    pack_block(ra, p);
    be->fill_f32(be, p->lse, INFINITY, (size_t)p->B * ra->NH * ra->T);
    timed(ra, RING_FILL);
    int kv_x = NO_EXCHANGE;  // the exchange bringing the block of the step in hand
    for (int s = 0; s < size; s++) {
        wait_exchange(ra, kv_x);
        kv_x = s + 1 < size ? start_step(ra, p, s + 1) : NO_EXCHANGE;
        const int origin = ring_rank(ra, rank - s);
        Span sp[4];
        const int n = step_spans(ra, p, rank, origin, sp);
        for (int k = 0; k < n; k++) {
            const AttnParams acc = span_params(ra, p, rank, origin, sp[k], step_block(ra, s), NULL);
            AttnParams a = acc;
            a.out = ra->part_out;
            a.o_st = (AttnStrides){(int64_t)a.T_q * ra->qw, ra->qw, ra->HS};
            a.lse = ra->part_lse;
            a.lse_batch_stride = a.lse_head_stride = 0;
            attend(ra, &a, 0);
            backend_attention_merge(be, &acc, &a);
            timed(ra, RING_MERGE);
        }
    }
    store(ra, p->out, p->o_st.row, ra->out_acc, ra->qw, p->B);
    timed_end(ra, 0);
}

// The backward's chains. The part of origin o's dK/dV that the rank at ring distance s computes
// (its visit at step s) joins a chain buffer of o's block that travels between the visitors of
// one parity of s, two steps apart: the visitor at step s adds into the buffer that the one at
// step s - 2 filled, so the parts are summed by the kernels' own accumulation instead of being
// zeroed, returned and added one by one, and each hop has a whole step to arrive. A run of
// visits of one parity (a segment: the visits at s, s + 2, ... while each reads some keys) ends
// where the next one would read nothing, and its buffer goes back to o, which adds it into its
// own (under the causal zigzag every step reads some keys: two segments, the odd and the even
// steps, come back at the last two steps).

// The rows of origin's block that the queries of the rank at ring distance s read (none outside
// 1 <= s < size).
static BlockPart visit(const RingAttention *ra, const AttnParams *p, int origin, int s) {
    if (s < 1 || s >= ra->link.size) return (BlockPart){0, 0};
    return block_part(ra, p, ring_rank(ra, origin + s), origin);
}

// The smallest range holding both (a block part is none, one half or all of the rows, so the
// union of two is a range).
static BlockPart part_union(BlockPart a, BlockPart b) {
    if (!a.n) return b;
    if (!b.n) return a;
    const size_t lo = a.off < b.off ? a.off : b.off;
    const size_t hi = a.off + a.n > b.off + b.n ? a.off + a.n : b.off + b.n;
    return (BlockPart){lo, hi - lo};
}

// The rows of origin's chain buffer written after the visit at step s: the union of its
// segment's visits up to s (none if the visit at s reads nothing).
static BlockPart held(const RingAttention *ra, const AttnParams *p, int origin, int s) {
    BlockPart u = {0, 0};
    for (int j = s; j >= 1; j -= 2) {
        const BlockPart v = visit(ra, p, origin, j);
        if (!v.n) break;
        u = part_union(u, v);
    }
    return u;
}

// Whether origin's segment goes on from the visit at step s to the one at s + 2.
static int continues(const RingAttention *ra, const AttnParams *p, int origin, int s) {
    return visit(ra, p, origin, s + 2).n > 0;
}

// The segment of this rank's dK/dV that comes back after step s (from the rank at distance s,
// its last visitor), in dkv_in.
static BlockPart returned_part(const RingAttention *ra, const AttnParams *p, int s) {
    const int rank = ra->link.rank;
    return continues(ra, p, rank, s) ? (BlockPart){0, 0} : held(ra, p, rank, s);
}

// The segment that came back after step s joins the accumulator.
static void add_returned(RingAttention *ra, const AttnParams *p, int s) {
    const BlockPart in = returned_part(ra, p, s);
    if (!in.n) return;
    ra->be->add_f32(ra->be, ra->dkv_own + in.off, ra->dkv_in + in.off, in.n);
    timed(ra, RING_ADD);
}

// The exchanges after step s: the hop (this rank's chain buffer to the next visitor, two ranks
// on; the buffer of step s + 2 from the rank two back) and the return (a finished segment to its
// origin; one of this rank's coming back). All the hops of the ring are in the first, so that
// each pairs with its neighbours' alone.
typedef struct {
    int hop, ret;
} Round;

static Round start_round(RingAttention *ra, const AttnParams *p, int s) {
    const int rank = ra->link.rank, origin = ring_rank(ra, rank - s);
    const int prev = ring_rank(ra, rank - s - 2);  // the origin of the buffer of step s + 2
    const BlockPart mine = held(ra, p, origin, s), none = {0, 0};
    const int on = mine.n && continues(ra, p, origin, s);
    const BlockPart hop_in = continues(ra, p, prev, s) ? held(ra, p, prev, s) : none;
    float *buf = ra->chain[s % 3];
    return (Round){
        .hop = start_parts(ra, buf, on ? mine : none, ring_rank(ra, rank + 2),
                           ra->chain[(s + 2) % 3], hop_in, ring_rank(ra, rank - 2), sizeof(float)),
        .ret = start_parts(ra, buf, on ? none : mine, origin, ra->dkv_in, returned_part(ra, p, s),
                           ring_rank(ra, rank + s), sizeof(float))};
}

// Before the visit at step s, the rows of its part that the chain buffer does not hold yet
// (those the segment's earlier visits did not read) are zeroed.
static void zero_new_rows(RingAttention *ra, const AttnParams *p, int origin, int s) {
    const BlockPart in = held(ra, p, origin, s - 2), u = part_union(in, visit(ra, p, origin, s));
    float *buf = ra->chain[s % 3];
    if (!in.n) {
        if (u.n) zero(ra, buf + u.off, u.n * sizeof(float));
        return;
    }
    if (in.off > u.off) zero(ra, buf + u.off, (in.off - u.off) * sizeof(float));
    if (u.off + u.n > in.off + in.n)
        zero(ra, buf + in.off + in.n, (u.off + u.n - in.off - in.n) * sizeof(float));
}

// dK and dV of the local tokens into p->dk and p->dv (beside it in each row): the accumulator,
// plus the segment that came back after step s > 0, added on the way instead of by a pass of its
// own (s = 0: none). A part is whole rows of the (B, T, kvw) layout, so its rows take the sum and
// those around it the accumulator alone.
static void store_dkv(RingAttention *ra, const AttnParams *p, int s) {
    const BlockPart in = s > 0 ? returned_part(ra, p, s) : (BlockPart){0, 0};
    const size_t kvw = (size_t)ra->kvw, r0 = in.off / kvw, r1 = (in.off + in.n) / kvw;
    const float *ret = ra->dkv_in;
    store_rows(ra, p->dk, p->dk_st.row, ra->dkv_own, NULL, ra->kvw, 0, r0);
    store_rows(ra, p->dk, p->dk_st.row, ra->dkv_own, ret, ra->kvw, r0, r1 - r0);
    store_rows(ra, p->dk, p->dk_st.row, ra->dkv_own, NULL, ra->kvw, r1, (size_t)p->B * ra->T - r1);
}

// Whether the backward calls of a span kind can share its buffers (attention.h's dsum and
// dq_accum: the flash backward; the dQ accumulator not with the deterministic one).
static int share_dsum(const RingAttention *ra, const AttnParams *p) {
    AttnParams a = *p;
    a.dtype = ra->be->dtype;
    return p->impl == ATTN_IMPL_FLASH && !attn_runs_naive(&a, ra->be->device);
}

// Points the backward call a, of span kind k, at the kind's D (computed by its first call of
// the backward, read by the later ones) and, with dq, at its dQ accumulator (zeroed before the
// first call) in place of the fp32 dQ.
static void share_rows(RingAttention *ra, AttnParams *a, int k, int dq) {
    const int first = !(ra->kinds_used >> k & 1);
    a->dsum = ra->dsum[k];
    a->dsum_ready = !first;
    if (dq) {
        if (!ra->dq_acc[k]) {
            AttnParams largest = *a;
            largest.B = ra->B;
            ra->dq_acc[k] = ra->be->alloc(ra->be, attn_dq_accum_floats(&largest) * sizeof(float));
        }
        a->dq_accum = ra->dq_acc[k];
        if (first) zero(ra, ra->dq_acc[k], attn_dq_accum_floats(a) * sizeof(float));
    }
    ra->kinds_used |= 1 << k;
    ra->kind_call[k] = *a;
}

// dQ of the local tokens into p->dq: from the fp32 dQ, or with dq_shared from the kinds' dQ
// accumulators, straight into p->dq when the kind of all the local queries is the only one,
// else added into the fp32 dQ (their rows of it, in the calls' dq) and stored from there.
static void store_dq(RingAttention *ra, const AttnParams *p, int dq_shared) {
    Backend *be = ra->be;
    if (dq_shared && ra->kinds_used == 1 << KIND_ALL) {
        AttnParams a = ra->kind_call[KIND_ALL];
        a.dq = p->dq;
        a.dq_st = p->dq_st;
        a.accumulate = 0;
        backend_attention_dq_store(be, &a);
        timed(ra, RING_STORE);
        return;
    }
    if (dq_shared) {
        zero(ra, ra->out_acc, (size_t)p->B * ra->T * ra->qw * sizeof(float));
        for (int k = 0; k < N_KINDS; k++)
            if (ra->kinds_used >> k & 1) {
                backend_attention_dq_store(be, &ra->kind_call[k]);
                timed(ra, RING_STORE);
            }
    }
    store(ra, p->dq, p->dq_st.row, ra->out_acc, ra->qw, p->B);
}

// Backward: step 0 computes into the own accumulator, step s > 0 into chain[s % 3] (the buffer
// of step s - 2's visitor, received after its step, or zeroed where the segment starts), which
// then goes on to the next visitor or back to its origin. The exchanges after step s - 1 are
// waited for after step s (their buffers are used again after it), so each overlaps a step;
// the segment returned by them is added into the accumulator then, the last one by the store.
void ring_attention_backward(RingAttention *ra, const AttnParams *p) {
    check_layout(ra, p, 1);
    const int size = ra->link.size, rank = ra->link.rank;
    const size_t n = (size_t)p->B * ra->T * ra->kvw;
    const int shared = share_dsum(ra, p), dq_shared = shared && !p->deterministic;
    ra->kinds_used = 0;
    timed(ra, -1);
    pack_block(ra, p);
    zero(ra, ra->dkv_own, n * sizeof(float));
    if (!dq_shared) zero(ra, ra->out_acc, (size_t)p->B * ra->T * ra->qw * sizeof(float));
    int kv_x = NO_EXCHANGE;
    Round round = {NO_EXCHANGE, NO_EXCHANGE};  // the exchanges after the step before
    for (int s = 0; s < size; s++) {
        wait_exchange(ra, kv_x);
        kv_x = s + 1 < size ? start_step(ra, p, s + 1) : NO_EXCHANGE;
        const int origin = ring_rank(ra, rank - s);
        float *dkv = s == 0 ? ra->dkv_own : ra->chain[s % 3];
        if (s > 0) zero_new_rows(ra, p, origin, s);
        Span sp[4];
        const int n_sp = step_spans(ra, p, rank, origin, sp);
        for (int k = 0; k < n_sp; k++) {
            AttnParams a = span_params(ra, p, rank, origin, sp[k], step_block(ra, s), dkv);
            if (shared) share_rows(ra, &a, span_kind(sp[k]), dq_shared);
            attend(ra, &a, 1);
        }
        if (s > 0) {
            if (s > 1) {
                wait_exchange(ra, round.hop);
                wait_exchange(ra, round.ret);
                add_returned(ra, p, s - 1);
            }
            round = start_round(ra, p, s);
        }
    }
    // The exchanges after the last step: their returned segment is added by the store.
    wait_exchange(ra, round.hop);
    wait_exchange(ra, round.ret);
    store_dq(ra, p, dq_shared);
    store_dkv(ra, p, size - 1);
    timed_end(ra, 1);
}
