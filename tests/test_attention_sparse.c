// test_attention_sparse: block-sparse attention on the CPU reference (flash and naive) against a
// test-local float64 forward and backward over an explicit (B, T_q, T_k) mask, built here from
// each pattern's definition in attention.h (and the causal, window and document rules), for
// every pattern, odd lengths (ragged last blocks), causal and not, GQA, documents; plus the
// block list builders, their bad-input messages, attn_check's refusals, a full mask giving
// bitwise the dense result, and key blocks no list reads left unread (NaN there stays out).
//
// Tolerances: fp32 unit roundoff u = 2^-24. Forward: the flash error against float64 within
// 2x the naive fp32 error plus 8 u (test_attention_cpu.c's rule; the naive error itself within
// 4 sqrt(T_k) u + 8 u, a random walk over T_k terms). Gradients against float64: sums of
// products with a few u of norm-wise error, magnified ~10x where dP ~ D in P * (dP - D):
// 64 u, the bound test_attention_cpu.c measured and uses for flash vs naive.
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "attention/attention.h"
#include "common/rng.h"
#include "tests/attn_contiguous.h"
#include "tests/testlib.h"

#define U32 5.9604644775390625e-8  // 2^-24
#define FLOOR (8 * U32)
#define NAIVE_TOL(T_k) (4 * sqrt((double)(T_k)) * U32 + FLOOR)
#define GRAD_TOL (64 * U32)
#define BLK ATTN_SPARSE_BLOCK

typedef struct {
    int B, T_q, T_k, NH, NKV, HS, causal, window, docs;
    AttnSparseSpec spec;
} Case;

// One problem: contiguous (B, T, heads, HS) fp32 tensors, its block mask and document list.
typedef struct {
    Case c;
    size_t nq, nk, nl;
    float *q, *k, *v, *dout;
    float *out, *lse, *dq, *dk, *dv;
    int cu[64], n_docs;
    AttnBlockMask m;
} Problem;

static void fill(Rng *r, float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = rng_normal(r);
}

static int problem_make(Problem *pb, Case c, uint64_t seed) {
    memset(pb, 0, sizeof *pb);
    pb->c = c;
    pb->nq = (size_t)c.B * c.T_q * c.NH * c.HS;
    pb->nk = (size_t)c.B * c.T_k * c.NKV * c.HS;
    pb->nl = (size_t)c.B * c.NH * c.T_q;
    Rng r;
    rng_seed(&r, seed);
    float **bufs[] = {&pb->q, &pb->dout, &pb->out, &pb->dq};
    for (int i = 0; i < 4; i++) *bufs[i] = malloc(sizeof(float) * pb->nq);
    pb->k = malloc(sizeof(float) * pb->nk);
    pb->v = malloc(sizeof(float) * pb->nk);
    pb->dk = malloc(sizeof(float) * pb->nk);
    pb->dv = malloc(sizeof(float) * pb->nk);
    pb->lse = malloc(sizeof(float) * pb->nl);
    fill(&r, pb->q, pb->nq); fill(&r, pb->k, pb->nk); fill(&r, pb->v, pb->nk); fill(&r, pb->dout, pb->nq);
    // Documents (T_q == T_k): each row cut into three at fixed fractions.
    pb->cu[0] = 0;
    for (int b = 0; b < c.B; b++) {
        const int cuts[3] = {c.T_q / 3, (2 * c.T_q) / 3 + 1, c.T_q};
        for (int d = 0; d < 3; d++)
            if (cuts[d] > 0 && b * c.T_q + cuts[d] > pb->cu[pb->n_docs]) pb->cu[++pb->n_docs] = b * c.T_q + cuts[d];
    }
    if (c.spec.pattern == ATTN_SPARSE_NONE) return 0;  // the caller brings its own lists
    char err[256];
    const int rc = attn_block_mask_build(&pb->m, &c.spec, c.T_q, c.T_k, c.causal, err, sizeof err);
    EXPECT(rc == 0, "attn_block_mask_build refused a valid pattern: %s", err);
    return rc;
}

static void problem_free(Problem *pb) {
    free(pb->q); free(pb->k); free(pb->v); free(pb->dout);
    free(pb->out); free(pb->lse); free(pb->dq); free(pb->dk); free(pb->dv);
    attn_block_mask_free(&pb->m);
}

static AttnParams params_of(Problem *pb, AttnImpl impl, int sparse) {
    const Case *c = &pb->c;
    const AttnTensors t = {pb->q, pb->k, pb->v, pb->dout, pb->out, pb->dq, pb->dk, pb->dv, pb->lse};
    const AttnShape s = {c->B, c->T_q, c->T_k, c->NH, c->NKV, c->HS, c->causal, c->window};
    AttnParams p = attn_contiguous(&t, &s);
    p.cu_seqlens = c->docs ? pb->cu : NULL;
    p.n_docs = c->docs ? pb->n_docs : 0;
    p.dtype = DTYPE_F32;
    p.impl = impl;
    if (sparse) attn_set_block_mask(&p, &pb->m);
    return p;
}

// Forward and backward through the public checks; the outputs are NaN-poisoned first.
static int run(Problem *pb, AttnImpl impl, int sparse) {
    float *outs[] = {pb->out, pb->dq, pb->dk, pb->dv, pb->lse};
    size_t ns[] = {pb->nq, pb->nq, pb->nk, pb->nk, pb->nl};
    for (int i = 0; i < 5; i++)
        for (size_t e = 0; e < ns[i]; e++) outs[i][e] = NAN;
    AttnParams p = params_of(pb, impl, sparse);
    char err[256];
    if (attn_check(&p, DEVICE_CPU, 1, err, sizeof err) != 0) {
        EXPECT(0, "attn_check refused a valid sparse problem: %s", err);
        return -1;
    }
    return attn_forward_cpu(&p) || attn_backward_cpu(&p) ? -1 : 0;
}

// The pattern's blocks from attention.h's definitions (bigbird's random blocks excepted).
static int pattern_block(const Case *c, int qb, int kb) {
    const int64_t p0 = (int64_t)qb * BLK + c->T_k - c->T_q;
    const int diag = (int)floor((double)p0 / BLK);
    const AttnSparseSpec *s = &c->spec;
    if (abs(kb - diag) < s->band) return 1;
    if (s->pattern == ATTN_SPARSE_STRIDED) return kb % s->stride == s->stride - 1;
    return kb < s->global || diag < s->global;
}

static int doc_of(const Problem *pb, int g) {
    int d = 0;
    while (pb->cu[d + 1] <= g) d++;
    return d;
}

// The explicit mask: (b, i, j) visible under causal, window, documents and the block pattern.
// bigbird's random blocks come from the lists (their draw is the builder's; the builders' test
// checks those lists hold every local_global block besides at most `random` others), and so do
// a caller's own lists (pattern none).
static int explicit_visible(const Problem *pb, int b, int i, int j) {
    const Case *c = &pb->c;
    const int pos = i + c->T_k - c->T_q, qb = i / BLK, kb = j / BLK;
    if (c->causal && j > pos) return 0;
    if (c->window >= 0 && (j < pos - c->window || (!c->causal && j > pos + c->window))) return 0;
    if (c->docs && doc_of(pb, b * c->T_q + i) != doc_of(pb, b * c->T_k + j)) return 0;
    if (c->spec.pattern != ATTN_SPARSE_NONE && pattern_block(c, qb, kb)) return 1;
    if (c->spec.pattern == ATTN_SPARSE_LOCAL_GLOBAL || c->spec.pattern == ATTN_SPARSE_STRIDED) return 0;
    for (int e = pb->m.q_offsets[qb]; e < pb->m.q_offsets[qb + 1]; e++)
        if (pb->m.q_blocks[e] == kb) return 1;
    return 0;
}

typedef struct {
    double *out, *lse, *dq, *dk, *dv;
} Ref;

// Float64 forward and backward of the explicit mask: P = softmax(scale Q K^T) over the visible
// keys, dV = P^T dO, dS = P * (dO V^T - rowsum(P * dO V^T)), dQ = scale dS K, dK = scale dS^T Q.
static Ref reference(const Problem *pb) {
    const Case *c = &pb->c;
    const int HS = c->HS, G = c->NH / c->NKV;
    Ref r = {calloc(pb->nq, sizeof(double)), calloc(pb->nl, sizeof(double)), calloc(pb->nq, sizeof(double)),
             calloc(pb->nk, sizeof(double)), calloc(pb->nk, sizeof(double))};
    double *P = malloc(sizeof(double) * c->T_k), *dP = malloc(sizeof(double) * c->T_k);
    const double scale = 1.0 / sqrt((double)HS);
    for (int b = 0; b < c->B; b++)
        for (int h = 0; h < c->NH; h++)
            for (int i = 0; i < c->T_q; i++) {
                const size_t qi = (((size_t)b * c->T_q + i) * c->NH + h) * HS;
                double mx = -INFINITY;
                for (int j = 0; j < c->T_k; j++) {
                    P[j] = -INFINITY;
                    if (!explicit_visible(pb, b, i, j)) continue;
                    const size_t kj = (((size_t)b * c->T_k + j) * c->NKV + h / G) * HS;
                    double s = 0;
                    for (int d = 0; d < HS; d++) s += (double)pb->q[qi + d] * pb->k[kj + d];
                    P[j] = s * scale;
                    mx = P[j] > mx ? P[j] : mx;
                }
                double *lse = r.lse + ((size_t)b * c->NH + h) * c->T_q + i;
                if (mx == -INFINITY) {
                    *lse = INFINITY;
                    continue;
                }
                double sum = 0, D = 0;
                for (int j = 0; j < c->T_k; j++) sum += P[j] = exp(P[j] - mx);
                *lse = mx + log(sum);
                for (int j = 0; j < c->T_k; j++) {
                    P[j] /= sum;
                    dP[j] = 0;
                    if (P[j] == 0) continue;
                    const size_t vj = (((size_t)b * c->T_k + j) * c->NKV + h / G) * HS;
                    for (int d = 0; d < HS; d++) {
                        r.out[qi + d] += P[j] * pb->v[vj + d];
                        dP[j] += (double)pb->dout[qi + d] * pb->v[vj + d];
                        r.dv[vj + d] += P[j] * pb->dout[qi + d];
                    }
                    D += P[j] * dP[j];
                }
                for (int j = 0; j < c->T_k; j++) {
                    if (P[j] == 0) continue;
                    const double ds = P[j] * (dP[j] - D) * scale;
                    const size_t kj = (((size_t)b * c->T_k + j) * c->NKV + h / G) * HS;
                    for (int d = 0; d < HS; d++) {
                        r.dq[qi + d] += ds * pb->k[kj + d];
                        r.dk[kj + d] += ds * pb->q[qi + d];
                    }
                }
            }
    free(P); free(dP);
    return r;
}

static void ref_free(Ref *r) { free(r->out); free(r->lse); free(r->dq); free(r->dk); free(r->dv); }

// ||a - ref|| / ||ref||; infinities must match exactly, any other non-finite value is an error.
static double err(const float *a, const double *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(ref[i]) || !isfinite(a[i])) {
            if ((double)a[i] != ref[i]) return INFINITY;
            continue;
        }
        num += (a[i] - ref[i]) * (a[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

typedef struct {
    double out, lse, dq, dk, dv;
} Errs;

static Errs errs_of(const Problem *pb, const Ref *r) {
    return (Errs){err(pb->out, r->out, pb->nq), err(pb->lse, r->lse, pb->nl), err(pb->dq, r->dq, pb->nq),
                  err(pb->dk, r->dk, pb->nk), err(pb->dv, r->dv, pb->nk)};
}

static const char *PATTERN_NAMES[] = {"none", "local_global", "strided", "bigbird"};

static void check_case(Case c, uint64_t seed) {
    char name[200];
    snprintf(name, sizeof name, "%s band %d global %d stride %d random %d: B=%d T_q=%d T_k=%d NH=%d NKV=%d "
             "HS=%d causal=%d window=%d docs=%d", PATTERN_NAMES[c.spec.pattern], c.spec.band, c.spec.global,
             c.spec.stride, c.spec.random, c.B, c.T_q, c.T_k, c.NH, c.NKV, c.HS, c.causal, c.window, c.docs);
    Problem pb;
    if (problem_make(&pb, c, seed) != 0) return;
    Ref ref = reference(&pb);
    EXPECT(run(&pb, ATTN_IMPL_NAIVE, 1) == 0, "%s: naive run failed", name);
    const Errs n = errs_of(&pb, &ref);
    EXPECT(run(&pb, ATTN_IMPL_FLASH, 1) == 0, "%s: flash run failed", name);
    const Errs f = errs_of(&pb, &ref);
    const double ntol = NAIVE_TOL(c.T_k);
    EXPECT(n.out <= ntol && n.lse <= ntol, "%s: naive vs float64 out %.3g lse %.3g (tol %.3g)", name, n.out,
           n.lse, ntol);
    EXPECT(f.out <= 2 * n.out + FLOOR && f.lse <= 2 * n.lse + FLOOR,
           "%s: flash vs float64 out %.3g lse %.3g, over 2 x naive (%.3g, %.3g) + 8 u", name, f.out, f.lse,
           n.out, n.lse);
    EXPECT(f.dq <= GRAD_TOL && f.dk <= GRAD_TOL && f.dv <= GRAD_TOL,
           "%s: flash gradients vs float64 dq %.3g dk %.3g dv %.3g (tol %.3g)", name, f.dq, f.dk, f.dv, GRAD_TOL);
    EXPECT(n.dq <= GRAD_TOL && n.dk <= GRAD_TOL && n.dv <= GRAD_TOL,
           "%s: naive gradients vs float64 dq %.3g dk %.3g dv %.3g (tol %.3g)", name, n.dq, n.dk, n.dv, GRAD_TOL);
    if (getenv("ATTN_TEST_VERBOSE"))
        printf("  %s (density %.2f): out %.2e lse %.2e dq %.2e dk %.2e dv %.2e\n", name,
               attn_block_mask_density(&pb.m), f.out, f.lse, f.dq, f.dk, f.dv);
    ref_free(&ref);
    problem_free(&pb);
}

static AttnSparseSpec spec(AttnSparsePattern pat, int band, int global, int stride, int random) {
    return (AttnSparseSpec){pat, band, global, stride, random, 42};
}

static void test_patterns_vs_float64(void) {
    const AttnSparseSpec specs[] = {
        spec(ATTN_SPARSE_LOCAL_GLOBAL, 1, 1, 0, 0), spec(ATTN_SPARSE_LOCAL_GLOBAL, 2, 0, 0, 0),
        spec(ATTN_SPARSE_STRIDED, 1, 0, 2, 0),      spec(ATTN_SPARSE_STRIDED, 2, 0, 3, 0),
        spec(ATTN_SPARSE_BIGBIRD, 1, 1, 0, 2),      spec(ATTN_SPARSE_BIGBIRD, 1, 0, 0, 1),
    };
    // Odd lengths: ragged last blocks (T = 601 = 4 x 128 + 89), T_q != T_k both ways, one block.
    const Case shapes[] = {
        {1, 601, 601, 2, 2, 16, 1, -1, 0, {0}}, {2, 601, 601, 4, 2, 24, 0, -1, 0, {0}},
        {1, 300, 700, 2, 1, 8, 1, -1, 0, {0}},  {1, 700, 300, 2, 2, 8, 0, -1, 0, {0}},
        {1, 600, 600, 2, 1, 16, 1, 200, 0, {0}}, {2, 520, 520, 2, 2, 8, 1, -1, 1, {0}},
        {1, 97, 97, 3, 1, 8, 1, -1, 0, {0}},
    };
    for (size_t s = 0; s < sizeof specs / sizeof specs[0]; s++)
        for (size_t t = 0; t < sizeof shapes / sizeof shapes[0]; t++) {
            Case c = shapes[t];
            c.spec = specs[s];
            const int n_kb = (c.T_k + BLK - 1) / BLK, n_qb = (c.T_q + BLK - 1) / BLK;
            if (c.spec.global > n_qb || c.spec.stride > n_kb) continue;  // the same as a smaller one
            check_case(c, 1000 + 31 * s + t);
        }
}

// A mask holding every block reads the same tiles in the same order as dense: bitwise equal.
static void test_full_mask_is_dense(void) {
    const Case shapes[] = {{2, 333, 333, 4, 2, 16, 1, -1, 0, {0}}, {1, 200, 450, 2, 2, 8, 0, 100, 0, {0}}};
    for (int t = 0; t < 2; t++) {
        Case c = shapes[t];
        c.spec = spec(ATTN_SPARSE_LOCAL_GLOBAL, (c.T_k + BLK - 1) / BLK, 0, 0, 0);
        c.spec.band += (c.T_q + BLK - 1) / BLK - 1;  // wide enough both ways even with T_q != T_k
        if (c.spec.band > (c.T_k + BLK - 1) / BLK) c.spec.band = (c.T_k + BLK - 1) / BLK;
        c.spec.global = 1;
        Problem pb;
        if (problem_make(&pb, c, 7 + t) != 0) return;
        if (!c.causal)
            EXPECT(attn_block_mask_density(&pb.m) == 1.0, "shape %d: full mask density %g", t,
                   attn_block_mask_density(&pb.m));
        run(&pb, ATTN_IMPL_FLASH, 0);
        float *dense[5];
        float *outs[] = {pb.out, pb.lse, pb.dq, pb.dk, pb.dv};
        size_t ns[] = {pb.nq, pb.nl, pb.nq, pb.nk, pb.nk};
        for (int i = 0; i < 5; i++) {
            dense[i] = malloc(sizeof(float) * ns[i]);
            memcpy(dense[i], outs[i], sizeof(float) * ns[i]);
        }
        run(&pb, ATTN_IMPL_FLASH, 1);
        for (int i = 0; i < 5; i++) {
            EXPECT(memcmp(dense[i], outs[i], sizeof(float) * ns[i]) == 0, "shape %d: output %d differs from dense",
                   t, i);
            free(dense[i]);
        }
        problem_free(&pb);
    }
}

// Key block 1 is in no query block's list: its K and V are NaN, and neither the outputs nor the
// other gradients may see them; its dK and dV are 0. Query block 2 reads nothing: out 0, lse +inf.
static void test_unread_blocks(void) {
    const Case c = {1, 500, 500, 2, 1, 16, 0, -1, 0, {0}};
    const int offsets[5] = {0, 2, 4, 4, 6}, blocks[6] = {0, 2, 0, 3, 2, 3};
    Problem pb;
    problem_make(&pb, c, 5);
    char e[256];
    EXPECT(attn_block_mask_from_lists(&pb.m, c.T_q, c.T_k, offsets, blocks, e, sizeof e) == 0, "from_lists: %s", e);
    const size_t row = (size_t)c.NKV * c.HS;
    for (size_t i = BLK * row; i < 2 * BLK * row; i++) pb.k[i] = pb.v[i] = NAN;
    Ref ref = reference(&pb);
    EXPECT(run(&pb, ATTN_IMPL_FLASH, 1) == 0, "flash run failed");
    const Errs f = errs_of(&pb, &ref);
    EXPECT(f.out <= NAIVE_TOL(c.T_k) && f.dq <= GRAD_TOL && f.dk <= GRAD_TOL && f.dv <= GRAD_TOL && f.lse <= NAIVE_TOL(c.T_k),
           "own lists vs float64: out %.3g lse %.3g dq %.3g dk %.3g dv %.3g", f.out, f.lse, f.dq, f.dk, f.dv);
    int zero = 1;
    for (size_t i = BLK * row; i < 2 * BLK * row; i++) zero &= pb.dk[i] == 0 && pb.dv[i] == 0;
    EXPECT(zero, "dK, dV of an unread key block are not 0");
    int empty = 1;
    for (int h = 0; h < c.NH; h++)
        for (int i = 2 * BLK; i < 3 * BLK; i++) {
            empty &= isinf(pb.lse[(size_t)h * c.T_q + i]) && pb.lse[(size_t)h * c.T_q + i] > 0;
            for (int d = 0; d < c.HS; d++) empty &= pb.out[((size_t)i * c.NH + h) * c.HS + d] == 0;
        }
    EXPECT(empty, "a query block with an empty list: out must be 0 and lse +inf");
    ref_free(&ref);
    problem_free(&pb);
}

// The builders: the transposed lists are the transpose, causal leaves out blocks above the
// diagonal, bigbird holds local_global plus at most `random` blocks per row, drawn the same for
// the same seed.
static void test_builders(void) {
    char e[256];
    AttnBlockMask lg, bb, bb2;
    const AttnSparseSpec s_lg = spec(ATTN_SPARSE_LOCAL_GLOBAL, 2, 1, 0, 0), s_bb = spec(ATTN_SPARSE_BIGBIRD, 2, 1, 0, 3);
    const int T = 20 * BLK + 5;
    EXPECT(attn_block_mask_build(&lg, &s_lg, T, T, 1, e, sizeof e) == 0, "local_global: %s", e);
    EXPECT(attn_block_mask_build(&bb, &s_bb, T, T, 1, e, sizeof e) == 0, "bigbird: %s", e);
    EXPECT(attn_block_mask_build(&bb2, &s_bb, T, T, 1, e, sizeof e) == 0, "bigbird: %s", e);
    EXPECT(bb.nnz == bb2.nnz && memcmp(bb.q_blocks, bb2.q_blocks, sizeof(int) * bb.nnz) == 0,
           "bigbird differs between two builds with one seed");
    int transposed = 1, causal = 1, superset = 1;
    for (int qb = 0; qb < bb.n_qb; qb++) {
        int extra = 0;
        for (int e2 = bb.q_offsets[qb]; e2 < bb.q_offsets[qb + 1]; e2++) {
            const int kb = bb.q_blocks[e2];
            causal &= kb <= qb;
            int in_lg = 0, in_t = 0;
            for (int x = lg.q_offsets[qb]; x < lg.q_offsets[qb + 1]; x++) in_lg |= lg.q_blocks[x] == kb;
            for (int x = bb.k_offsets[kb]; x < bb.k_offsets[kb + 1]; x++) in_t |= bb.k_blocks[x] == qb;
            extra += !in_lg;
            transposed &= in_t;
        }
        superset &= extra <= 3 && bb.q_offsets[qb + 1] - bb.q_offsets[qb] - extra == lg.q_offsets[qb + 1] - lg.q_offsets[qb];
    }
    EXPECT(transposed && bb.k_offsets[bb.n_kb] == bb.nnz, "the transposed lists are not the transpose");
    EXPECT(causal, "causal lists hold a block above the diagonal");
    EXPECT(superset, "bigbird is not local_global plus at most 3 random blocks per row");
    EXPECT(attn_block_mask_density(&lg) < 0.5, "local_global density %g at 21 blocks", attn_block_mask_density(&lg));
    // Decoding position t (one query, t + 1 keys) reads the blocks of training's block t / 128.
    int same = 1;
    for (int t = 0; t < T; t += 97) {
        AttnBlockMask d;
        EXPECT(attn_block_mask_build(&d, &s_bb, 1, t + 1, 1, e, sizeof e) == 0, "decoding at %d: %s", t, e);
        const int qb = t / BLK, n = bb.q_offsets[qb + 1] - bb.q_offsets[qb];
        same &= d.nnz == n && memcmp(d.q_blocks, bb.q_blocks + bb.q_offsets[qb], sizeof(int) * n) == 0;
        attn_block_mask_free(&d);
    }
    EXPECT(same, "a decoding step reads other blocks than its query block in training");
    attn_block_mask_free(&lg); attn_block_mask_free(&bb); attn_block_mask_free(&bb2);
}

static void expect_refused(int rc, const char *e, const char *needle, const char *what) {
    EXPECT(rc != 0 && strstr(e, needle), "%s: expected a message with '%s', got rc %d '%s'", what, needle, rc, rc ? e : "");
}

static void test_bad_input(void) {
    char e[256] = "";
    AttnBlockMask m;
    const int T = 4 * BLK;
    AttnSparseSpec s = spec(ATTN_SPARSE_LOCAL_GLOBAL, 0, 0, 0, 0);
    expect_refused(attn_block_mask_build(&m, &s, T, T, 1, e, sizeof e), e, "band", "an empty band");
    s = spec(ATTN_SPARSE_BIGBIRD, 1, -1, 0, 1);
    expect_refused(attn_block_mask_build(&m, &s, T, T, 1, e, sizeof e), e, "global", "negative global blocks");
    s = spec(ATTN_SPARSE_STRIDED, 1, 0, 0, 0);
    expect_refused(attn_block_mask_build(&m, &s, T, T, 0, e, sizeof e), e, "stride", "stride 0");
    s = spec(ATTN_SPARSE_NONE, 1, 0, 0, 0);
    expect_refused(attn_block_mask_build(&m, &s, T, T, 0, e, sizeof e), e, "pattern", "pattern none");
    const int off[5] = {0, 2, 2, 2, 2}, unsorted[2] = {2, 1};
    expect_refused(attn_block_mask_from_lists(&m, T, T, off, unsorted, e, sizeof e), e, "ascending", "unsorted list");

    Problem pb;
    problem_make(&pb, (Case){1, T, T, 2, 2, 8, 1, -1, 0, spec(ATTN_SPARSE_LOCAL_GLOBAL, 1, 1, 0, 0)}, 3);
    AttnParams p = params_of(&pb, ATTN_IMPL_FLASH, 1);
    p.sparse_k_blocks = NULL;
    expect_refused(attn_check(&p, DEVICE_CPU, 1, e, sizeof e), e, "sparse_k_blocks", "backward without the transpose");
    EXPECT(attn_check(&p, DEVICE_CPU, 0, e, sizeof e) == 0, "forward needs no transpose: %s", e);
    p = params_of(&pb, ATTN_IMPL_FLASH, 1);
    int *k_blocks = malloc(sizeof(int) * pb.m.nnz);
    memcpy(k_blocks, pb.m.k_blocks, sizeof(int) * pb.m.nnz);
    k_blocks[pb.m.nnz - 1] ^= 1;
    p.sparse_k_blocks = k_blocks;
    expect_refused(attn_check(&p, DEVICE_CPU, 1, e, sizeof e), e, "transposed", "a wrong transpose");
    free(k_blocks);
    p = params_of(&pb, ATTN_IMPL_FLASH, 1);
    p.pos_explicit = 1;
    expect_refused(attn_check(&p, DEVICE_CPU, 1, e, sizeof e), e, "explicit", "sparse with explicit positions");
    p = params_of(&pb, ATTN_IMPL_NAIVE, 1);
    p.dtype = DTYPE_BF16;
    expect_refused(attn_check(&p, DEVICE_CUDA, 0, e, sizeof e), e, "naive", "sparse on the naive cuda path");
    problem_free(&pb);
}

int main(void) {
    TEST_CASE("block list builders: transpose, causal, bigbird", test_builders());
    TEST_CASE("block-sparse bad input is refused with a message", test_bad_input());
    TEST_CASE("every pattern vs float64 with the explicit mask (forward, dq, dk, dv)", test_patterns_vs_float64());
    TEST_CASE("a full block mask equals dense bitwise", test_full_mask_is_dense());
    TEST_CASE("unread key blocks are never loaded; empty lists give masked rows", test_unread_blocks());
    return TEST_SUMMARY();
}
