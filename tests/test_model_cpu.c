// test_model_cpu: the fp32 CPU backend op by op against double-precision references written
// here, and the whole GPT (model/gpt.c over that backend): gradients against finite differences
// of its loss, padded vocabulary, KV-cache decoding, gradient accumulation, smaller batches.
#include <math.h>
#include <omp.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "attention/philox.h"
#include "common/check.h"
#include "common/config.h"
#include "common/rng.h"
#include "data/synthetic.h"
#include "model/backend.h"
#include "model/gpt.h"
#include "testlib.h"

// fp32 against a double reference. A dot product of K terms accumulated in fp32 has a typical
// relative error of about sqrt(K) * 2^-24 (random rounding) and the worst sizes here have
// K <= 128, so ~7e-7; 1e-5 leaves a factor ~15 for the tanh/exp/sqrt of the element-wise parts
// (each correct to a few ulp) while a real bug (wrong index, missing term) gives O(1e-1).
#define OP_TOL 1e-5

static void fill_normal(Rng *r, float *x, size_t n, float std) {
    for (size_t i = 0; i < n; i++) x[i] = std * rng_normal(r);
}

static double max_abs_diff(const float *a, const double *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

// Relative error ||a - b|| / ||b|| of fp32 results against a double reference.
static double rel_err_d(const float *a, const double *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += b[i] * b[i];
    }
    return den == 0 ? sqrt(num) : sqrt(num / den);
}

static double gelu_d(double x) {
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

static double gelu_grad_d(double x) {
    double k = sqrt(2.0 / M_PI), t = tanh(k * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x);
}

// ---------------------------------------------------------------------------------------------
// ops

// Sizes below and above CPU_PAR_MIN elements (model/cpu/ops_cpu.h) run the serial and the threaded
// paths of each op.
static void test_embed(Backend *be, Rng *r, int B, int T, int C) {
    const int V = 11, maxT = T + 2;
    int tokens[B * T], pos[B * T];
    for (int i = 0; i < B * T; i++) {
        tokens[i] = (int)rng_below(r, 4);   // few distinct ids: the scatter must add repeats
        pos[i] = (int)rng_below(r, maxT);
    }
    float wte[V * C], wpe[maxT * C], out[B * T * C], dout[B * T * C];
    float dwte[V * C], dwpe[maxT * C];
    double ref[B * T * C], dwte_ref[V * C], dwpe_ref[maxT * C];
    fill_normal(r, wte, V * C, 1.0f);
    fill_normal(r, wpe, maxT * C, 1.0f);
    fill_normal(r, dout, B * T * C, 1.0f);
    fill_normal(r, dwte, V * C, 1.0f);   // gradients accumulate onto what is there
    fill_normal(r, dwpe, maxT * C, 1.0f);
    for (int with_pos = 0; with_pos < 2; with_pos++) {
        const int *pp = with_pos ? pos : NULL;
        for (int i = 0; i < B * T; i++)
            for (int c = 0; c < C; c++)
                ref[i * C + c] = wte[tokens[i] * C + c] + wpe[(pp ? pp[i] : i % T) * C + c];  // fp32 sum
        be->embed_forward(be, out, tokens, pp, wte, wpe, B, T, C);
        EXPECT(max_abs_diff(out, ref, B * T * C) == 0, "embed forward (pos %d) differs", with_pos);

        for (int i = 0; i < V * C; i++) dwte_ref[i] = dwte[i];
        for (int i = 0; i < maxT * C; i++) dwpe_ref[i] = dwpe[i];
        for (int i = 0; i < B * T; i++)
            for (int c = 0; c < C; c++) {
                dwte_ref[tokens[i] * C + c] += dout[i * C + c];
                dwpe_ref[(pp ? pp[i] : i % T) * C + c] += dout[i * C + c];
            }
        be->embed_backward(be, dwte, dwpe, dout, tokens, pp, B, T, C, V, maxT);
        EXPECT(rel_err_d(dwte, dwte_ref, V * C) < OP_TOL, "dwte rel err %g",
               rel_err_d(dwte, dwte_ref, V * C));
        EXPECT(rel_err_d(dwpe, dwpe_ref, maxT * C) < OP_TOL, "dwpe rel err %g",
               rel_err_d(dwpe, dwpe_ref, maxT * C));
    }
    // No position table (ALiBi): the token embedding alone.
    be->embed_forward(be, out, tokens, NULL, wte, NULL, B, T, C);
    int same = 1;
    for (int i = 0; i < B * T; i++)
        same &= memcmp(out + i * C, wte + tokens[i] * C, C * sizeof(float)) == 0;
    EXPECT(same, "embed forward without wpe must copy the token rows");
}

static void test_layernorm(Backend *be, Rng *r, int N, int C) {
    float inp[N * C], w[C], b[C], out[N * C], mean[N], rstd[N], dout[N * C], dinp[N * C], dw[C], db[C];
    double out_ref[N * C], mean_ref[N], rstd_ref[N], dinp_ref[N * C], dw_ref[C], db_ref[C];
    fill_normal(r, inp, N * C, 2.0f);
    for (int i = 0; i < N * C; i++) inp[i] += 3.0f;   // a mean far from 0 tests the centring
    fill_normal(r, w, C, 1.0f);
    fill_normal(r, b, C, 1.0f);
    fill_normal(r, dout, N * C, 1.0f);
    fill_normal(r, dinp, N * C, 1.0f);
    fill_normal(r, dw, C, 1.0f);
    fill_normal(r, db, C, 1.0f);
    for (int i = 0; i < N * C; i++) dinp_ref[i] = dinp[i];
    for (int c = 0; c < C; c++) dw_ref[c] = dw[c], db_ref[c] = db[c];
    for (int i = 0; i < N; i++) {
        const float *x = inp + i * C;
        double m = 0, v = 0;
        for (int c = 0; c < C; c++) m += x[c];
        m /= C;
        for (int c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
        double s = 1.0 / sqrt(v / C + 1e-5);
        mean_ref[i] = m;
        rstd_ref[i] = s;
        double dn_mean = 0, dn_n_mean = 0;
        for (int c = 0; c < C; c++) {
            double n = (x[c] - m) * s;
            out_ref[i * C + c] = n * w[c] + b[c];
            dn_mean += dout[i * C + c] * w[c] / C;
            dn_n_mean += dout[i * C + c] * w[c] * n / C;
            dw_ref[c] += dout[i * C + c] * n;
            db_ref[c] += dout[i * C + c];
        }
        for (int c = 0; c < C; c++) {
            double n = (x[c] - m) * s;
            dinp_ref[i * C + c] += s * (dout[i * C + c] * w[c] - dn_mean - n * dn_n_mean);
        }
    }
    be->layernorm_forward(be, out, mean, rstd, inp, w, b, N, C);
    EXPECT(rel_err_d(out, out_ref, N * C) < OP_TOL, "ln out rel err %g", rel_err_d(out, out_ref, N * C));
    EXPECT(rel_err_d(mean, mean_ref, N) < OP_TOL, "ln mean rel err %g", rel_err_d(mean, mean_ref, N));
    EXPECT(rel_err_d(rstd, rstd_ref, N) < OP_TOL, "ln rstd rel err %g", rel_err_d(rstd, rstd_ref, N));
    float dcopy[N * C];
    be->layernorm_backward(be, dinp, dcopy, dw, db, dout, inp, w, mean, rstd, N, C, NULL);
    EXPECT(rel_err_d(dinp, dinp_ref, N * C) < OP_TOL, "ln dinp rel err %g", rel_err_d(dinp, dinp_ref, N * C));
    EXPECT(memcmp(dcopy, dinp, sizeof dcopy) == 0, "ln dcopy holds exactly the new dinp");
    // The fused residual add: res = inp + dout (in place of a copy of inp), then the same
    // LayerNorm of res, bit for bit.
    float res[N * C], sum[N * C], out2[N * C], mean2[N], rstd2[N];
    memcpy(res, inp, sizeof res);
    be->add(be, sum, inp, dout, (size_t)N * C, NULL);
    be->layernorm_forward(be, out, mean, rstd, sum, w, b, N, C);
    be->add_layernorm_forward(be, res, out2, mean2, rstd2, res, dout, w, b, N, C, NULL);
    EXPECT(memcmp(res, sum, sizeof res) == 0, "add+ln res is the add");
    EXPECT(memcmp(out2, out, sizeof out) == 0 && memcmp(mean2, mean, sizeof mean) == 0 &&
               memcmp(rstd2, rstd, sizeof rstd) == 0,
           "add+ln out, mean and rstd are the LayerNorm of the sum");
    EXPECT(rel_err_d(dw, dw_ref, C) < OP_TOL, "ln dw rel err %g", rel_err_d(dw, dw_ref, C));
    EXPECT(rel_err_d(db, db_ref, C) < OP_TOL, "ln db rel err %g", rel_err_d(db, db_ref, C));
}

static void test_matmul(Backend *be, Rng *r, Epilogue epi, int with_bias, int N, int C, int OC) {
    float inp[N * C], w[OC * C], bias[OC], out[N * OC], pre[N * OC], dout[N * OC];
    float dinp[N * C], dw[OC * C], db[OC];
    double out_ref[N * OC], pre_ref[N * OC], dpre[N * OC], dinp_ref[N * C], dw_ref[OC * C], db_ref[OC];
    fill_normal(r, inp, N * C, 1.0f);
    fill_normal(r, w, OC * C, 0.3f);
    fill_normal(r, bias, OC, 1.0f);
    fill_normal(r, dout, N * OC, 1.0f);
    fill_normal(r, dinp, N * C, 1.0f);   // overwritten by the op
    fill_normal(r, dw, OC * C, 1.0f);    // accumulated
    fill_normal(r, db, OC, 1.0f);
    for (int i = 0; i < OC * C; i++) dw_ref[i] = dw[i];
    for (int j = 0; j < OC; j++) db_ref[j] = db[j];
    for (int i = 0; i < N; i++)
        for (int j = 0; j < OC; j++) {
            double a = with_bias ? bias[j] : 0.0;
            for (int c = 0; c < C; c++) a += (double)inp[i * C + c] * w[j * C + c];
            pre_ref[i * OC + j] = a;
            out_ref[i * OC + j] = epi == EPI_GELU ? gelu_d(a) : a;
            dpre[i * OC + j] = dout[i * OC + j] * (epi == EPI_GELU ? gelu_grad_d(a) : 1.0);
        }
    for (int i = 0; i < N; i++)
        for (int c = 0; c < C; c++) {
            double a = 0;
            for (int j = 0; j < OC; j++) a += dpre[i * OC + j] * w[j * C + c];
            dinp_ref[i * C + c] = a;
        }
    for (int j = 0; j < OC; j++) {
        for (int c = 0; c < C; c++)
            for (int i = 0; i < N; i++) dw_ref[j * C + c] += dpre[i * OC + j] * inp[i * C + c];
        for (int i = 0; i < N; i++) db_ref[j] += dpre[i * OC + j];
    }
    const float *bp = with_bias ? bias : NULL;
    float *pp = epi == EPI_GELU ? pre : NULL;
    be->matmul_forward(be, out, pp, inp, w, bp, N, C, OC, epi);
    EXPECT(rel_err_d(out, out_ref, N * OC) < OP_TOL, "matmul out (epi %d, bias %d) rel err %g", epi,
           with_bias, rel_err_d(out, out_ref, N * OC));
    if (pp)
        EXPECT(rel_err_d(pre, pre_ref, N * OC) < OP_TOL, "matmul pre rel err %g",
               rel_err_d(pre, pre_ref, N * OC));
    be->matmul_backward(be, dinp, dw, with_bias ? db : NULL, dout, pp, inp, w, N, C, OC, epi);
    EXPECT(rel_err_d(dinp, dinp_ref, N * C) < OP_TOL, "matmul dinp (epi %d) rel err %g", epi,
           rel_err_d(dinp, dinp_ref, N * C));
    EXPECT(rel_err_d(dw, dw_ref, OC * C) < OP_TOL, "matmul dw (epi %d) rel err %g", epi,
           rel_err_d(dw, dw_ref, OC * C));
    if (with_bias)
        EXPECT(rel_err_d(db, db_ref, OC) < OP_TOL, "matmul db rel err %g", rel_err_d(db, db_ref, OC));
    // dinp = NULL: only the weight gradients (the first layer's input needs no gradient).
    for (int i = 0; i < OC * C; i++) dw[i] = 0;
    fill_normal(r, dout, N * OC, 1.0f);
    be->matmul_backward(be, NULL, dw, NULL, dout, NULL, inp, w, N, C, OC, EPI_NONE);
    double dw1 = 0;
    for (int i = 0; i < N; i++) dw1 += (double)dout[i * OC + 3] * inp[i * C + 5];
    EXPECT(fabs(dw[3 * C + 5] - dw1) < OP_TOL * (1 + fabs(dw1)), "matmul dw without dinp %g vs %g",
           dw[3 * C + 5], dw1);
}

static void test_add(Backend *be, Rng *r, int n) {
    float a[n], b[n], out[n];
    double ref[n];
    fill_normal(r, a, n, 1.0f);
    fill_normal(r, b, n, 1.0f);
    for (int i = 0; i < n; i++) ref[i] = (double)a[i] + b[i];
    be->add(be, out, a, b, n, NULL);
    EXPECT(max_abs_diff(out, ref, n) < 1e-6, "add differs");
    be->add(be, a, a, b, n, NULL);   // in place
    EXPECT(max_abs_diff(a, ref, n) < 1e-6, "in-place add differs");
}

// The dropout mask inside the ops that take a DropMask is the dropout op's, bit for bit: add
// (out = a + dropout(b), b left alone; in place), add_layernorm_forward (res = a + dropout(b),
// then the LayerNorm of res) and layernorm_backward's copy (dcopy = dropout(new dinp), dinp
// itself undropped); p = 0 and a NULL mask apply nothing. The offset's device part is a host
// value here (the CPU backend reads it directly).
static void test_fused_dropout(Backend *be, Rng *r, int N, int C, float p) {
    const size_t n = (size_t)N * C;
    const uint64_t part = 5;
    const DropMask d = {p, 99, ((uint64_t)1 << 32) + 7, &part};
    float a[n], b[n], b0[n], dropped[n], want[n], got[n], w[C], bias[C];
    float out[n], out2[n], mean[N], mean2[N], rstd[N], rstd2[N];
    fill_normal(r, a, n, 1.0f);
    fill_normal(r, b, n, 1.0f);
    fill_normal(r, w, C, 1.0f);
    fill_normal(r, bias, C, 1.0f);
    memcpy(b0, b, sizeof b);
    memcpy(dropped, b, sizeof b);
    be->dropout(be, dropped, n, &d);
    be->add(be, want, a, dropped, n, NULL);
    be->add(be, got, a, b, n, &d);
    EXPECT(memcmp(got, want, sizeof got) == 0, "N %d C %d p %g: add with b's mask is dropout, then add", N, C, p);
    EXPECT(memcmp(b, b0, sizeof b) == 0, "add with a mask leaves b alone");
    memcpy(got, a, sizeof got);
    be->add(be, got, got, b, n, &d);
    EXPECT(memcmp(got, want, sizeof got) == 0, "add with b's mask in place of a");
    const DropMask off = {0.0f, d.seed, d.offset, d.offset_dev};
    be->add(be, got, a, b, n, &off);
    be->add(be, want, a, b, n, NULL);
    EXPECT(memcmp(got, want, sizeof got) == 0, "add with p = 0 is the plain add");

    float res[n], sum[n];
    be->add(be, sum, a, dropped, n, NULL);
    be->layernorm_forward(be, out, mean, rstd, sum, w, bias, N, C);
    be->add_layernorm_forward(be, res, out2, mean2, rstd2, a, b, w, bias, N, C, &d);
    EXPECT(memcmp(res, sum, sizeof res) == 0 && memcmp(out2, out, sizeof out) == 0 &&
               memcmp(mean2, mean, sizeof mean) == 0 && memcmp(rstd2, rstd, sizeof rstd) == 0,
           "N %d C %d p %g: add+ln with b's mask is dropout, add, LayerNorm", N, C, p);
    EXPECT(memcmp(b, b0, sizeof b) == 0, "add+ln with a mask leaves b alone");

    float dinp[n], dinp2[n], dcopy[n], dw[C], db[C], dw2[C], db2[C];
    fill_normal(r, dinp, n, 1.0f);
    memcpy(dinp2, dinp, sizeof dinp);
    memset(dw, 0, sizeof dw), memset(db, 0, sizeof db), memset(dw2, 0, sizeof dw2), memset(db2, 0, sizeof db2);
    be->layernorm_backward(be, dinp, NULL, dw, db, b, a, w, mean, rstd, N, C, NULL);
    be->layernorm_backward(be, dinp2, dcopy, dw2, db2, b, a, w, mean, rstd, N, C, &d);
    EXPECT(memcmp(dinp2, dinp, sizeof dinp) == 0 && memcmp(dw2, dw, sizeof dw) == 0 &&
               memcmp(db2, db, sizeof db) == 0,
           "ln backward with a mask on dcopy: dinp, dw, db as without");
    memcpy(want, dinp, sizeof want);
    be->dropout(be, want, n, &d);
    EXPECT(memcmp(dcopy, want, sizeof dcopy) == 0, "N %d C %d p %g: ln backward's dcopy is dropout(new dinp)", N, C, p);
}

// Dropout keeps element i iff attn_philox_keep(seed, offset, i, p), scaling it by one fp32
// multiply by attn_dropout_scale(p) (so kept values are exact); the same call on a gradient is
// the backward. The rate is p to the nearest 1/256 (t = round(256 p) of 256 bytes drop).
// Statistics: the keep count of n independent draws is binomial, standard deviation
// sqrt(n p' (1-p')) with p' = t / 256; two independent masks disagree on a fraction q = 2p'(1-p'),
// standard deviation sqrt(n q (1-q)). 5 sigma bounds fail by chance with probability < 1e-6, while
// a wrong threshold, a byte of the Philox block reused or a mask that ignores the offset moves
// the counts by far more at these n.
static void test_dropout_op(Backend *be, Rng *r, int n, float p) {
    const uint64_t seed = 1337, offset = ((uint64_t)3 << 32) + 17;   // offset's high word used
    const float scale = attn_dropout_scale(p);
    const double pr = attn_dropout_threshold(p) / 256.0;  // the rate used
    EXPECT(fabs(pr - p) <= 1.0 / 512, "p %g runs as %g, not to the nearest 1/256", p, pr);
    float *x0 = xmalloc((size_t)n * sizeof(float)), *x = xmalloc((size_t)n * sizeof(float));  // (n)
    float *g0 = xmalloc((size_t)n * sizeof(float)), *g = xmalloc((size_t)n * sizeof(float));  // (n)
    float *y = xmalloc((size_t)n * sizeof(float));  // (n)
    fill_normal(r, x0, n, 1.0f);
    fill_normal(r, g0, n, 1.0f);
    memcpy(x, x0, (size_t)n * sizeof(float));
    be->dropout(be, x, n, &(DropMask){p, seed, offset, NULL});
    long kept = 0;
    int mask_ok = 1, value_ok = 1;
    for (int i = 0; i < n; i++) {
        const int keep = attn_philox_keep(seed, offset, (uint64_t)i, p);
        kept += keep;
        mask_ok &= (x[i] != 0.0f) == keep;
        value_ok &= x[i] == (keep ? x0[i] * scale : 0.0f);
    }
    EXPECT(mask_ok, "n %d p %g: keep decisions differ from attn_philox_keep", n, p);
    EXPECT(value_ok, "n %d p %g: kept values must be x * attn_dropout_scale(p), dropped ones 0", n, p);
    const double mean = n * (1.0 - pr), sd = sqrt(n * pr * (1.0 - pr));
    EXPECT(fabs(kept - mean) <= 5.0 * sd, "n %d p %g: kept %ld, expected %.0f +- %.0f", n, p, kept,
           mean, 5.0 * sd);

    // Backward: a gradient through the same (p, seed, offset) is masked and scaled the same way.
    memcpy(g, g0, (size_t)n * sizeof(float));
    be->dropout(be, g, n, &(DropMask){p, seed, offset, NULL});
    int grad_ok = 1;
    for (int i = 0; i < n; i++) grad_ok &= g[i] == (x[i] != 0.0f ? g0[i] * scale : 0.0f);
    EXPECT(grad_ok, "n %d p %g: the gradient must go through the forward's mask", n, p);

    // Another offset, then another seed: independent masks.
    for (int k = 0; k < 2; k++) {
        memcpy(y, x0, (size_t)n * sizeof(float));
        be->dropout(be, y, n, &(DropMask){p, seed + (uint64_t)k, offset + (uint64_t)(1 - k), NULL});
        long differ = 0;
        for (int i = 0; i < n; i++) differ += (y[i] != 0.0f) != (x[i] != 0.0f);
        const double q = 2.0 * pr * (1.0 - pr), dm = n * q, dsd = sqrt(n * q * (1.0 - q));
        EXPECT(fabs(differ - dm) <= 5.0 * dsd, "n %d p %g: another %s disagrees on %ld, expected "
               "%.0f +- %.0f", n, p, k ? "seed" : "offset", differ, dm, 5.0 * dsd);
    }

    // Independent of the thread count: one thread gives bitwise the same result.
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    memcpy(y, x0, (size_t)n * sizeof(float));
    be->dropout(be, y, n, &(DropMask){p, seed, offset, NULL});
    omp_set_num_threads(threads);
    EXPECT(memcmp(x, y, (size_t)n * sizeof(float)) == 0, "n %d p %g: 1 thread differs from %d",
           n, p, threads);

    // An offset split into a host part and a part in backend memory (written by set_u64) draws
    // the mask of their sum modulo 2^64.
    uint64_t *part = be->alloc(be, sizeof(uint64_t));
    be->set_u64(be, part, offset + 5);
    memcpy(y, x0, (size_t)n * sizeof(float));
    be->dropout(be, y, n, &(DropMask){p, seed, (uint64_t)-5, part});
    be->release(be, part);
    EXPECT(memcmp(x, y, (size_t)n * sizeof(float)) == 0,
           "n %d p %g: the offset split with offset_dev draws another mask", n, p);

    // p = 0 is the identity.
    memcpy(y, x0, (size_t)n * sizeof(float));
    be->dropout(be, y, n, &(DropMask){0.0f, seed, offset, NULL});
    EXPECT(memcmp(x0, y, (size_t)n * sizeof(float)) == 0, "p = 0 must not change x");
    free(x0), free(x), free(g0), free(g), free(y);
}

static void test_softmax_xent(Backend *be, Rng *r, int N) {
    enum { V = 101, Vp = 128 };
    float logits[N * Vp], losses[N], loss_before[N];
    double loss_ref[N], dref[N * Vp];
    int targets[N];
    fill_normal(r, logits, N * Vp, 3.0f);
    for (int i = 0; i < N; i++) {
        for (int j = V; j < Vp; j++) logits[i * Vp + j] = 1e4f;   // padded columns must never win
        targets[i] = i % 4 == 1 ? -1 : (int)rng_below(r, V);
    }
    targets[N - 1] = V - 1;   // the last real column
    const float dscale = 0.37f;
    for (int i = 0; i < N; i++) {
        const float *z = logits + i * Vp;
        double mx = -INFINITY, s = 0;
        for (int j = 0; j < V; j++) mx = fmax(mx, z[j]);
        for (int j = 0; j < V; j++) s += exp(z[j] - mx);
        double lse = mx + log(s);
        loss_ref[i] = targets[i] < 0 ? 0.0 : lse - z[targets[i]];
        for (int j = 0; j < Vp; j++)
            dref[i * Vp + j] = targets[i] < 0 || j >= V
                                   ? 0.0
                                   : dscale * (exp(z[j] - lse) - (j == targets[i] ? 1.0 : 0.0));
    }
    float lse[N];
    be->softmax_xent(be, logits, losses, lse, targets, N, V, Vp, 0.0f);
    EXPECT(rel_err_d(losses, loss_ref, N) < OP_TOL, "xent losses rel err %g", rel_err_d(losses, loss_ref, N));
    EXPECT(logits[Vp] != 0.0f && logits[V] == 1e4f, "dscale 0 must leave the logits alone");
    memcpy(loss_before, losses, sizeof losses);
    be->softmax_xent(be, logits, losses, lse, targets, N, V, Vp, dscale);
    EXPECT(memcmp(losses, loss_before, sizeof losses) == 0, "the gradient call leaves losses alone");
    // Gradients are O(dscale / V) for most columns: compare absolutely at the fp32 precision of
    // a probability (2^-24 relative, times a few for exp) scaled by dscale.
    EXPECT(max_abs_diff(logits, dref, N * Vp) < 1e-6, "xent dlogits max diff %g",
           max_abs_diff(logits, dref, N * Vp));
    int zero = 1;
    for (int i = 0; i < N; i++)
        for (int j = 0; j < Vp; j++)
            if ((targets[i] < 0 || j >= V) && logits[i * Vp + j] != 0.0f) zero = 0;
    EXPECT(zero, "padded columns and ignored rows must get exactly zero gradient");
}

// Attention through the backend on the model's fused qkv layout (GQA, causal, T_q == T_k),
// against a double reference of softmax(q k^T * scale) v and its backward.
static void test_attention(Backend *be, Rng *r) {
    enum { B = 2, T = 11, NH = 4, NKV = 2, HS = 8, OC = (NH + 2 * NKV) * HS, C = NH * HS };
    float qkv[B * T * OC], out[B * T * C], lse[B * NH * T], dout[B * T * C], dqkv[B * T * OC];
    double out_ref[B * T * C], lse_ref[B * NH * T], dqkv_ref[B * T * OC];
    fill_normal(r, qkv, B * T * OC, 1.0f);
    fill_normal(r, dout, B * T * C, 1.0f);
    memset(dqkv_ref, 0, sizeof dqkv_ref);
    const double scale = 1.0 / sqrt((double)HS);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            int hk = h / (NH / NKV);
            for (int i = 0; i < T; i++) {
                const float *q = qkv + (b * T + i) * OC + h * HS;
                const float *dO = dout + (b * T + i) * C + h * HS;
                double s[T], P[T], dP[T], mx = -INFINITY, sum = 0, D = 0;
                for (int j = 0; j <= i; j++) {
                    const float *k = qkv + (b * T + j) * OC + (NH + hk) * HS;
                    double d = 0;
                    for (int c = 0; c < HS; c++) d += (double)q[c] * k[c];
                    s[j] = d * scale;
                    mx = fmax(mx, s[j]);
                }
                for (int j = 0; j <= i; j++) sum += exp(s[j] - mx);
                lse_ref[(b * NH + h) * T + i] = mx + log(sum);
                for (int c = 0; c < HS; c++) out_ref[(b * T + i) * C + h * HS + c] = 0;
                for (int j = 0; j <= i; j++) {
                    const float *v = qkv + (b * T + j) * OC + (NH + NKV + hk) * HS;
                    P[j] = exp(s[j] - mx) / sum;
                    dP[j] = 0;
                    for (int c = 0; c < HS; c++) {
                        out_ref[(b * T + i) * C + h * HS + c] += P[j] * v[c];
                        dP[j] += (double)dO[c] * v[c];
                        dqkv_ref[(b * T + j) * OC + (NH + NKV + hk) * HS + c] += P[j] * dO[c];
                    }
                    D += P[j] * dP[j];
                }
                for (int j = 0; j <= i; j++) {
                    double ds = P[j] * (dP[j] - D) * scale;
                    const float *k = qkv + (b * T + j) * OC + (NH + hk) * HS;
                    for (int c = 0; c < HS; c++) {
                        dqkv_ref[(b * T + i) * OC + h * HS + c] += ds * k[c];
                        dqkv_ref[(b * T + j) * OC + (NH + hk) * HS + c] += ds * q[c];
                    }
                }
            }
        }
    AttnParams p;
    memset(&p, 0, sizeof p);
    AttnStrides qkv_st = {T * OC, OC, HS}, y_st = {T * C, C, HS};
    p.q = qkv;
    p.k = qkv + NH * HS;
    p.v = qkv + (NH + NKV) * HS;
    p.out = out;
    p.lse = lse;
    p.q_st = p.k_st = p.v_st = p.dq_st = p.dk_st = p.dv_st = qkv_st;
    p.o_st = p.do_st = y_st;
    p.dout = dout;
    p.dq = dqkv;
    p.dk = dqkv + NH * HS;
    p.dv = dqkv + (NH + NKV) * HS;
    p.B = B;
    p.T_q = p.T_k = T;
    p.NH = NH;
    p.NKV = NKV;
    p.HS = HS;
    p.scale = (float)scale;
    p.causal = 1;
    p.window_left = p.window_right = -1;
    for (int impl = 0; impl < 2; impl++) {
        p.impl = impl == 0 ? ATTN_IMPL_FLASH : ATTN_IMPL_NAIVE;
        memset(out, 0, sizeof out);
        memset(dqkv, 0, sizeof dqkv);
        backend_attention(be, &p, 0);
        EXPECT(rel_err_d(out, out_ref, B * T * C) < OP_TOL, "attention out (impl %d) rel err %g", impl,
               rel_err_d(out, out_ref, B * T * C));
        EXPECT(rel_err_d(lse, lse_ref, B * NH * T) < OP_TOL, "attention lse rel err %g",
               rel_err_d(lse, lse_ref, B * NH * T));
        backend_attention(be, &p, 1);
        EXPECT(rel_err_d(dqkv, dqkv_ref, B * T * OC) < OP_TOL, "attention dqkv (impl %d) rel err %g",
               impl, rel_err_d(dqkv, dqkv_ref, B * T * OC));
    }
}

// The GPTConfig fields that gpt_rope_table_host reads.
static GPTConfig rope_table_config(int maxT, int HS, double theta, int rope_dims) {
    GPTConfig g;
    memset(&g, 0, sizeof g);
    g.maxT = maxT;
    g.HS = HS;
    g.pos = POS_ROPE;
    g.rope_theta = (float)theta;
    g.rope_dims = rope_dims;
    return g;
}

// RoPE on the fused qkv buffer, with the model's table (gpt_rope_table_host), against the
// rotation written out in double: in q and k heads the pairs d < R/2 (R = rope_dims, 0 = HS) turn
// by pos * theta^(-2d/R) (half-split pairs), the others and the v heads stay bitwise; backward is
// the transpose: <rope(x), y> = <x, rope_backward(y)>, and rope_backward(rope(x)) = x.
static void test_rope_op(Backend *be, Rng *r, int use_pos, int rope_dims) {
    enum { B = 2, T = 9, NH = 4, NKV = 2, HS = 16, OC = (NH + 2 * NKV) * HS, MAXT = 40, N = B * T };
    const double theta = 10000.0;
    const int R = rope_dims > 0 ? rope_dims : HS;
    float table[MAXT * HS], x[N * OC], y[N * OC], fx[N * OC], by[N * OC];
    int pos[N];
    double ref[N * OC];
    const GPTConfig g = rope_table_config(MAXT, HS, theta, rope_dims);
    gpt_rope_table_host(&g, table);
    for (int i = 0; i < N; i++) pos[i] = (7 * i + 3) % MAXT;   // arbitrary, some past T
    fill_normal(r, x, N * OC, 1.0f);
    fill_normal(r, y, N * OC, 1.0f);
    for (int i = 0; i < N; i++) {
        const int p = use_pos ? pos[i] : i % T;
        for (int c = 0; c < OC; c++) ref[i * OC + c] = x[i * OC + c];
        for (int h = 0; h < NH + NKV; h++)
            for (int d = 0; d < R / 2; d++) {
                const double a = p * pow(theta, -2.0 * d / R);
                const double x1 = x[i * OC + h * HS + d], x2 = x[i * OC + h * HS + d + HS / 2];
                ref[i * OC + h * HS + d] = x1 * cos(a) - x2 * sin(a);
                ref[i * OC + h * HS + d + HS / 2] = x2 * cos(a) + x1 * sin(a);
            }
    }
    memcpy(fx, x, sizeof fx);
    memcpy(by, y, sizeof by);
    be->rope_forward(be, fx, table, use_pos ? pos : NULL, N, T, NH, NKV, HS);
    be->rope_backward(be, by, table, use_pos ? pos : NULL, N, T, NH, NKV, HS);
    // Each output is two products and a sum of fp32 values with a table entry rounded once:
    // a few 2^-24 relative, far inside OP_TOL.
    EXPECT(rel_err_d(fx, ref, N * OC) < OP_TOL, "rope forward rel err %g", rel_err_d(fx, ref, N * OC));
    int v_same = 1;
    for (int i = 0; i < N; i++)
        v_same &= memcmp(fx + i * OC + (NH + NKV) * HS, x + i * OC + (NH + NKV) * HS,
                         NKV * HS * sizeof(float)) == 0;
    EXPECT(v_same, "rope must leave the value heads untouched");
    int fixed_same = 1;   // the never-rotated pairs (x[d], x[d + HS/2]), d >= R/2, of q and k
    for (int i = 0; i < N; i++)
        for (int h = 0; h < NH + NKV; h++)
            for (int d = R / 2; d < HS / 2; d++)
                for (int e = d; e < HS; e += HS / 2)
                    fixed_same &= fx[i * OC + h * HS + e] == x[i * OC + h * HS + e] &&
                                  by[i * OC + h * HS + e] == y[i * OC + h * HS + e];
    EXPECT(fixed_same, "rope_dims %d: the pairs past rope_dims/2 must stay unchanged", rope_dims);
    double lhs = 0, rhs = 0, mag = 0;
    for (int k = 0; k < N * OC; k++) {
        lhs += (double)fx[k] * y[k];
        rhs += (double)x[k] * by[k];
        mag += fabs((double)x[k] * by[k]);
    }
    EXPECT(fabs(lhs - rhs) < OP_TOL * mag, "rope backward is not the transpose: %g vs %g", lhs, rhs);
    be->rope_backward(be, fx, table, use_pos ? pos : NULL, N, T, NH, NKV, HS);
    EXPECT(rel_err_f32(fx, x, N * OC) < OP_TOL, "rope backward(forward(x)) != x: rel err %g",
           rel_err_f32(fx, x, N * OC));
}

// rope_dims 0 and rope_dims = HS both give the table of every dimension rotated, bit for bit the
// formula pos * theta^(-2d/HS) in double rounded once.
static void test_rope_table_full(void) {
    enum { HS = 16, MAXT = 40 };
    const double theta = 500.0;
    float all[MAXT * HS], full[MAXT * HS], ref[MAXT * HS];
    const GPTConfig g_all = rope_table_config(MAXT, HS, theta, 0), g_full = rope_table_config(MAXT, HS, theta, HS);
    gpt_rope_table_host(&g_all, all);
    gpt_rope_table_host(&g_full, full);
    for (int t = 0; t < MAXT; t++)
        for (int d = 0; d < HS / 2; d++) {
            const double inv_freq = pow(theta, -2.0 * d / HS);
            ref[t * HS + 2 * d] = (float)cos(t * inv_freq);
            ref[t * HS + 2 * d + 1] = (float)sin(t * inv_freq);
        }
    EXPECT(memcmp(all, ref, sizeof ref) == 0, "rope_dims 0: the table differs from the formula");
    EXPECT(memcmp(full, all, sizeof all) == 0, "rope_dims = HS differs from rope_dims 0");
}

// ---------------------------------------------------------------------------------------------
// the whole model

enum { MB = 3, MT = 37 };

static GPTConfig small_config(PosEmbedding pos) {
    return (GPTConfig){.V = 101, .Vp = 128, .maxT = 40, .L = 2, .NH = 4, .NKV = 2, .C = 64,
                       .HS = 16, .pos = pos, .rope_theta = 10000.0f};
}

// Packed documents (attention.doc_mask with data.eot_token = DOC_EOT): the runs' settings, and
// a batch with an eot every few tokens, one ending a row and two at the start of the next.
#define DOC_EOT 5
typedef enum { SINGLE_DOC = 0, PACKED_DOCS = 1 } DocMode;

static void set_docs(Config *run, DocMode docs) {
    run->attention.doc_mask = docs == PACKED_DOCS;
    run->data.eot_token = docs == PACKED_DOCS ? DOC_EOT : -1;
}

static void pack_documents(int *tokens, int B, int T) {
    for (int i = 0; i < B * T; i++)
        if ((i * 7) % 11 == 3) tokens[i] = DOC_EOT;
    if (B < 2) return;
    tokens[T - 1] = tokens[T] = tokens[T + 1] = DOC_EOT;
}

// GPT-2 init, then every parameter moved by noise of std 0.1 so that attention is far from
// uniform, biases and LayerNorm parameters are not at their trivial values, and every gradient
// is large enough for finite differences to resolve. Padded vocabulary rows stay 0.
static float *test_params(GPT *m, uint64_t seed) {
    size_t n = gpt_num_params(m);
    float *p = xmalloc(n * sizeof(float));
    gpt_init_weights_host(m, p, seed);
    Rng r;
    rng_seed(&r, seed + 1);
    const GPTConfig *g = gpt_cfg(m);
    const ParamTensor *wte = gpt_tensor(m, 0);
    for (size_t i = 0; i < n; i++) {
        int padded = i >= wte->offset + (size_t)g->V * g->C && i < wte->offset + wte->numel;
        if (!padded) p[i] += 0.1f * rng_normal(&r);
    }
    return p;
}

static void random_batch(Rng *r, int *tokens, int *targets, int n, int V) {
    for (int i = 0; i < n; i++) {
        tokens[i] = (int)rng_below(r, V);
        targets[i] = i % 7 == 3 ? -1 : (int)rng_below(r, V);   // some ignored targets
    }
}

// A small CPU model (small_config(pos), run or the defaults) with test_params(param_seed) set
// and a random batch drawn from batch_seed: where most of the whole-model tests start.
typedef struct {
    GPTConfig g;
    Backend *be;
    GPT *m;
    size_t n;                                // parameters
    float *params;                           // (n) test_params, set in m
    int tokens[MB * MT], targets[MB * MT];   // (MB, MT)
    Rng r;                                   // drew the batch; a test may draw on from it
} ModelCase;

static void case_open(ModelCase *c, PosEmbedding pos, const Config *run, uint64_t param_seed,
                      uint64_t batch_seed) {
    c->g = small_config(pos);
    c->be = backend_cpu_create();
    c->m = gpt_create(&c->g, c->be, MB, MT, run);
    c->n = gpt_num_params(c->m);
    c->params = test_params(c->m, param_seed);
    gpt_set_params_f32(c->m, c->params);
    rng_seed(&c->r, batch_seed);
    random_batch(&c->r, c->tokens, c->targets, MB * MT, c->g.V);
}

static void case_close(ModelCase *c) {
    free(c->params);
    gpt_free(c->m);
    c->be->destroy(c->be);
}

// A fresh gradient buffer of the case's n floats.
static float *case_grads(const ModelCase *c) { return xmalloc(c->n * sizeof(float)); }

// One forward and backward of the case's batch through m (the gradients scaled by grad_scale and
// added to those already there), then the gradients into grads (n); returns the loss.
static float forward_backward(GPT *m, const ModelCase *c, float grad_scale, float *grads) {
    const float loss = gpt_forward(m, c->tokens, c->targets, MB, MT);
    gpt_backward(m, grad_scale);
    gpt_get_grads_f32(m, grads);
    return loss;
}

static int all_zero(const float *x, size_t n) {
    int zero = 1;
    for (size_t i = 0; i < n; i++) zero &= x[i] == 0.0f;
    return zero;
}

// Mean loss in double from the per-token fp32 losses (gpt_forward's float return would add a
// rounding of 2^-24 * loss to every finite difference).
static double loss_d(GPT *m, const int *tokens, const int *targets) {
    gpt_forward(m, tokens, targets, MB, MT);
    float losses[MB * MT];
    gpt_losses_f32(m, losses);
    double s = 0;
    int n = 0;
    for (int i = 0; i < MB * MT; i++)
        if (targets[i] >= 0) s += losses[i], n++;
    return s / n;
}

// Finite differences of the fp32 model's loss. The loss carries fp32 rounding noise eps_L (a few
// 1e-7 after averaging over ~95 tokens), so a central difference with step h has error
// ~ eps_L / h + h^2 |f'''| / 6. Richardson extrapolation of the steps h and h/2,
// (4 D(h/2) - D(h)) / 3, cancels the h^2 term, so a large step (h = 2e-2, noise ~1e-5) costs no
// truncation error: what remains is O(h^4) and the noise.
static double fd_grad(GPT *m, float *params, size_t i, const int *tokens, const int *targets) {
    const float h = 2e-2f;
    float saved = params[i];
    double d[2];
    for (int k = 0; k < 2; k++) {
        float hk = k == 0 ? h : h / 2;
        params[i] = saved + hk;
        gpt_set_params_f32(m, params);
        double lp = loss_d(m, tokens, targets);
        params[i] = saved - hk;
        gpt_set_params_f32(m, params);
        double lm = loss_d(m, tokens, targets);
        d[k] = (lp - lm) / (2.0 * hk);
    }
    params[i] = saved;
    gpt_set_params_f32(m, params);
    return (4.0 * d[1] - d[0]) / 3.0;
}

// dropout: attention.dropout and model.dropout both, masks fixed by the rng step, so the finite
// differences see the same masked loss as the analytic gradient.
// docs: packed documents, with the window on even layers only (window_every 2).
static void test_gradients(PosEmbedding pos, int window, float dropout, DocMode docs) {
    Config run;
    config_defaults(&run);
    run.attention.window = window;
    set_docs(&run, docs);
    if (docs == PACKED_DOCS) run.attention.window_every = 2;
    run.attention.dropout = dropout;
    run.model.dropout = dropout;
    ModelCase c;
    case_open(&c, pos, &run, 7, 11);
    GPT *m = c.m;
    float *grads = case_grads(&c);
    if (docs == PACKED_DOCS) pack_documents(c.tokens, MB, MT);
    gpt_set_rng_step(m, 5);
    gpt_zero_grad(m);
    forward_backward(m, &c, 1.0f, grads);

    // Per tensor: the 3 largest gradients and 3 random elements. Tolerance: the finite
    // difference carries the loss noise (see fd_grad): eps_L ~ 1e-7..3e-7 divided by the step
    // 2 * h/2 = 2e-2 and weighted 4/3 by the extrapolation, i.e. ~1e-5 absolute (the largest
    // difference seen is 9e-6), so 5e-5 absolute; plus 1e-3 relative for the O(h^4) truncation
    // and the backward's own fp32 rounding. Gradients here are 1e-3..1e-1, so a real bug (a
    // missing term, a wrong stride) is far outside.
    int worst_tensor = -1;
    double worst = 0;
    for (int t = 0; t < gpt_num_tensors(m); t++) {
        const ParamTensor *pt = gpt_tensor(m, t);
        size_t idx[6];
        for (int k = 0; k < 3; k++) {
            size_t best = pt->offset;
            double bv = -1;
            for (size_t i = pt->offset; i < pt->offset + pt->numel; i++) {
                int taken = 0;
                for (int q = 0; q < k; q++) taken |= idx[q] == i;
                if (!taken && fabs(grads[i]) > bv) bv = fabs(grads[i]), best = i;
            }
            idx[k] = best;
        }
        for (int k = 3; k < 6; k++) idx[k] = pt->offset + rng_below(&c.r, pt->numel);
        for (int k = 0; k < 6; k++) {
            double fd = fd_grad(m, c.params, idx[k], c.tokens, c.targets);
            double err = fabs(grads[idx[k]] - fd) / (5e-5 + 1e-3 * fabs(fd));
            if (err > worst) worst = err, worst_tensor = t;
            EXPECT(err <= 1.0, "%s[%zu]: analytic %.6e, finite difference %.6e", pt->name,
                   idx[k] - pt->offset, grads[idx[k]], fd);
        }
    }
    printf("     gradient check: worst error / tolerance %.3f (%s)\n", worst,
           worst_tensor >= 0 ? gpt_tensor(m, worst_tensor)->name : "-");

    // Padded vocabulary rows: zero gradient; position rows past T: zero gradient.
    const ParamTensor *wte = gpt_tensor(m, 0), *wpe = gpt_tensor(m, 1);
    const size_t real_wte = (size_t)c.g.V * c.g.C, real_wpe = (size_t)MT * c.g.C;
    EXPECT(all_zero(grads + wte->offset + real_wte, wte->numel - real_wte),
           "padded wte rows must get exactly zero gradient");
    if (pos == POS_LEARNED && docs == SINGLE_DOC)
        EXPECT(all_zero(grads + wpe->offset + real_wpe, wpe->numel - real_wpe),
               "wpe rows past T must get zero gradient");
    free(grads);
    case_close(&c);
}

// Padded logits never win: with huge padded wte rows the loss and every real gradient equal those
// with zero padded rows, and the padded rows still get zero gradient.
static void test_padded_vocab(void) {
    ModelCase c;
    case_open(&c, POS_LEARNED, NULL, 3, 5);
    const size_t n = c.n, real = (size_t)c.g.V * c.g.C, after = (size_t)c.g.Vp * c.g.C;
    float *g0 = case_grads(&c), *g1 = case_grads(&c);
    float loss[2];
    for (int k = 0; k < 2; k++) {
        if (k == 1)
            for (size_t i = real; i < after; i++) c.params[i] = 50.0f;
        gpt_set_params_f32(c.m, c.params);
        gpt_zero_grad(c.m);
        loss[k] = forward_backward(c.m, &c, 1.0f, k ? g1 : g0);
    }
    EXPECT(loss[0] == loss[1], "padded rows changed the loss: %.7f vs %.7f", loss[0], loss[1]);
    // dlogits is exactly 0 on the padded columns, so the padded rows only add exact zeros (in
    // the same summation order) to dlnf = dlogits @ wte: every real gradient is bitwise equal.
    EXPECT(memcmp(g1, g0, real * sizeof(float)) == 0 &&
               memcmp(g1 + after, g0 + after, (n - after) * sizeof(float)) == 0,
           "padded rows changed the real gradients");
    EXPECT(all_zero(g1 + real, after - real), "padded wte rows must get zero gradient");
    free(g0);
    free(g1);
    case_close(&c);
}

// Two forward+backward passes without zeroing give twice the gradient; grad_scale scales it.
static void test_accumulation(void) {
    ModelCase c;
    case_open(&c, POS_LEARNED, NULL, 9, 6);
    const size_t n = c.n;
    float *g1 = case_grads(&c), *g2 = case_grads(&c), *g3 = case_grads(&c);
    gpt_zero_grad(c.m);
    forward_backward(c.m, &c, 1.0f, g1);
    forward_backward(c.m, &c, 1.0f, g2);
    gpt_zero_grad(c.m);
    forward_backward(c.m, &c, 0.25f, g3);
    for (size_t i = 0; i < n; i++) g1[i] *= 2.0f;
    // 2x and 0.25x are exact in binary, so only the summation of the second pass onto the
    // first (one rounding per element, 2^-24 relative) separates g2 from 2 g1.
    EXPECT(rel_err_f32(g2, g1, n) < 1e-6, "two backward passes: rel err %g vs 2x", rel_err_f32(g2, g1, n));
    for (size_t i = 0; i < n; i++) g1[i] *= 0.125f;
    EXPECT(rel_err_f32(g3, g1, n) < 1e-6, "grad_scale 0.25: rel err %g", rel_err_f32(g3, g1, n));
    free(g1);
    free(g2);
    free(g3);
    case_close(&c);
}

// Loss of a batch with ignored targets = mean of the per-token losses of the others; a smaller
// batch (B=1, T=20) reproduces the first row's logits of the full batch (causal attention).
static void test_loss_and_small_batch(void) {
    ModelCase c;
    case_open(&c, POS_LEARNED, NULL, 4, 8);
    GPT *m = c.m;
    float loss = gpt_forward(m, c.tokens, c.targets, MB, MT);
    float losses[MB * MT], logits[MB * MT * 101], logits_small[20 * 101];
    gpt_losses_f32(m, losses);
    gpt_logits_f32(m, logits);
    double s = 0, ref = 0;
    int nv = 0;
    for (int i = 0; i < MB * MT; i++) {
        if (c.targets[i] < 0) {
            EXPECT(losses[i] == 0.0f, "ignored target %d has loss %g", i, losses[i]);
            continue;
        }
        s += losses[i], nv++;
        // Independent check of one token's loss from the logits.
        const float *z = logits + (size_t)i * c.g.V;
        double mx = -INFINITY, se = 0;
        for (int j = 0; j < c.g.V; j++) mx = fmax(mx, z[j]);
        for (int j = 0; j < c.g.V; j++) se += exp(z[j] - mx);
        ref = mx + log(se) - z[c.targets[i]];
        EXPECT(fabs(ref - losses[i]) < 1e-5 * (1 + fabs(ref)), "token %d loss %g vs %g", i, losses[i], ref);
    }
    EXPECT(fabs(loss - s / nv) < 1e-6 * fabs(loss), "mean loss %g vs %g", loss, s / nv);
    EXPECT(gpt_forward(m, c.tokens, NULL, 1, 20) == 0.0f, "forward without targets returns 0");
    gpt_logits_f32(m, logits_small);
    EXPECT(rel_err_f32(logits_small, logits, 20 * 101) < OP_TOL, "small batch logits rel err %g",
           rel_err_f32(logits_small, logits, 20 * 101));
    case_close(&c);
}

// KV-cache decoding reproduces the full forward's logits at every position.
static void test_decode(PosEmbedding pos, int window, int window_every) {
    GPTConfig g = small_config(pos);
    Config run;
    config_defaults(&run);
    run.attention.window = window;
    run.attention.window_every = window_every;
    Backend *be = backend_cpu_create();
    GPT *m = gpt_create(&g, be, 1, MT, &run);
    float *params = test_params(m, 12);
    gpt_set_params_f32(m, params);
    int tokens[MT];
    Rng r;
    rng_seed(&r, 13);
    for (int i = 0; i < MT; i++) tokens[i] = (int)rng_below(&r, g.V);
    float full[MT * 101], step[MT * 101];
    for (int rep = 0; rep < 2; rep++) {   // the second pass checks that pos 0 resets the cache
        gpt_forward(m, tokens, NULL, 1, MT);
        gpt_logits_f32(m, full);
        for (int t = 0; t < MT; t++) gpt_decode_step(m, tokens[t], t, step + (size_t)t * g.V);
        // The same sums in a different order (one row through sgemm instead of 37, attention over
        // a cache): fp32 rounding only, as for the ops.
        EXPECT(rel_err_f32(step, full, MT * g.V) < OP_TOL, "decode (pos %d, window %d every %d) "
               "rel err %g", pos, window, window_every, rel_err_f32(step, full, MT * g.V));
        tokens[0] = (tokens[0] + 1) % g.V;
    }
    free(params);
    gpt_free(m);
    be->destroy(be);
}

// Packed documents: every document's logits in the packed batch equal those of the document run
// alone as its own row (positions from 0, nothing before it visible), for any position scheme.
static void test_documents(PosEmbedding pos) {
    Config run;
    config_defaults(&run);
    set_docs(&run, PACKED_DOCS);
    ModelCase c;
    case_open(&c, pos, &run, 41, 42);
    GPT *m = c.m;
    pack_documents(c.tokens, MB, MT);
    float *packed = xmalloc((size_t)MB * MT * c.g.V * sizeof(float));   // (B, T, V)
    float *alone = xmalloc((size_t)MB * MT * c.g.V * sizeof(float));    // (T, V), then (B, T, V)
    gpt_forward(m, c.tokens, NULL, MB, MT);
    gpt_logits_f32(m, packed);
    int n_docs = 0;
    double worst = 0;
    for (int i0 = 0; i0 < MB * MT;) {   // one document: [i0, i1)
        int i1 = i0 + 1;
        while (i1 % MT != 0 && c.tokens[i1 - 1] != DOC_EOT) i1++;
        gpt_forward(m, c.tokens + i0, NULL, 1, i1 - i0);
        gpt_logits_f32(m, alone);
        double e = rel_err_f32(alone, packed + (size_t)i0 * c.g.V, (size_t)(i1 - i0) * c.g.V);
        worst = e > worst ? e : worst;
        n_docs++;
        i0 = i1;
    }
    // Same sums over the same visible keys, in blocks of another shape: fp32 rounding only.
    EXPECT(worst < OP_TOL, "packed vs alone (pos %d): worst rel err %g over %d documents", pos, worst,
           n_docs);
    EXPECT(n_docs >= 10, "the batch must pack many documents, got %d", n_docs);
    // Without doc_mask the same batch is one sequence per row: the logits must differ.
    GPT *plain = gpt_create(&c.g, c.be, MB, MT, NULL);
    gpt_set_params_f32(plain, c.params);
    gpt_forward(plain, c.tokens, NULL, MB, MT);
    gpt_logits_f32(plain, alone);
    EXPECT(rel_err_f32(alone, packed, MT * c.g.V) > 1e-3, "doc_mask changed nothing");
    free(packed);
    free(alone);
    gpt_free(plain);
    case_close(&c);
}

// The long-range task the long-context runs learn (data.synthetic = retrieval): K = 16 pairs
// open the sequence and close it shuffled; the only targets are the closing keys' values, each
// defined at least T - 4K positions earlier, and every answer is determined by the sequence.
static void test_retrieval_task(void) {
    enum { T = 300, V = 1000, K = 16, S = 256 };
    char err[256];
    Synthetic *s = synthetic_create("retrieval", V, T, 9, err, sizeof err);
    EXPECT(s != NULL, "%s", err);
    if (!s) return;
    int in[T], tg[T], n_targets = 0, ok = 1, min_dist = T;
    synthetic_sequence(s, 77, in, tg);
    for (int t = 0; t < T; t++) {
        const int is_query_key = t >= T - 2 * K && (t - (T - 2 * K)) % 2 == 0;
        ok &= (tg[t] >= 0) == is_query_key;
        ok &= t < 2 * K || t >= T - 2 * K || in[t] >= S / 2;   // filler never looks like a pair
        if (tg[t] < 0) continue;
        n_targets++;
        int def = -1;
        for (int j = 0; j < 2 * K; j += 2)
            if (in[j] == in[t]) def = j;
        ok &= def >= 0 && in[def + 1] == tg[t] && in[t + 1] == tg[t] && in[t] < S / 4;
        if (def >= 0 && t - def < min_dist) min_dist = t - def;
    }
    EXPECT(ok && n_targets == K, "retrieval structure (%d targets)", n_targets);
    EXPECT(min_dist >= T - 4 * K, "retrieval distance %d < T - 4K", min_dist);
    EXPECT(synthetic_loss_floor(s) == 0.0, "floor %g", synthetic_loss_floor(s));
    synthetic_free(s);
    EXPECT(synthetic_create("retrieval", V, 4 * K, 9, err, sizeof err) == NULL &&
               strstr(err, "train.seq_len") != NULL,
           "a too short sequence is refused with a message naming the key: %s", err);
}

// Parameter layout: names, order, shapes, decay flags and the initialisation statistics.
static void test_layout_and_init(void) {
    GPTConfig g = small_config(POS_LEARNED);
    Backend *be = backend_cpu_create();
    Config run;
    config_defaults(&run);
    run.optim.decay_embeddings = 1;
    GPT *m = gpt_create(&g, be, 1, 8, &run);
    EXPECT(gpt_num_tensors(m) == 2 + 12 * g.L + 2, "tensor count %d", gpt_num_tensors(m));
    const ParamTensor *t = gpt_tensor(m, 0);
    EXPECT(strcmp(t->name, "wte") == 0 && t->shape[0] == 128 && t->shape[1] == 64 && t->decay == 1,
           "wte %s (%d, %d)", t->name, t->shape[0], t->shape[1]);
    t = gpt_tensor(m, 1);
    EXPECT(strcmp(t->name, "wpe") == 0 && t->shape[0] == 40 && t->decay == 1, "wpe %s", t->name);
    t = gpt_tensor(m, 2 + 12 + 2);
    EXPECT(strcmp(t->name, "h.1.attn.qkv.weight") == 0 && t->shape[0] == (4 + 2 * 2) * 16 &&
               t->shape[1] == 64 && t->decay == 1,
           "%s (%d, %d)", t->name, t->shape[0], t->shape[1]);
    t = gpt_tensor(m, 2 + 12 + 3);
    EXPECT(strcmp(t->name, "h.1.attn.qkv.bias") == 0 && t->ndim == 1 && t->decay == 0, "%s", t->name);
    t = gpt_tensor(m, 2 + 12 + 10);
    EXPECT(strcmp(t->name, "h.1.mlp.proj.weight") == 0 && t->shape[0] == 64 && t->shape[1] == 256,
           "%s", t->name);
    t = gpt_tensor(m, gpt_num_tensors(m) - 1);
    EXPECT(strcmp(t->name, "lnf.bias") == 0 && t->offset + t->numel == gpt_num_params(m), "%s", t->name);
    size_t off = 0;
    for (int i = 0; i < gpt_num_tensors(m); i++) {
        EXPECT(gpt_tensor(m, i)->offset == off, "tensor %d not contiguous", i);
        off += gpt_tensor(m, i)->numel;
    }

    size_t n = gpt_num_params(m);
    float *a = xmalloc(n * sizeof(float)), *b = xmalloc(n * sizeof(float));
    gpt_init_weights_host(m, a, 42);
    gpt_init_weights_host(m, b, 42);
    EXPECT(memcmp(a, b, n * sizeof(float)) == 0, "init must be deterministic in the seed");
    // Standard deviations: sample std of n draws is within ~3/sqrt(2n) relative (3 sigma).
    const ParamTensor *fc = gpt_tensor(m, 2 + 8), *pr = gpt_tensor(m, 2 + 10), *ln = gpt_tensor(m, 2);
    double s1 = 0, s2 = 0;
    for (size_t i = 0; i < fc->numel; i++) s1 += (double)a[fc->offset + i] * a[fc->offset + i];
    for (size_t i = 0; i < pr->numel; i++) s2 += (double)a[pr->offset + i] * a[pr->offset + i];
    double std1 = sqrt(s1 / fc->numel), std2 = sqrt(s2 / pr->numel);
    EXPECT(fabs(std1 / 0.02 - 1) < 3 / sqrt(2.0 * fc->numel), "fc weight std %g", std1);
    EXPECT(fabs(std2 / (0.02 / sqrt(2.0 * g.L)) - 1) < 3 / sqrt(2.0 * pr->numel), "proj weight std %g", std2);
    EXPECT(a[ln->offset] == 1.0f && a[ln->offset + 1 + 63] == 0.0f, "LayerNorm init 1 / 0");
    EXPECT(all_zero(a + (size_t)g.V * g.C, (size_t)(g.Vp - g.V) * g.C), "padded wte rows must start at 0");
    gpt_set_params_f32(m, a);
    gpt_get_params_f32(m, b);
    EXPECT(memcmp(a, b, n * sizeof(float)) == 0, "set/get params round trip");
    free(a);
    free(b);
    gpt_free(m);

    GPTConfig ga = small_config(POS_ALIBI);
    m = gpt_create(&ga, be, 1, 8, NULL);
    EXPECT(gpt_num_tensors(m) == 1 + 12 * g.L + 2 && strcmp(gpt_tensor(m, 1)->name, "h.0.ln1.weight") == 0,
           "alibi has no wpe");
    gpt_free(m);
    be->destroy(be);
}

// Dropout (attention.dropout, model.dropout): on in training forwards with targets, a pure
// function of the rng step; never in forwards without targets, in eval mode or in decoding,
// which all equal the dropout-free model bitwise (the same CPU ops in the same order).
static void test_dropout(float attn_p, float resid_p) {
    Config run;
    config_defaults(&run);
    run.attention.dropout = attn_p;
    run.model.dropout = resid_p;
    ModelCase c;
    case_open(&c, POS_LEARNED, &run, 21, 22);
    GPT *m = c.m, *plain = gpt_create(&c.g, c.be, MB, MT, NULL);
    gpt_set_params_f32(plain, c.params);
    float l_plain = gpt_forward(plain, c.tokens, c.targets, MB, MT);
    gpt_set_rng_step(m, 0);
    float l_drop0 = gpt_forward(m, c.tokens, c.targets, MB, MT);
    float l_again = gpt_forward(m, c.tokens, c.targets, MB, MT);
    gpt_set_rng_step(m, 1);
    float l_drop1 = gpt_forward(m, c.tokens, c.targets, MB, MT);
    EXPECT(l_drop0 != l_plain && l_drop1 != l_drop0, "dropout must change the loss per rng step: "
           "%g %g %g", l_plain, l_drop0, l_drop1);
    EXPECT(l_again == l_drop0, "the same rng step must draw the same masks: %g vs %g", l_again,
           l_drop0);

    const size_t nl = (size_t)MB * MT * c.g.V;
    float *lp = xmalloc(nl * sizeof(float)), *lm = xmalloc(nl * sizeof(float));  // (B, T, V)
    gpt_forward(plain, c.tokens, NULL, MB, MT);
    gpt_logits_f32(plain, lp);
    gpt_forward(m, c.tokens, NULL, MB, MT);
    gpt_logits_f32(m, lm);
    EXPECT(memcmp(lp, lm, nl * sizeof(float)) == 0, "a forward without targets must not drop");

    float dec_plain[101], dec_m[101];
    int same_decode = 1;
    for (int t = 0; t < 5; t++) {
        gpt_decode_step(plain, c.tokens[t], t, dec_plain);
        gpt_decode_step(m, c.tokens[t], t, dec_m);
        same_decode &= memcmp(dec_plain, dec_m, sizeof dec_m) == 0;
    }
    EXPECT(same_decode, "decoding must not drop");

    gpt_set_training(m, 0);
    float l_eval = gpt_forward(m, c.tokens, c.targets, MB, MT);
    float l_eval2 = gpt_forward(m, c.tokens, c.targets, MB, MT);
    EXPECT(l_eval == l_plain && l_eval2 == l_eval, "eval mode must not drop: %g, %g vs %g", l_eval,
           l_eval2, l_plain);
    free(lp), free(lm);
    gpt_free(plain);
    case_close(&c);
}

// gpt_set_rng_base (the counter CUDA graphs read): micro-step s counted from base draws the masks
// of micro-step base + s set alone, in forward and backward, also across the 2^64 wrap.
static void test_dropout_base(void) {
    Config run;
    config_defaults(&run);
    run.attention.dropout = 0.2f;
    run.model.dropout = 0.2f;
    ModelCase c;
    case_open(&c, POS_LEARNED, &run, 23, 24);
    float *g0 = case_grads(&c), *g1 = case_grads(&c);
    gpt_set_rng_step(c.m, 3);
    gpt_zero_grad(c.m);
    const float l_plain = forward_backward(c.m, &c, 1.0f, g0);
    const uint64_t base = ((uint64_t)1 << 63) + 11;
    gpt_set_rng_base(c.m, base);
    gpt_set_rng_step(c.m, 3 - base);
    gpt_zero_grad(c.m);
    const float l_base = forward_backward(c.m, &c, 1.0f, g1);
    EXPECT(l_base == l_plain && memcmp(g0, g1, c.n * sizeof(float)) == 0,
           "base + step must draw the masks of the step alone: loss %.7f vs %.7f", l_base, l_plain);
    gpt_set_rng_step(c.m, 4 - base);
    gpt_zero_grad(c.m);
    const float l_next = forward_backward(c.m, &c, 1.0f, g1);
    EXPECT(l_next != l_plain, "the next micro-step from the base must draw other masks");
    free(g0);
    free(g1);
    case_close(&c);
}

// train.recompute: recomputing activations in backward (with the forward's dropout masks) gives
// bitwise the gradients of keeping them, since every CPU op is deterministic.
static void test_recompute(const char *mode, PosEmbedding pos, DocMode docs) {
    Config run;
    config_defaults(&run);
    set_docs(&run, docs);
    run.attention.dropout = 0.1f;
    run.model.dropout = 0.1f;
    Config recompute = run;
    char kv[96], why[256];
    snprintf(kv, sizeof kv, "train.recompute=%s", mode);
    CHECK(config_set(&recompute, kv, why, sizeof why) == 0);
    ModelCase c;
    case_open(&c, pos, &recompute, 31, 32);
    GPT *m = c.m, *ref = gpt_create(&c.g, c.be, MB, MT, &run);
    const size_t n = c.n;
    float *g0 = case_grads(&c), *g1 = case_grads(&c);
    if (docs == PACKED_DOCS) pack_documents(c.tokens, MB, MT);
    float loss[2];
    GPT *models[2] = {ref, m};
    for (int k = 0; k < 2; k++) {
        gpt_set_params_f32(models[k], c.params);
        gpt_zero_grad(models[k]);
        for (int step = 0; step < 2; step++) {   // the second step draws fresh dropout masks
            gpt_set_rng_step(models[k], (uint64_t)step);
            loss[k] = gpt_forward(models[k], c.tokens, c.targets, MB, MT);
            gpt_backward(models[k], 1.0f);
        }
        gpt_get_grads_f32(models[k], k ? g1 : g0);
    }
    EXPECT(loss[0] == loss[1], "recompute %s: loss %.7f vs %.7f", mode, loss[1], loss[0]);
    EXPECT(memcmp(g0, g1, n * sizeof(float)) == 0, "recompute %s: gradients differ, rel err %g", mode,
           rel_err_f32(g1, g0, n));
    free(g0);
    free(g1);
    gpt_free(ref);
    case_close(&c);
}

// The classifier in chunks of `rows` rows (the last one shorter) against one chunk for the whole
// batch: the same losses, logits and gradients up to fp32 summation order (wte's gradient adds
// the chunks' shares one after another; OpenBLAS may block a shorter matmul differently).
static void test_head_chunks(int rows) {
    ModelCase c;
    case_open(&c, POS_LEARNED, NULL, 41, 42);
    GPT *whole = c.m, *chunked = gpt_create(&c.g, c.be, MB, MT, NULL);
    gpt_set_params_f32(chunked, c.params);
    char err[ERR_LEN];
    EXPECT(gpt_set_head_rows(chunked, rows, err, sizeof err) == 0, "%d rows refused: %s", rows, err);
    const size_t nl = (size_t)MB * MT * c.g.V;
    float *l0 = xmalloc(nl * sizeof(float)), *l1 = xmalloc(nl * sizeof(float));
    float p0[MB * MT], p1[MB * MT];
    float *g0 = case_grads(&c), *g1 = case_grads(&c);
    GPT *models[2] = {whole, chunked};
    float loss[2];
    for (int k = 0; k < 2; k++) {
        gpt_zero_grad(models[k]);
        loss[k] = gpt_forward(models[k], c.tokens, c.targets, MB, MT);
        gpt_losses_f32(models[k], k ? p1 : p0);
        gpt_logits_f32(models[k], k ? l1 : l0);
        gpt_backward(models[k], 0.5f);
        gpt_get_grads_f32(models[k], k ? g1 : g0);
    }
    const double tol = 1e-6;   // 2^-24 roundings over sums of K <= 111 terms: ~1e-7
    EXPECT(fabsf(loss[0] - loss[1]) <= tol * fabsf(loss[0]), "chunks of %d: loss %.7f vs %.7f",
           rows, loss[1], loss[0]);
    EXPECT(rel_err_f32(p1, p0, MB * MT) < tol, "chunks of %d: per-token losses rel err %g", rows,
           rel_err_f32(p1, p0, MB * MT));
    EXPECT(rel_err_f32(l1, l0, nl) < tol, "chunks of %d: logits rel err %g", rows,
           rel_err_f32(l1, l0, nl));
    for (int i = 0; i < gpt_num_tensors(whole); i++) {
        const ParamTensor *t = gpt_tensor(whole, i);
        const double e = rel_err_f32(g1 + t->offset, g0 + t->offset, t->numel);
        EXPECT(e < tol, "chunks of %d: grad %s rel err %g", rows, t->name, e);
    }
    EXPECT(!all_zero(g1, c.n), "chunks of %d: gradients are not all zero", rows);
    free(l0), free(l1), free(g0), free(g1);
    gpt_free(chunked);
    case_close(&c);
}

// Rows per classifier chunk outside [1, B*T] come back as an error, the process goes on, and
// the chunking is as it was (the model still computes).
static void test_head_rows_refused(void) {
    ModelCase c;
    case_open(&c, POS_LEARNED, NULL, 1, 2);
    char err[ERR_LEN] = "";
    EXPECT(gpt_set_head_rows(c.m, 0, err, sizeof err) == -1 && strstr(err, "0 rows per classifier chunk: need 1 to"),
           "0 rows: '%s'", err);
    err[0] = '\0';
    EXPECT(gpt_set_head_rows(c.m, MB * MT + 1, err, sizeof err) == -1 && strstr(err, "need 1 to"),
           "%d rows: '%s'", MB * MT + 1, err);
    EXPECT(gpt_set_head_rows(c.m, MB * MT, err, sizeof err) == 0, "%d rows refused: %s", MB * MT, err);
    const float loss = gpt_forward(c.m, c.tokens, c.targets, MB, MT);
    EXPECT(isfinite(loss), "forward after a refused chunk size: loss %g", loss);
    case_close(&c);
}

// Runs fn in a child process with stderr silenced; returns its exit code (-1 if it crashed).
static int exit_code_of(void (*fn)(void)) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        freopen("/dev/null", "w", stderr);
        fn();
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void create_rope_odd_head(void) {
    GPTConfig g = small_config(POS_ROPE);
    g.NH = 64;
    g.NKV = 64;
    g.HS = 1;
    gpt_create(&g, backend_cpu_create(), 1, 8, NULL);
}

static void create_with_rope_dims(PosEmbedding pos, int rope_dims) {
    GPTConfig g = small_config(pos);
    g.rope_dims = rope_dims;
    gpt_create(&g, backend_cpu_create(), 1, 8, NULL);
}
static void create_rope_dims_odd(void) { create_with_rope_dims(POS_ROPE, 5); }
static void create_rope_dims_too_large(void) { create_with_rope_dims(POS_ROPE, small_config(POS_ROPE).HS + 2); }
static void create_rope_dims_learned(void) { create_with_rope_dims(POS_LEARNED, 4); }

static void create_docs_without_eot(void) {
    GPTConfig g = small_config(POS_ROPE);
    Config run;
    config_defaults(&run);
    run.attention.doc_mask = 1;
    gpt_create(&g, backend_cpu_create(), 1, 8, &run);
}

static void create_too_long(void) {
    GPTConfig g = small_config(POS_LEARNED);
    gpt_create(&g, backend_cpu_create(), 1, g.maxT + 1, NULL);
}

static void create_bad_heads(void) {
    GPTConfig g = small_config(POS_LEARNED);
    g.NKV = 3;
    gpt_create(&g, backend_cpu_create(), 1, 8, NULL);
}

static void forward_bad_token(void) {
    GPTConfig g = small_config(POS_LEARNED);
    GPT *m = gpt_create(&g, backend_cpu_create(), 1, 4, NULL);
    int tokens[4] = {1, 2, g.V, 3};
    gpt_forward(m, tokens, NULL, 1, 4);
}

static void forward_too_big(void) {
    GPTConfig g = small_config(POS_LEARNED);
    GPT *m = gpt_create(&g, backend_cpu_create(), 1, 4, NULL);
    int tokens[10] = {0};
    gpt_forward(m, tokens, NULL, 2, 5);
}

int main(void) {
    Backend *be = backend_cpu_create();
    Rng r;
    rng_seed(&r, 1);
    TEST_CASE("dtype names and sizes", {
        EXPECT(dtype_size(DTYPE_F32) == 4 && dtype_size(DTYPE_BF16) == 2 && dtype_size(DTYPE_F16) == 2,
               "sizes");
        EXPECT(strcmp(dtype_name(DTYPE_BF16), "bf16") == 0, "name %s", dtype_name(DTYPE_BF16));
    });
    TEST_CASE("cpu embed forward/backward", test_embed(be, &r, 3, 7, 13));
    TEST_CASE("cpu embed forward/backward (threaded)", test_embed(be, &r, 4, 130, 70));
    TEST_CASE("cpu layernorm forward/backward", test_layernorm(be, &r, 19, 37));
    TEST_CASE("cpu layernorm forward/backward (threaded)", test_layernorm(be, &r, 300, 131));
    TEST_CASE("cpu matmul (no epilogue, no bias)", test_matmul(be, &r, EPI_NONE, 0, 37, 29, 51));
    TEST_CASE("cpu matmul (bias)", test_matmul(be, &r, EPI_NONE, 1, 37, 29, 51));
    TEST_CASE("cpu matmul (bias + gelu)", test_matmul(be, &r, EPI_GELU, 1, 37, 29, 51));
    TEST_CASE("cpu matmul (bias + gelu, threaded)", test_matmul(be, &r, EPI_GELU, 1, 263, 67, 131));
    TEST_CASE("cpu matmul (threaded, wide output)", test_matmul(be, &r, EPI_NONE, 1, 61, 67, 523));
    TEST_CASE("cpu add", test_add(be, &r, 1001));
    TEST_CASE("cpu add (threaded)", test_add(be, &r, 40009));
    TEST_CASE("cpu dropout p 0.2", test_dropout_op(be, &r, 1001, 0.2f));
    TEST_CASE("cpu dropout inside add, add+ln, ln backward", test_fused_dropout(be, &r, 7, 37, 0.2f));
    TEST_CASE("cpu dropout inside add, add+ln, ln backward (threaded)", test_fused_dropout(be, &r, 300, 131, 0.5f));
    TEST_CASE("cpu dropout p 0.5 (threaded)", test_dropout_op(be, &r, 40009, 0.5f));
    TEST_CASE("cpu dropout p 0.9 (threaded)", test_dropout_op(be, &r, 100003, 0.9f));
    TEST_CASE("cpu softmax cross-entropy (ignored rows, padded columns)", test_softmax_xent(be, &r, 13));
    TEST_CASE("cpu softmax cross-entropy (threaded)", test_softmax_xent(be, &r, 301));
    TEST_CASE("cpu attention on fused qkv (GQA)", test_attention(be, &r));
    TEST_CASE("cpu rope forward/backward (positions i % T)", test_rope_op(be, &r, 0, 0));
    TEST_CASE("cpu rope forward/backward (explicit positions)", test_rope_op(be, &r, 1, 0));
    TEST_CASE("cpu rope forward/backward (rope_dims 6 of 16)", test_rope_op(be, &r, 1, 6));
    TEST_CASE("rope table: rope_dims = head size is the default table", test_rope_table_full());
    be->destroy(be);
    TEST_CASE("gpt parameter layout and init", test_layout_and_init());
    TEST_CASE("gpt loss, ignored targets, smaller batch", test_loss_and_small_batch());
    TEST_CASE("gpt gradients vs finite differences (learned)",
              test_gradients(POS_LEARNED, -1, 0.0f, SINGLE_DOC));
    TEST_CASE("gpt gradients vs finite differences (alibi, window 8)",
              test_gradients(POS_ALIBI, 8, 0.0f, SINGLE_DOC));
    TEST_CASE("gpt gradients vs finite differences (learned, attention and residual dropout 0.2)",
              test_gradients(POS_LEARNED, -1, 0.2f, SINGLE_DOC));
    TEST_CASE("gpt gradients vs finite differences (rope, GQA)",
              test_gradients(POS_ROPE, -1, 0.0f, SINGLE_DOC));
    TEST_CASE("gpt gradients vs finite differences (rope, packed documents, window 6 on even layers)",
              test_gradients(POS_ROPE, 6, 0.0f, PACKED_DOCS));
    TEST_CASE("gpt gradients vs finite differences (learned, packed documents, dropout 0.1)",
              test_gradients(POS_LEARNED, -1, 0.1f, PACKED_DOCS));
    TEST_CASE("gpt padded vocabulary never wins", test_padded_vocab());
    TEST_CASE("gpt gradient accumulation and grad_scale", test_accumulation());
    TEST_CASE("gpt decode == forward (learned)", test_decode(POS_LEARNED, -1, 1));
    TEST_CASE("gpt decode == forward (learned, window 8)", test_decode(POS_LEARNED, 8, 1));
    TEST_CASE("gpt decode == forward (alibi)", test_decode(POS_ALIBI, -1, 1));
    TEST_CASE("gpt decode == forward (rope)", test_decode(POS_ROPE, -1, 1));
    TEST_CASE("gpt decode == forward (rope, window 8 on even layers)", test_decode(POS_ROPE, 8, 2));
    TEST_CASE("gpt packed documents == each document alone (learned)", test_documents(POS_LEARNED));
    TEST_CASE("gpt packed documents == each document alone (rope)", test_documents(POS_ROPE));
    TEST_CASE("gpt packed documents == each document alone (alibi)", test_documents(POS_ALIBI));
    TEST_CASE("gpt attention dropout", test_dropout(0.3f, 0.0f));
    TEST_CASE("gpt residual dropout", test_dropout(0.0f, 0.3f));
    TEST_CASE("gpt attention and residual dropout", test_dropout(0.2f, 0.2f));
    TEST_CASE("gpt dropout counted from a base in backend memory", test_dropout_base());
    TEST_CASE("gpt recompute attn_gelu == none", test_recompute("attn_gelu", POS_LEARNED, SINGLE_DOC));
    TEST_CASE("gpt recompute block == none", test_recompute("block", POS_LEARNED, SINGLE_DOC));
    TEST_CASE("gpt recompute block == none (rope, packed documents)",
              test_recompute("block", POS_ROPE, PACKED_DOCS));
    TEST_CASE("gpt recompute attn_gelu == none (rope, packed documents)",
              test_recompute("attn_gelu", POS_ROPE, PACKED_DOCS));
    TEST_CASE("gpt classifier in chunks of 7 rows == one chunk", test_head_chunks(7));
    TEST_CASE("gpt classifier in chunks of 1 row == one chunk", test_head_chunks(1));
    TEST_CASE("gpt classifier in chunks of 110 of 111 rows == one chunk", test_head_chunks(MB * MT - 1));
    TEST_CASE("synthetic retrieval task", test_retrieval_task());
    TEST_CASE("gpt bad input exits with code 2", {
        EXPECT(exit_code_of(create_rope_odd_head) == 2, "rope with an odd head size");
        EXPECT(exit_code_of(create_rope_dims_odd) == 2, "odd rope_dims");
        EXPECT(exit_code_of(create_rope_dims_too_large) == 2, "rope_dims above the head size");
        EXPECT(exit_code_of(create_rope_dims_learned) == 2, "rope_dims without rope");
        EXPECT(exit_code_of(create_docs_without_eot) == 2, "doc_mask without data.eot_token");
        EXPECT(exit_code_of(create_too_long) == 2, "T > max_seq_len");
        EXPECT(exit_code_of(create_bad_heads) == 2, "n_kv_head not dividing n_head");
        EXPECT(exit_code_of(forward_bad_token) == 2, "token id >= vocab_size");
        EXPECT(exit_code_of(forward_too_big) == 2, "batch larger than built for");
    });
    TEST_CASE("gpt_set_head_rows refuses a bad chunk size with an error", test_head_rows_refused());
    return TEST_SUMMARY();
}
