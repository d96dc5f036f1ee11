// The pieces of ring attention in one process: explicit chunk positions, the log-sum-exp merge
// (attn_merge_cpu) and accumulated backward over key chunks, against one attention call over all
// keys and a float64 oracle, over odd chunk lengths (7, 19, 37: no tile boundary lines up), in
// every order, with causal masks, sliding windows, ALiBi, GQA and a chunk wholly in the causal
// future (fully masked rows: lse +inf, merged as "nothing"). The backward over the chunks runs
// twice: each call on its own, and with the calls' per-query work shared (D computed by the first
// call, dQ summed in one accumulator and stored once: attention.h's dsum, dq_accum).
//
// Tolerance: the merged result is another fp32 rounding of the same sums, so its error against
// float64 must stay within a few times the single call's own error (4x, plus 8 ulps of 2^-24
// for results the single call gets nearly exact), both relative L2 over the whole tensor.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention/attention.h"
#include "common/check.h"
#include "common/rng.h"
#include "testlib.h"

enum { B = 2, NH = 4, NKV = 2, HS = 16, TQ = 23, TK = 63, NCHUNK = 3 };
static const int CHUNK[NCHUNK] = {7, 19, 37};  // key chunk lengths, summing to TK

typedef struct {
    const char *name;
    int q_pos0;     // position of the first query; keys sit at 0 .. TK-1
    int causal, window;
    int alibi;
} Case;

static float *randn(Rng *rng, size_t n) {
    float *x = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = rng_normal(rng);
    return x;
}

static int visible(const Case *c, int qp, int kp) {
    if (c->causal && kp > qp) return 0;
    if (c->window >= 0 && kp < qp - c->window) return 0;
    return 1;
}

// float64 oracle of out (B, TQ, NH, HS), lse (B, NH, TQ) and, with dout, dq, dk, dv.
static void oracle(const Case *c, const float *q, const float *k, const float *v, const float *dout,
                   const float *slopes, double *out, double *lse, double *dq, double *dk,
                   double *dv) {
    const double scale = 1.0 / sqrt((double)HS);
    memset(dk, 0, sizeof(double) * B * TK * NKV * HS);
    memset(dv, 0, sizeof(double) * B * TK * NKV * HS);
    double p[TK], dp[TK];
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < TQ; i++) {
                const int g = h / (NH / NKV), qp = c->q_pos0 + i;
                const float *qi = q + (((size_t)b * TQ + i) * NH + h) * HS;
                double mx = -INFINITY;
                for (int j = 0; j < TK; j++) {
                    const float *kj = k + (((size_t)b * TK + j) * NKV + g) * HS;
                    double s = 0;
                    for (int d = 0; d < HS; d++) s += (double)qi[d] * kj[d];
                    s *= scale;
                    if (c->alibi) s -= slopes[h] * fabs((double)(qp - j));
                    p[j] = visible(c, qp, j) ? s : -INFINITY;
                    if (p[j] > mx) mx = p[j];
                }
                double sum = 0;
                for (int j = 0; j < TK; j++) sum += p[j] = exp(p[j] - mx);
                lse[((size_t)b * NH + h) * TQ + i] = mx + log(sum);
                double *o = out + (((size_t)b * TQ + i) * NH + h) * HS;
                memset(o, 0, sizeof(double) * HS);
                for (int j = 0; j < TK; j++) {
                    p[j] /= sum;
                    const float *vj = v + (((size_t)b * TK + j) * NKV + g) * HS;
                    for (int d = 0; d < HS; d++) o[d] += p[j] * vj[d];
                }
                const float *doi = dout + (((size_t)b * TQ + i) * NH + h) * HS;
                double D = 0;
                for (int d = 0; d < HS; d++) D += (double)doi[d] * o[d];
                double *dqi = dq + (((size_t)b * TQ + i) * NH + h) * HS;
                memset(dqi, 0, sizeof(double) * HS);
                for (int j = 0; j < TK; j++) {
                    const float *vj = v + (((size_t)b * TK + j) * NKV + g) * HS;
                    const float *kj = k + (((size_t)b * TK + j) * NKV + g) * HS;
                    dp[j] = 0;
                    for (int d = 0; d < HS; d++) dp[j] += (double)doi[d] * vj[d];
                    const double ds = p[j] * (dp[j] - D) * scale;
                    double *dkj = dk + (((size_t)b * TK + j) * NKV + g) * HS;
                    double *dvj = dv + (((size_t)b * TK + j) * NKV + g) * HS;
                    for (int d = 0; d < HS; d++) {
                        dqi[d] += ds * kj[d];
                        dkj[d] += ds * qi[d];
                        dvj[d] += p[j] * doi[d];
                    }
                }
            }
}

static double rel_f64(const float *a, const double *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = (double)a[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1e-300));
}

// The problem of queries (B, TQ, NH, HS) against the keys [k0, k0 + n) of (B, TK, NKV, HS).
static AttnParams problem(const Case *c, const float *q, const float *k, const float *v, int k0,
                          int n, float *out, float *lse, const float *slopes) {
    AttnParams p;
    memset(&p, 0, sizeof p);
    p.q = q;
    p.k = k + (size_t)k0 * NKV * HS;
    p.v = v + (size_t)k0 * NKV * HS;
    p.out = out;
    p.lse = lse;
    p.q_st = p.o_st = (AttnStrides){(int64_t)TQ * NH * HS, NH * HS, HS};
    p.k_st = p.v_st = (AttnStrides){(int64_t)TK * NKV * HS, NKV * HS, HS};
    p.B = B;
    p.T_q = TQ;
    p.T_k = n;
    p.NH = NH;
    p.NKV = NKV;
    p.HS = HS;
    p.scale = 1.0f / sqrtf((float)HS);
    p.causal = c->causal;
    p.window_left = c->window;
    p.window_right = -1;
    p.alibi_slopes = c->alibi ? slopes : NULL;
    p.pos_explicit = 1;
    p.q_pos0 = c->q_pos0;
    p.k_pos0 = k0;
    p.dtype = DTYPE_F32;
    p.impl = ATTN_IMPL_FLASH;
    return p;
}

// The backward of chunk ch (keys [start[ch], start[ch] + CHUNK[ch])) from out and lse,
// accumulating into fp32 dq (B, TQ, NH, HS) and the chunk's rows of dk, dv (B, TK, NKV, HS).
static AttnParams chunk_backward(const Case *c, const float *q, const float *k, const float *v,
                                 const float *dout, const float *slopes, float *out, float *lse,
                                 const int *start, int ch, float *dq, float *dk, float *dv) {
    AttnParams p = problem(c, q, k, v, start[ch], CHUNK[ch], out, lse, slopes);
    p.dout = dout;
    p.dq = dq;
    p.dk = dk + (size_t)start[ch] * NKV * HS;
    p.dv = dv + (size_t)start[ch] * NKV * HS;
    p.do_st = p.dq_st = p.o_st;
    p.dk_st = p.dv_st = p.k_st;
    p.accumulate = 1;
    return p;
}

static void check(const AttnParams *p, int backward) {
    char err[512];
    if (attn_check(p, DEVICE_CPU, backward, err, sizeof err) != 0) fatal(EXIT_RUNTIME, "%s", err);
}

static void expect_close(const char *what, const Case *c, const char *order, double got,
                         double single) {
    const double bound = 4.0 * single + 8.0 * 0x1p-24;
    EXPECT(got <= bound, "%s, %s, chunk order %s: rel err %.3g vs float64 above %.3g (single call "
           "%.3g)", c->name, what, order, got, bound, single);
}

// The backward over the chunks in `order` again, the calls sharing D (the first computes it) and
// one dQ accumulator stored once at the end: dQ within the tolerance, dK and dV bitwise those of
// the calls on their own (they depend on D alone, which is the same floats). The
// store with accumulate adds into an fp32 dq: twice the stored dQ, exactly.
static void backward_shared(const Case *c, const char *order, const float *q, const float *k,
                            const float *v, const float *dout, const float *slopes, float *out,
                            float *lse, const int *chunks, const int *start, const float *dk,
                            const float *dv, const double *dq64, double e_dq) {
    const size_t nq = (size_t)B * TQ * NH * HS, nk = (size_t)B * TK * NKV * HS;
    float *dq2 = xmalloc(nq * sizeof(float)), *dk2 = xcalloc(nk, sizeof(float));
    float *dv2 = xcalloc(nk, sizeof(float)), *dsum = xmalloc((size_t)B * NH * TQ * sizeof(float));
    memset(dq2, 0xff, nq * sizeof(float));  // NaN: the calls leave dq alone, the store writes it
    AttnParams p;
    float *acc = NULL;
    for (int n = 0; n < NCHUNK; n++) {
        p = chunk_backward(c, q, k, v, dout, slopes, out, lse, start, chunks[n], dq2, dk2, dv2);
        if (!acc) acc = xcalloc(attn_dq_accum_floats(&p), sizeof(float));
        p.dsum = dsum;
        p.dsum_ready = n > 0;
        p.dq_accum = acc;
        check(&p, 1);
        attn_backward_cpu(&p);
    }
    p.accumulate = 0;
    check(&p, 1);
    attn_dq_accum_store_cpu(&p);
    expect_close("dq, shared", c, order, rel_f64(dq2, dq64, nq), e_dq);
    EXPECT(memcmp(dk2, dk, nk * sizeof(float)) == 0 && memcmp(dv2, dv, nk * sizeof(float)) == 0,
           "%s, order %s: dK/dV with D computed once differ from the calls' own", c->name, order);
    float *once = xmalloc(nq * sizeof(float));
    memcpy(once, dq2, nq * sizeof(float));
    p.accumulate = 1;
    attn_dq_accum_store_cpu(&p);
    int doubled = 1;
    for (size_t i = 0; i < nq; i++) doubled &= dq2[i] == 2.0f * once[i];
    EXPECT(doubled, "%s, order %s: the store with accumulate must add the dQ to dq", c->name, order);
    free(acc); free(once); free(dq2); free(dk2); free(dv2); free(dsum);
}

static void run_case(const Case *c) {
    Rng rng;
    rng_seed(&rng, 7 + (uint64_t)c->q_pos0);
    const size_t nq = (size_t)B * TQ * NH * HS, nk = (size_t)B * TK * NKV * HS, nl = (size_t)B * NH * TQ;
    float *q = randn(&rng, nq), *k = randn(&rng, nk), *v = randn(&rng, nk), *dout = randn(&rng, nq);
    float slopes[NH];
    for (int h = 0; h < NH; h++) slopes[h] = powf(2.0f, -8.0f * (float)(h + 1) / NH);
    double *o64 = xmalloc(nq * sizeof(double)), *l64 = xmalloc(nl * sizeof(double));
    double *dq64 = xmalloc(nq * sizeof(double)), *dk64 = xmalloc(nk * sizeof(double)),
           *dv64 = xmalloc(nk * sizeof(double));
    oracle(c, q, k, v, dout, slopes, o64, l64, dq64, dk64, dv64);

    // One call over all keys: the single-process reference.
    float *out1 = xmalloc(nq * sizeof(float)), *lse1 = xmalloc(nl * sizeof(float));
    float *dq1 = xmalloc(nq * sizeof(float)), *dk1 = xmalloc(nk * sizeof(float)),
          *dv1 = xmalloc(nk * sizeof(float));
    AttnParams one = problem(c, q, k, v, 0, TK, out1, lse1, slopes);
    check(&one, 0);
    attn_forward_cpu(&one);
    one.dout = dout;
    one.dq = dq1, one.dk = dk1, one.dv = dv1;
    one.do_st = one.dq_st = one.o_st;
    one.dk_st = one.dv_st = one.k_st;
    check(&one, 1);
    attn_backward_cpu(&one);
    const double e_out = rel_f64(out1, o64, nq), e_lse = rel_f64(lse1, l64, nl);
    const double e_dq = rel_f64(dq1, dq64, nq), e_dk = rel_f64(dk1, dk64, nk), e_dv = rel_f64(dv1, dv64, nk);

    // Every order of the three chunks: the first writes in place, the others merge in.
    static const int ORDERS[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
    int start[NCHUNK];
    for (int i = 0, s = 0; i < NCHUNK; s += CHUNK[i++]) start[i] = s;
    // The accumulator's lse with strides (head stride 2 TQ, batch stride 2 NH TQ): the layout
    // ring attention uses for one chunk of a rank's queries.
    float *acc_out = xmalloc(nq * sizeof(float)), *acc_lse = xmalloc(2 * nl * sizeof(float));
    float *part_out = xmalloc(nq * sizeof(float)), *part_lse = xmalloc(nl * sizeof(float));
    float *lse_dense = xmalloc(nl * sizeof(float));
    float *dq = xmalloc(nq * sizeof(float)), *dk = xmalloc(nk * sizeof(float)), *dv = xmalloc(nk * sizeof(float));
    for (int o = 0; o < 6; o++) {
        char order[16];
        snprintf(order, sizeof order, "%d%d%d", CHUNK[ORDERS[o][0]], CHUNK[ORDERS[o][1]], CHUNK[ORDERS[o][2]]);
        for (int n = 0; n < NCHUNK; n++) {
            const int ch = ORDERS[o][n];
            AttnParams p = problem(c, q, k, v, start[ch], CHUNK[ch], n ? part_out : acc_out,
                                   n ? part_lse : acc_lse + TQ, slopes);
            if (n == 0) {
                p.lse_head_stride = 2 * TQ;
                p.lse_batch_stride = 2 * NH * TQ;
            }
            check(&p, 0);
            attn_forward_cpu(&p);
            if (n == 0) continue;
            AttnParams acc = p;
            acc.out = acc_out;
            acc.lse = acc_lse + TQ;
            acc.lse_head_stride = 2 * TQ;
            acc.lse_batch_stride = 2 * NH * TQ;
            attn_merge_cpu(&acc, &p);
        }
        for (int b = 0; b < B; b++)
            for (int h = 0; h < NH; h++)
                memcpy(lse_dense + ((size_t)b * NH + h) * TQ,
                       acc_lse + ((size_t)b * NH + h) * 2 * TQ + TQ, TQ * sizeof(float));
        expect_close("out", c, order, rel_f64(acc_out, o64, nq), e_out);
        expect_close("lse", c, order, rel_f64(lse_dense, l64, nl), e_lse);

        // Backward per chunk from the merged out and lse: dQ accumulates over the chunks, each
        // chunk's dK and dV are its own rows.
        memset(dq, 0, nq * sizeof(float));
        memset(dk, 0xff, nk * sizeof(float));  // NaN: every row must be written...
        for (int ch = 0; ch < NCHUNK; ch++)     // ...after each chunk's rows start at 0
            for (int b = 0; b < B; b++) {
                memset(dk + ((size_t)b * TK + start[ch]) * NKV * HS, 0, sizeof(float) * CHUNK[ch] * NKV * HS);
            }
        memset(dv, 0, nk * sizeof(float));
        for (int n = 0; n < NCHUNK; n++) {
            AttnParams p = chunk_backward(c, q, k, v, dout, slopes, acc_out, lse_dense, start,
                                          ORDERS[o][n], dq, dk, dv);
            check(&p, 1);
            attn_backward_cpu(&p);
        }
        expect_close("dq", c, order, rel_f64(dq, dq64, nq), e_dq);
        expect_close("dk", c, order, rel_f64(dk, dk64, nk), e_dk);
        expect_close("dv", c, order, rel_f64(dv, dv64, nk), e_dv);
        backward_shared(c, order, q, k, v, dout, slopes, acc_out, lse_dense, ORDERS[o], start, dk,
                        dv, dq64, e_dq);
    }
    free(q); free(k); free(v); free(dout); free(o64); free(l64); free(dq64); free(dk64); free(dv64);
    free(out1); free(lse1); free(dq1); free(dk1); free(dv1); free(acc_out); free(acc_lse);
    free(part_out); free(part_lse); free(lse_dense); free(dq); free(dk); free(dv);
}

// A chunk with no visible key gives +inf lse and zero output, and merging it changes nothing.
static void test_masked_chunk_merges_as_nothing(void) {
    const Case c = {"future chunk", 0, 1, -1, 0};
    Rng rng;
    rng_seed(&rng, 3);
    const size_t nq = (size_t)B * TQ * NH * HS, nk = (size_t)B * TK * NKV * HS, nl = (size_t)B * NH * TQ;
    float *q = randn(&rng, nq), *k = randn(&rng, nk), *v = randn(&rng, nk);
    float *out = xmalloc(nq * sizeof(float)), *lse = xmalloc(nl * sizeof(float));
    float *pout = xmalloc(nq * sizeof(float)), *plse = xmalloc(nl * sizeof(float));
    float *copy = xmalloc(nq * sizeof(float));
    AttnParams a = problem(&c, q, k, v, 0, 23, out, lse, NULL);   // keys 0..22: the diagonal
    attn_forward_cpu(&a);
    AttnParams f = problem(&c, q, k, v, 40, 23, pout, plse, NULL);  // keys 40..62: all future
    check(&f, 0);
    attn_forward_cpu(&f);
    int all_inf = 1, all_zero = 1;
    for (size_t i = 0; i < nl; i++) all_inf &= plse[i] == INFINITY;
    for (size_t i = 0; i < nq; i++) all_zero &= pout[i] == 0.0f;
    EXPECT(all_inf && all_zero, "a wholly masked chunk must give lse +inf and output 0");
    memcpy(copy, out, nq * sizeof(float));
    attn_merge_cpu(&a, &f);
    EXPECT(memcmp(copy, out, nq * sizeof(float)) == 0, "merging a masked chunk changed the output");
    // And the other way round: an empty accumulator takes the part as it is.
    attn_merge_cpu(&f, &a);
    EXPECT(memcmp(pout, out, nq * sizeof(float)) == 0 && memcmp(plse, lse, nl * sizeof(float)) == 0,
           "merging into an empty accumulator must copy the part");
    free(q); free(k); free(v); free(out); free(lse); free(pout); free(plse); free(copy);
}

// What the naive backward cannot do (a sum over key chunks), and overlapping lse strides, are
// refused with a message; explicit positions are accepted on every path.
static void test_refusals(void) {
    const Case c = {"refusals", 30, 1, -1, 0};
    float x[4] __attribute__((aligned(16))) = {0};
    AttnParams p = problem(&c, x, x, x, 0, TK, x, x, NULL);
    char err[512];
    EXPECT(attn_check(&p, DEVICE_CUDA, 0, err, sizeof err) == 0,
           "cuda's fp32 (materialised) path takes explicit positions: %s", err);
    p.pos_explicit = 0;
    p.accumulate = 1;
    p.impl = ATTN_IMPL_NAIVE;
    p.T_k = TQ;
    p.dout = p.dq = p.dk = p.dv = x;
    EXPECT(attn_check(&p, DEVICE_CPU, 1, err, sizeof err) != 0 && strstr(err, "flash"),
           "the naive backward must refuse accumulate: %s", err);
    p.impl = ATTN_IMPL_FLASH;
    p.accumulate = 0;
    p.do_st = p.dq_st = p.o_st;
    p.dk_st = p.dv_st = p.k_st;
    p.dsum_ready = 1;
    EXPECT(attn_check(&p, DEVICE_CPU, 1, err, sizeof err) != 0 && strstr(err, "dsum"),
           "dsum_ready without dsum must be refused: %s", err);
    p.dsum = x;
    p.impl = ATTN_IMPL_NAIVE;
    EXPECT(attn_check(&p, DEVICE_CPU, 1, err, sizeof err) != 0 && strstr(err, "flash backward"),
           "the naive backward must refuse dsum: %s", err);
    p.impl = ATTN_IMPL_FLASH;
    EXPECT(attn_check(&p, DEVICE_CUDA, 1, err, sizeof err) != 0 && strstr(err, "bf16 or fp16"),
           "cuda's fp32 (materialised) backward must refuse dsum: %s", err);
    p.dq_accum = x + 1;  // 4 bytes past an aligned address
    p.dtype = DTYPE_BF16;
    EXPECT(attn_check(&p, DEVICE_CUDA, 1, err, sizeof err) != 0 && strstr(err, "16-byte"),
           "a misaligned dq_accum must be refused on cuda: %s", err);
    p.dtype = DTYPE_F32;
    p.deterministic = 1;
    EXPECT(attn_check(&p, DEVICE_CPU, 1, err, sizeof err) != 0 && strstr(err, "deterministic"),
           "dq_accum with the deterministic backward must be refused: %s", err);
    p.deterministic = 0;
    p.dq_accum = NULL;
    EXPECT(attn_check(&p, DEVICE_CPU, 1, err, sizeof err) == 0, "dsum alone is accepted: %s", err);
    AttnContext *ctx = attn_context_create(DEVICE_CPU, NULL, ATTN_KERNEL_AUTO, err, sizeof err);
    EXPECT(attn_dq_accum_store(ctx, &p, err, sizeof err) != 0 && strstr(err, "dq_accum"),
           "the store without dq_accum must be refused: %s", err);
    EXPECT(attn_backward_stream_k(ctx, &p) == 0, "the cpu has no stream-K backward");
    attn_context_destroy(ctx);
    p.dsum = NULL;
    p.dsum_ready = 0;
    p.lse_head_stride = TQ - 1;  // rows of lse overlap
    EXPECT(attn_check(&p, DEVICE_CPU, 0, err, sizeof err) != 0 && strstr(err, "lse strides"),
           "overlapping lse strides must be refused: %s", err);
}

int main(void) {
    static const Case CASES[] = {
        {"causal, queries at 40..62 (the last keys)", 40, 1, -1, 0},
        {"causal, queries at 20..42 (part of the keys in their future)", 20, 1, -1, 0},
        {"causal, window 11", 40, 1, 11, 0},
        {"causal, window 3 (chunks wholly outside)", 30, 1, 3, 0},
        {"causal, alibi", 40, 1, -1, 1},
        {"full (not causal), alibi, window 20", 25, 0, 20, 1},
    };
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) TEST_CASE(CASES[i].name, run_case(&CASES[i]));
    TEST_CASE("a wholly masked chunk merges as nothing", test_masked_chunk_merges_as_nothing());
    TEST_CASE("refusals", test_refusals());
    return TEST_SUMMARY();
}
