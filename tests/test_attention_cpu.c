// test_attention_cpu: the CPU attention reference (flash and naive) against each other, against a
// test-local float64 forward with an explicitly built mask, and its backward against central
// finite differences of that float64 forward; plus attn_check's bad-input paths, the mask rules,
// dropout statistics, strided (fused QKV) layouts and fully masked rows.
//
// Tolerances: fp32 has unit roundoff u = 2^-24 ~ 6e-8; all errors are norm-wise relative.
// - Forward, the flash-attention rule: the flash error against float64 must stay within 2x the
//   error of the straightforward fp32 implementation (naive) plus a floor of a few u, since where
//   the naive error is itself ~1 u (T = 1) single roundings decide the ratio.
// - Gradients: no float64 reference on the large shapes (finite differences cover small ones),
//   so flash and naive - two different fp32 algorithms (online vs two-pass softmax, D =
//   rowsum(dO * O) vs rowsum(P * dP)) - are compared with each other, see GRAD_TOL.
// - Finite differences, see FD_STEP and FD_TOL.
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "attention/attention.h"
#include "attention/mask.h"
#include "common/rng.h"
#include "tests/attn_contiguous.h"
#include "tests/testlib.h"

#define FP32_U 5.9604644775390625e-8  // 2^-24, fp32 unit roundoff

#define FWD_FLOOR (8 * FP32_U)
// The naive fp32 forward against float64: its sums of T_k terms and dot products of HS terms
// are recursive fp32 sums, random-walk error ~sqrt(T_k) u; 4x margin.
#define NAIVE_FWD_TOL(T_k) (4 * sqrt((double)(T_k)) * FP32_U + FWD_FLOOR)
// Gradients, flash vs naive: each is a sum of products with a few u of norm-wise error, and the
// softmax gradient P * (dP - D) cancels where dP ~ D, magnifying it by |dP| / |dP - D| (~10 for
// unit-normal inputs). Norm-wise the errors average out instead of growing with T (measured: at
// most 15 u over the sweep, T = 1 .. 1000), so 64 u = magnification x a few u x 2 margin.
#define GRAD_TOL (64 * FP32_U)
// Finite differences of the float64 forward with step h: truncation error ~h^2 |f'''| ~ 1e-8 and
// roundoff ~1e-16 |L| / h ~ 1e-11, so the FD gradient is exact to ~0.2 u and the comparison
// measures the fp32 backward alone: a few u times the |dP| / |dP - D| magnification, as above
// (measured: at most 5 u on these shapes).
#define FD_STEP 1e-4
#define FD_TOL (32 * FP32_U)

typedef struct {
    int B, T_q, T_k, NH, NKV, HS;
    int causal, window_left, window_right;
    int alibi, docs;
    float dropout;
} Shape;

// Inputs of one problem, contiguous (B, T, heads, HS), plus the masks' side data.
typedef struct {
    Shape s;
    float *q, *k, *v, *dout;  // (B, T_q, NH, HS), (B, T_k, NKV, HS) x2, (B, T_q, NH, HS)
    float *slopes;            // (NH)
    int *cu;                  // (n_docs + 1)
    int n_docs;
} Inputs;

typedef struct {
    float *out, *lse, *dq, *dk, *dv;  // like q, (B, NH, T_q), like q, k, v
} Outputs;

static size_t n_q(const Shape *s) { return (size_t)s->B * s->T_q * s->NH * s->HS; }
static size_t n_kv(const Shape *s) { return (size_t)s->B * s->T_k * s->NKV * s->HS; }
static size_t n_lse(const Shape *s) { return (size_t)s->B * s->NH * s->T_q; }

static void fill_normal(Rng *r, float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = rng_normal(r);
}

static Inputs inputs_make(Shape s, uint64_t seed) {
    Rng r;
    rng_seed(&r, seed);
    Inputs in = {.s = s};
    in.q = malloc(sizeof(float) * n_q(&s));
    in.k = malloc(sizeof(float) * n_kv(&s));
    in.v = malloc(sizeof(float) * n_kv(&s));
    in.dout = malloc(sizeof(float) * n_q(&s));
    fill_normal(&r, in.q, n_q(&s));
    fill_normal(&r, in.k, n_kv(&s));
    fill_normal(&r, in.v, n_kv(&s));
    fill_normal(&r, in.dout, n_q(&s));
    in.slopes = malloc(sizeof(float) * s.NH);
    for (int h = 0; h < s.NH; h++) in.slopes[h] = powf(2.0f, -8.0f * (h + 1) / s.NH);
    // Documents: each batch row cut at random points (lengths 1..T/3+1), so rows start documents.
    in.cu = malloc(sizeof(int) * ((size_t)s.B * s.T_q + 1));
    in.cu[0] = 0;
    for (int b = 0; b < s.B; b++) {
        int t = 0;
        while (t < s.T_q) {
            t += 1 + (int)rng_below(&r, (uint64_t)(s.T_q / 3 + 1));
            if (t > s.T_q) t = s.T_q;
            in.cu[++in.n_docs] = b * s.T_q + t;
        }
    }
    return in;
}

static void inputs_free(Inputs *in) {
    free(in->q); free(in->k); free(in->v); free(in->dout); free(in->slopes); free(in->cu);
}

static Outputs outputs_make(const Shape *s) {
    Outputs o = {malloc(sizeof(float) * n_q(s)), malloc(sizeof(float) * n_lse(s)),
                 malloc(sizeof(float) * n_q(s)), malloc(sizeof(float) * n_kv(s)),
                 malloc(sizeof(float) * n_kv(s))};
    return o;
}

static void outputs_free(Outputs *o) { free(o->out); free(o->lse); free(o->dq); free(o->dk); free(o->dv); }

static void poison(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = NAN;
}

// Params over contiguous inputs and outputs.
static AttnParams params_make(const Inputs *in, const Outputs *o, AttnImpl impl) {
    const Shape *s = &in->s;
    const AttnTensors t = {in->q, in->k, in->v, in->dout, o->out, o->dq, o->dk, o->dv, o->lse};
    const AttnShape sh = {s->B, s->T_q, s->T_k, s->NH, s->NKV, s->HS, s->causal, -1};
    AttnParams p = attn_contiguous(&t, &sh);
    p.window_left = s->window_left;
    p.window_right = s->window_right;
    p.alibi_slopes = s->alibi ? in->slopes : NULL;
    p.cu_seqlens = s->docs ? in->cu : NULL;
    p.n_docs = s->docs ? in->n_docs : 0;
    p.dropout_p = s->dropout;
    p.seed = 1234;
    p.offset = 77;
    p.dtype = DTYPE_F32;
    p.impl = impl;
    return p;
}

// Poisons the outputs (NaN), checks the params and runs forward and backward.
static void run_contiguous(const Inputs *in, Outputs *o, AttnImpl impl) {
    const Shape *s = &in->s;
    poison(o->out, n_q(s)); poison(o->lse, n_lse(s)); poison(o->dq, n_q(s));
    poison(o->dk, n_kv(s)); poison(o->dv, n_kv(s));
    AttnParams p = params_make(in, o, impl);
    char err[256];
    int ok = attn_check(&p, DEVICE_CPU, 1, err, sizeof err) == 0;
    EXPECT(ok, "attn_check rejected a valid problem: %s", err);
    if (!ok) return;
    attn_forward_cpu(&p);
    attn_backward_cpu(&p);
}

// ---------------------------------------------------------------------------------------------
// Float64 reference with an explicitly built mask (independent of attention/mask.h).

static int doc_of(const Inputs *in, int g) {
    int d = 0;
    while (in->cu[d + 1] <= g) d++;
    return d;
}

static int explicit_visible(const Inputs *in, int b, int i, int j) {
    const Shape *s = &in->s;
    int pos = i + s->T_k - s->T_q;
    if (s->causal && j > pos) return 0;
    if (s->window_left >= 0 && j < pos - s->window_left) return 0;
    if (s->window_right >= 0 && j > pos + s->window_right) return 0;
    if (s->docs && doc_of(in, b * s->T_q + i) != doc_of(in, b * s->T_k + j)) return 0;
    return 1;
}

static unsigned char *explicit_mask(const Inputs *in) {  // (B, T_q, T_k)
    const Shape *s = &in->s;
    unsigned char *m = malloc((size_t)s->B * s->T_q * s->T_k);
    for (int b = 0; b < s->B; b++)
        for (int i = 0; i < s->T_q; i++)
            for (int j = 0; j < s->T_k; j++)
                m[((size_t)b * s->T_q + i) * s->T_k + j] = (unsigned char)explicit_visible(in, b, i, j);
    return m;
}

// out (B, T_q, NH, HS) and lse (B, NH, T_q) in float64 from contiguous float64 q, k, v. Dropout
// keeps come from attn_dropout_keep (the API under test defines the mask; its statistics are
// checked separately). `p` supplies sizes, scale, slopes and the dropout seed.
static void ref_forward(const AttnParams *p, const unsigned char *mask, const double *q,
                        const double *k, const double *v, double *out, double *lse) {
    const int HS = p->HS, T_q = p->T_q, T_k = p->T_k, NH = p->NH, NKV = p->NKV;
    double *srow = malloc(sizeof(double) * T_k);
    for (int b = 0; b < p->B; b++)
        for (int h = 0; h < NH; h++) {
            const int g = h / (NH / NKV);
            for (int i = 0; i < T_q; i++) {
                const double *qi = q + (((size_t)b * T_q + i) * NH + h) * HS;
                double mx = -INFINITY;
                for (int j = 0; j < T_k; j++) {
                    srow[j] = -INFINITY;
                    if (!mask[((size_t)b * T_q + i) * T_k + j]) continue;
                    const double *kj = k + (((size_t)b * T_k + j) * NKV + g) * HS;
                    double dot = 0;
                    for (int d = 0; d < HS; d++) dot += qi[d] * kj[d];
                    srow[j] = dot * p->scale;
                    if (p->alibi_slopes)
                        srow[j] -= (double)p->alibi_slopes[h] * fabs((double)(i + T_k - T_q - j));
                    if (srow[j] > mx) mx = srow[j];
                }
                double *oi = out + (((size_t)b * T_q + i) * NH + h) * HS;
                for (int d = 0; d < HS; d++) oi[d] = 0;
                double *l = lse + ((size_t)b * NH + h) * T_q + i;
                if (mx == -INFINITY) {
                    *l = INFINITY;
                    continue;
                }
                double sum = 0;
                for (int j = 0; j < T_k; j++) sum += exp(srow[j] - mx);
                *l = mx + log(sum);
                for (int j = 0; j < T_k; j++) {
                    double pj = exp(srow[j] - mx) / sum;
                    if (p->dropout_p > 0)
                        pj = attn_dropout_keep(p, b, h, i, j) ? pj * attn_dropout_keep_scale(p) : 0;
                    if (pj == 0) continue;
                    const double *vj = v + (((size_t)b * T_k + j) * NKV + g) * HS;
                    for (int d = 0; d < HS; d++) oi[d] += pj * vj[d];
                }
            }
        }
    free(srow);
}

static double *to_double(const float *x, size_t n) {
    double *y = malloc(sizeof(double) * n);
    for (size_t i = 0; i < n; i++) y[i] = x[i];
    return y;
}

// ||a - ref|| / ||ref|| over finite reference entries; a non-finite entry of `a` where the
// reference is finite (or a mismatch of infinities) counts as an infinite error.
static double err_vs_ref(const float *a, const double *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(ref[i])) {
            if (a[i] != ref[i]) return INFINITY;
            continue;
        }
        if (!isfinite(a[i])) return INFINITY;
        num += (a[i] - ref[i]) * (a[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static double err_f32(const float *a, const float *b, size_t n) {
    double *bd = to_double(b, n);
    double e = err_vs_ref(a, bd, n);
    free(bd);
    return e;
}

static int all_finite_or_inf_lse(const Outputs *o, const Shape *s) {
    size_t nq = n_q(s), nk = n_kv(s);
    for (size_t i = 0; i < nq; i++)
        if (!isfinite(o->out[i]) || !isfinite(o->dq[i])) return 0;
    for (size_t i = 0; i < nk; i++)
        if (!isfinite(o->dk[i]) || !isfinite(o->dv[i])) return 0;
    for (size_t i = 0; i < n_lse(s); i++)
        if (isnan(o->lse[i]) || o->lse[i] == -INFINITY) return 0;
    return 1;
}

// ---------------------------------------------------------------------------------------------

static void describe(char *buf, size_t n, const Shape *s) {
    snprintf(buf, n, "B=%d T_q=%d T_k=%d NH=%d NKV=%d HS=%d causal=%d window=(%d,%d)%s%s dropout=%g",
             s->B, s->T_q, s->T_k, s->NH, s->NKV, s->HS, s->causal, s->window_left, s->window_right,
             s->alibi ? " alibi" : "", s->docs ? " docs" : "", s->dropout);
}

// Flash vs naive (forward and backward) and both forwards vs the float64 reference.
static void check_flash_vs_naive(Shape s, uint64_t seed) {
    char name[256];
    describe(name, sizeof name, &s);
    Inputs in = inputs_make(s, seed);
    Outputs fl = outputs_make(&s), nv = outputs_make(&s);
    run_contiguous(&in, &fl, ATTN_IMPL_FLASH);
    run_contiguous(&in, &nv, ATTN_IMPL_NAIVE);

    AttnParams p = params_make(&in, &fl, ATTN_IMPL_FLASH);
    unsigned char *mask = explicit_mask(&in);
    double *qd = to_double(in.q, n_q(&s)), *kd = to_double(in.k, n_kv(&s)), *vd = to_double(in.v, n_kv(&s));
    double *out = malloc(sizeof(double) * n_q(&s)), *lse = malloc(sizeof(double) * n_lse(&s));
    ref_forward(&p, mask, qd, kd, vd, out, lse);

    double e_out_f = err_vs_ref(fl.out, out, n_q(&s)), e_out_n = err_vs_ref(nv.out, out, n_q(&s));
    double e_lse_f = err_vs_ref(fl.lse, lse, n_lse(&s)), e_lse_n = err_vs_ref(nv.lse, lse, n_lse(&s));
    const double naive_tol = NAIVE_FWD_TOL(s.T_k);
    EXPECT(e_out_n <= naive_tol && e_lse_n <= naive_tol, "%s: naive vs float64 out %.3g lse %.3g (tol %.3g)",
           name, e_out_n, e_lse_n, naive_tol);
    EXPECT(e_out_f <= 2 * e_out_n + FWD_FLOOR, "%s: flash out error %.3g > 2 x naive %.3g + floor", name,
           e_out_f, e_out_n);
    EXPECT(e_lse_f <= 2 * e_lse_n + FWD_FLOOR, "%s: flash lse error %.3g > 2 x naive %.3g + floor", name,
           e_lse_f, e_lse_n);

    double e_dq = err_f32(fl.dq, nv.dq, n_q(&s)), e_dk = err_f32(fl.dk, nv.dk, n_kv(&s)),
           e_dv = err_f32(fl.dv, nv.dv, n_kv(&s));
    EXPECT(e_dq <= GRAD_TOL && e_dk <= GRAD_TOL && e_dv <= GRAD_TOL, "%s: flash vs naive dq %.3g dk %.3g dv %.3g (tol %.3g)",
           name, e_dq, e_dk, e_dv, GRAD_TOL);
    EXPECT(all_finite_or_inf_lse(&fl, &s) && all_finite_or_inf_lse(&nv, &s), "%s: non-finite output", name);
    if (getenv("ATTN_TEST_VERBOSE"))
        printf("  %s: out f %.2e n %.2e | lse f %.2e n %.2e | dq %.2e dk %.2e dv %.2e\n", name, e_out_f,
               e_out_n, e_lse_f, e_lse_n, e_dq, e_dk, e_dv);

    free(mask); free(qd); free(kd); free(vd); free(out); free(lse);
    outputs_free(&fl); outputs_free(&nv); inputs_free(&in);
}

static void test_flash_vs_naive(void) {
    // {B, T_q, T_k, NH, NKV, HS, causal, window_left, window_right, alibi, docs, dropout}
    const Shape shapes[] = {
        {1, 1, 1, 1, 1, 16, 1, -1, -1, 0, 0, 0},
        {2, 2, 2, 2, 1, 8, 1, -1, -1, 0, 0, 0},
        {3, 17, 17, 4, 2, 32, 0, -1, -1, 0, 0, 0},
        {2, 97, 97, 4, 4, 64, 1, -1, -1, 1, 0, 0},
        {1, 256, 256, 6, 2, 64, 1, -1, -1, 0, 0, 0},
        {1, 1000, 1000, 2, 1, 32, 1, 100, -1, 0, 0, 0},
        {1, 1000, 1000, 2, 2, 24, 0, -1, -1, 0, 0, 0},
        {2, 17, 97, 4, 1, 16, 1, -1, -1, 0, 0, 0},
        {1, 97, 256, 2, 2, 32, 0, 30, 10, 0, 0, 0},
        {2, 1, 1000, 4, 2, 32, 1, -1, -1, 1, 0, 0},
        {2, 97, 97, 4, 2, 32, 1, -1, -1, 0, 1, 0},
        {2, 256, 256, 2, 2, 32, 0, 40, -1, 1, 1, 0},
        {2, 97, 97, 2, 1, 32, 1, -1, -1, 0, 0, 0.2f},
        {1, 200, 17, 2, 1, 16, 0, -1, 0, 0, 0, 0},
        {1, 65, 129, 3, 1, 5, 1, 64, -1, 0, 0, 0.5f},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) check_flash_vs_naive(shapes[i], 100 + i);
}

// Central finite differences of the float64 forward's loss L = sum(out * dout) against the fp32
// backward of both implementations, for every element of q, k and v.
static void check_finite_differences(Shape s, uint64_t seed) {
    char name[256];
    describe(name, sizeof name, &s);
    Inputs in = inputs_make(s, seed);
    Outputs o = outputs_make(&s);
    AttnParams p = params_make(&in, &o, ATTN_IMPL_FLASH);
    unsigned char *mask = explicit_mask(&in);
    size_t nq = n_q(&s), nk = n_kv(&s);
    double *x[3] = {to_double(in.q, nq), to_double(in.k, nk), to_double(in.v, nk)};
    size_t nx[3] = {nq, nk, nk};
    double *out = malloc(sizeof(double) * nq), *lse = malloc(sizeof(double) * n_lse(&s));
    double *fd[3];
    for (int t = 0; t < 3; t++) {
        fd[t] = malloc(sizeof(double) * nx[t]);
        for (size_t e = 0; e < nx[t]; e++) {
            const double x0 = x[t][e];
            double loss[2];
            for (int side = 0; side < 2; side++) {
                x[t][e] = x0 + (side ? -FD_STEP : FD_STEP);
                ref_forward(&p, mask, x[0], x[1], x[2], out, lse);
                loss[side] = 0;
                for (size_t i = 0; i < nq; i++) loss[side] += out[i] * in.dout[i];
            }
            x[t][e] = x0;
            fd[t][e] = (loss[0] - loss[1]) / (2 * FD_STEP);
        }
    }
    for (int impl = 0; impl < 2; impl++) {
        run_contiguous(&in, &o, impl ? ATTN_IMPL_NAIVE : ATTN_IMPL_FLASH);
        double e[3] = {err_vs_ref(o.dq, fd[0], nq), err_vs_ref(o.dk, fd[1], nk), err_vs_ref(o.dv, fd[2], nk)};
        EXPECT(e[0] <= FD_TOL && e[1] <= FD_TOL && e[2] <= FD_TOL,
               "%s %s: backward vs finite differences dq %.3g dk %.3g dv %.3g (tol %.3g)", name,
               impl ? "naive" : "flash", e[0], e[1], e[2], FD_TOL);
        if (getenv("ATTN_TEST_VERBOSE"))
            printf("  FD %s %s: dq %.2e dk %.2e dv %.2e\n", name, impl ? "naive" : "flash", e[0], e[1], e[2]);
    }
    for (int t = 0; t < 3; t++) { free(x[t]); free(fd[t]); }
    free(mask); free(out); free(lse);
    outputs_free(&o); inputs_free(&in);
}

static void test_finite_differences(void) {
    const Shape shapes[] = {
        {2, 9, 9, 2, 2, 8, 1, -1, -1, 0, 0, 0},      // causal
        {1, 13, 13, 2, 1, 8, 1, 4, -1, 0, 0, 0},     // causal + sliding window
        {1, 11, 16, 4, 2, 4, 0, 3, 2, 0, 0, 0},      // GQA, two-sided window, T_q < T_k
        {1, 16, 16, 3, 1, 8, 1, -1, -1, 1, 0, 0},    // MQA + ALiBi
        {2, 12, 12, 2, 1, 4, 1, -1, -1, 0, 1, 0},    // documents
        {1, 10, 10, 2, 1, 8, 1, -1, -1, 0, 0, 0.3f}, // dropout: same seed in forward and backward
        {1, 12, 6, 2, 2, 4, 0, -1, 0, 0, 0, 0},      // fully masked rows (T_q > T_k, window right 0)
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) check_finite_differences(shapes[i], 200 + i);
}

// Rows whose key range is empty: T_q > T_k aligns the first T_q - T_k queries before key 0, and
// window_right = 0 hides every key after the aligned position.
static void test_fully_masked_rows(void) {
    Shape s = {2, 100, 70, 3, 1, 16, 0, -1, 0, 0, 0, 0};
    Inputs in = inputs_make(s, 7);
    for (int impl = 0; impl < 2; impl++) {
        Outputs o = outputs_make(&s);
        run_contiguous(&in, &o, impl ? ATTN_IMPL_NAIVE : ATTN_IMPL_FLASH);
        int masked_ok = 1, others_ok = 1;
        for (int b = 0; b < s.B; b++)
            for (int h = 0; h < s.NH; h++)
                for (int i = 0; i < s.T_q; i++) {
                    float l = o.lse[((size_t)b * s.NH + h) * s.T_q + i];
                    const float *out = o.out + (((size_t)b * s.T_q + i) * s.NH + h) * s.HS;
                    const float *dq = o.dq + (((size_t)b * s.T_q + i) * s.NH + h) * s.HS;
                    if (i < s.T_q - s.T_k) {
                        masked_ok &= l == INFINITY;
                        for (int d = 0; d < s.HS; d++) masked_ok &= out[d] == 0.0f && dq[d] == 0.0f;
                    } else {
                        others_ok &= isfinite(l);
                    }
                }
        EXPECT(masked_ok, "%s: fully masked rows must give out 0, dq 0 and lse +inf", impl ? "naive" : "flash");
        EXPECT(others_ok && all_finite_or_inf_lse(&o, &s), "%s: NaN or inf outside the masked rows",
               impl ? "naive" : "flash");
        outputs_free(&o);
    }
    inputs_free(&in);
}

// attn_visible against the explicitly built mask over random rule combinations.
static void test_visible_rules(void) {
    Rng r;
    rng_seed(&r, 5);
    int mismatches = 0;
    for (int trial = 0; trial < 60; trial++) {
        Shape s = {1 + (int)rng_below(&r, 3), 0, 0, 2, 1, 8, (int)rng_below(&r, 2),
                   (int)rng_below(&r, 12) - 1, (int)rng_below(&r, 12) - 1, 0, (int)rng_below(&r, 2), 0};
        s.T_k = 1 + (int)rng_below(&r, 40);
        s.T_q = s.docs ? s.T_k : 1 + (int)rng_below(&r, (uint64_t)(s.causal ? s.T_k : 60));
        Inputs in = inputs_make(s, 300 + trial);
        Outputs o = outputs_make(&s);
        AttnParams p = params_make(&in, &o, ATTN_IMPL_FLASH);
        char err[256];
        EXPECT(attn_check(&p, DEVICE_CPU, 1, err, sizeof err) == 0, "valid random problem rejected: %s", err);
        for (int b = 0; b < s.B; b++)
            for (int i = 0; i < s.T_q; i++)
                for (int j = 0; j < s.T_k; j++) mismatches += attn_visible(&p, b, i, j) != explicit_visible(&in, b, i, j);
        outputs_free(&o);
        inputs_free(&in);
    }
    EXPECT(mismatches == 0, "attn_visible disagrees with the explicit mask in %d places", mismatches);
}

// Keep rate 1 - p within 5 standard deviations, masks differ across seeds and offsets, and the
// mask is the documented Philox draw of element e = ((b*NH + h)*T_q + i)*T_k + j.
static void test_dropout_statistics(void) {
    Shape s = {2, 128, 128, 4, 4, 8, 0, -1, -1, 0, 0, 0};
    Inputs in = inputs_make(s, 9);
    Outputs o = outputs_make(&s);
    const float rates[] = {0.1f, 0.5f, 0.9f};
    for (int ri = 0; ri < 3; ri++) {
        AttnParams p = params_make(&in, &o, ATTN_IMPL_FLASH);
        p.dropout_p = rates[ri];
        long kept = 0, n = 0, differ_seed = 0, differ_offset = 0;
        AttnParams p2 = p, p3 = p;
        p2.seed = p.seed + 1;
        p3.offset = p.offset + 1;
        for (int b = 0; b < s.B; b++)
            for (int h = 0; h < s.NH; h++)
                for (int i = 0; i < s.T_q; i++)
                    for (int j = 0; j < s.T_k; j++) {
                        int keep = attn_dropout_keep(&p, b, h, i, j);
                        kept += keep;
                        n++;
                        differ_seed += keep != attn_dropout_keep(&p2, b, h, i, j);
                        differ_offset += keep != attn_dropout_keep(&p3, b, h, i, j);
                    }
        // Elements survive at 1 - round(256 p) / 256, the inverse of the survivors' scale.
        double rate = (double)kept / n, expect = 1.0 / attn_dropout_keep_scale(&p);
        double sigma = sqrt(rates[ri] * (1.0 - rates[ri]) / n);
        EXPECT(fabs(expect - (1.0 - rates[ri])) <= 1.0 / 512, "dropout %.1f: the rate used, %.5f, is not p to the "
               "nearest 1/256", rates[ri], 1.0 - expect);
        EXPECT(fabs(rate - expect) <= 5 * sigma, "dropout %.1f: keep rate %.5f, expected %.5f +- %.5f",
               rates[ri], rate, expect, 5 * sigma);
        // Two independent masks disagree with probability 2p(1-p).
        double expect_differ = 2.0 * rates[ri] * (1.0 - rates[ri]);
        EXPECT(fabs((double)differ_seed / n - expect_differ) < 0.02 &&
                   fabs((double)differ_offset / n - expect_differ) < 0.02,
               "dropout %.1f: seed/offset change altered %.4f / %.4f of the mask, expected %.4f", rates[ri],
               (double)differ_seed / n, (double)differ_offset / n, expect_differ);
    }
    AttnParams p = params_make(&in, &o, ATTN_IMPL_FLASH);
    p.dropout_p = 0.0f;
    int all_kept = 1;
    for (int j = 0; j < s.T_k; j++) all_kept &= attn_dropout_keep(&p, 1, 2, 3, j);
    EXPECT(all_kept, "dropout 0 must keep everything");
    outputs_free(&o);
    inputs_free(&in);
}

// Inputs inside one fused (B, T, (NH + 2 NKV) * HS) buffer as the model holds them, dq/dk/dv into a
// fused gradient buffer of the same layout, out head-major (B, NH, T, HS): the same numbers as the
// contiguous run (bitwise for flash, which computes on tile copies in a fixed order).
static void check_strided(Shape s, AttnImpl impl) {
    char name[256];
    describe(name, sizeof name, &s);
    Inputs in = inputs_make(s, 11);
    Outputs ref = outputs_make(&s);
    run_contiguous(&in, &ref, impl);

    const int T = s.T_q, W = (s.NH + 2 * s.NKV) * s.HS;
    const size_t n_fused = (size_t)s.B * T * W;
    float *qkv = malloc(sizeof(float) * n_fused), *dqkv = malloc(sizeof(float) * n_fused);
    for (int b = 0; b < s.B; b++)
        for (int t = 0; t < T; t++) {
            float *row = qkv + ((size_t)b * T + t) * W;
            memcpy(row, in.q + ((size_t)b * T + t) * s.NH * s.HS, sizeof(float) * s.NH * s.HS);
            memcpy(row + s.NH * s.HS, in.k + ((size_t)b * T + t) * s.NKV * s.HS, sizeof(float) * s.NKV * s.HS);
            memcpy(row + (s.NH + s.NKV) * s.HS, in.v + ((size_t)b * T + t) * s.NKV * s.HS,
                   sizeof(float) * s.NKV * s.HS);
        }
    // dout with a padded row stride.
    const int do_row = s.NH * s.HS + 3;
    float *dout = malloc(sizeof(float) * (size_t)s.B * T * do_row);
    for (int b = 0; b < s.B; b++)
        for (int t = 0; t < T; t++)
            memcpy(dout + ((size_t)b * T + t) * do_row, in.dout + ((size_t)b * T + t) * s.NH * s.HS,
                   sizeof(float) * s.NH * s.HS);
    float *out = malloc(sizeof(float) * n_q(&s)), *lse = malloc(sizeof(float) * n_lse(&s));
    poison(out, n_q(&s)); poison(lse, n_lse(&s)); poison(dqkv, n_fused);

    AttnParams p = params_make(&in, &ref, impl);  // sizes and masks; every tensor is replaced below
    AttnStrides fused = {(int64_t)T * W, W, s.HS};
    p.q = qkv; p.k = qkv + s.NH * s.HS; p.v = qkv + (s.NH + s.NKV) * s.HS;
    p.dq = dqkv; p.dk = dqkv + s.NH * s.HS; p.dv = dqkv + (s.NH + s.NKV) * s.HS;
    p.q_st = p.k_st = p.v_st = p.dq_st = p.dk_st = p.dv_st = fused;
    p.out = out; p.lse = lse;
    p.o_st = (AttnStrides){(int64_t)s.NH * T * s.HS, s.HS, (int64_t)T * s.HS};  // (B, NH, T, HS)
    p.dout = dout;
    p.do_st = (AttnStrides){(int64_t)T * do_row, do_row, s.HS};
    char err[256];
    int ok = attn_check(&p, DEVICE_CPU, 1, err, sizeof err) == 0;
    EXPECT(ok, "%s: strided layout rejected: %s", name, err);
    if (ok) {
        attn_forward_cpu(&p);
        attn_backward_cpu(&p);
    }
    // Gather back into the contiguous layouts and compare.
    size_t nq = n_q(&s), nk = n_kv(&s);
    float *g_out = malloc(sizeof(float) * nq), *g_dq = malloc(sizeof(float) * nq);
    float *g_dk = malloc(sizeof(float) * nk), *g_dv = malloc(sizeof(float) * nk);
    for (int b = 0; b < s.B; b++)
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < s.NH; h++)
                memcpy(g_out + (((size_t)b * T + t) * s.NH + h) * s.HS,
                       out + (((size_t)b * s.NH + h) * T + t) * s.HS, sizeof(float) * s.HS);
            const float *row = dqkv + ((size_t)b * T + t) * W;
            memcpy(g_dq + ((size_t)b * T + t) * s.NH * s.HS, row, sizeof(float) * s.NH * s.HS);
            memcpy(g_dk + ((size_t)b * T + t) * s.NKV * s.HS, row + s.NH * s.HS, sizeof(float) * s.NKV * s.HS);
            memcpy(g_dv + ((size_t)b * T + t) * s.NKV * s.HS, row + (s.NH + s.NKV) * s.HS,
                   sizeof(float) * s.NKV * s.HS);
        }
    // Flash: bitwise. Naive: its fp32 dot products may be vectorised differently with other
    // alignments, so a few u (the dot product length HS bounds the reordering error).
    const double tol = impl == ATTN_IMPL_FLASH ? 0.0 : 4 * s.HS * FP32_U;
    double e[5] = {err_f32(g_out, ref.out, nq), err_f32(lse, ref.lse, n_lse(&s)), err_f32(g_dq, ref.dq, nq),
                   err_f32(g_dk, ref.dk, nk), err_f32(g_dv, ref.dv, nk)};
    EXPECT(e[0] <= tol && e[1] <= tol && e[2] <= tol && e[3] <= tol && e[4] <= tol,
           "%s %s: strided vs contiguous out %.3g lse %.3g dq %.3g dk %.3g dv %.3g (tol %.3g)", name,
           impl == ATTN_IMPL_FLASH ? "flash" : "naive", e[0], e[1], e[2], e[3], e[4], tol);
    free(g_out); free(g_dq); free(g_dk); free(g_dv);
    free(qkv); free(dqkv); free(dout); free(out); free(lse);
    outputs_free(&ref);
    inputs_free(&in);
}

static void test_strided(void) {
    const Shape shapes[] = {
        {2, 97, 97, 4, 2, 16, 1, -1, -1, 0, 0, 0},
        {2, 70, 70, 3, 1, 8, 1, 20, -1, 1, 1, 0.1f},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        check_strided(shapes[i], ATTN_IMPL_FLASH);
        check_strided(shapes[i], ATTN_IMPL_NAIVE);
    }
}

// Runs with 1 and 3 threads give bitwise identical results (fixed summation order, no atomics).
static void test_deterministic(void) {
    Shape s = {2, 130, 130, 4, 2, 32, 1, -1, -1, 0, 0, 0};
    Inputs in = inputs_make(s, 13);
    Outputs a = outputs_make(&s), b = outputs_make(&s);
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    run_contiguous(&in, &a, ATTN_IMPL_FLASH);
    omp_set_num_threads(3);
    run_contiguous(&in, &b, ATTN_IMPL_FLASH);
    omp_set_num_threads(threads);
    EXPECT(memcmp(a.out, b.out, sizeof(float) * n_q(&s)) == 0 && memcmp(a.dq, b.dq, sizeof(float) * n_q(&s)) == 0 &&
               memcmp(a.dk, b.dk, sizeof(float) * n_kv(&s)) == 0 && memcmp(a.dv, b.dv, sizeof(float) * n_kv(&s)) == 0,
           "flash runs with 1 and 3 threads differ");
    outputs_free(&a); outputs_free(&b);
    inputs_free(&in);
}

// ---------------------------------------------------------------------------------------------
// attn_check's bad-input paths: each rejected with a message naming the problem.

// rc (of a call that wrote err) is -1 and the message mentions needle.
static void expect_refused(int rc, const char *err, const char *needle, const char *what) {
    EXPECT(rc == -1 && strstr(err, needle) != NULL, "%s: rc %d, message '%s' should mention '%s'", what, rc,
           err, needle);
}

static void expect_rejected(const AttnParams *p, Device dev, int backward, const char *needle,
                            const char *what) {
    char err[256] = "";
    expect_refused(attn_check(p, dev, backward, err, sizeof err), err, needle, what);
}

static void test_check_bad_inputs(void) {
    Shape s = {2, 16, 16, 4, 2, 64, 1, -1, -1, 0, 1, 0};
    Inputs in = inputs_make(s, 17);
    Outputs o = outputs_make(&s);
    const AttnParams good = params_make(&in, &o, ATTN_IMPL_FLASH);
    char err[256];
    float slopes[2 * 6] = {0};  // (B, NH) in rows of 6 (padded) or 4
    EXPECT(attn_check(&good, DEVICE_CPU, 0, err, sizeof err) == 0, "valid forward rejected: %s", err);
    EXPECT(attn_check(&good, DEVICE_CPU, 1, err, sizeof err) == 0, "valid backward rejected: %s", err);
    AttnParams p;

    p = good; p.HS = 0;
    expect_rejected(&p, DEVICE_CPU, 0, "head size 0", "HS 0");
    p = good; p.dropout_p = 0.001f;  // rounds to 0/256
    expect_rejected(&p, DEVICE_CPU, 0, "below the rule's resolution", "dropout 0.001");
    p = good; p.dropout_p = 0.002f;
    EXPECT(attn_check(&p, DEVICE_CPU, 1, err, sizeof err) == 0, "dropout 0.002 (1/256) rejected: %s", err);
    // CUDA paths (only the params are inspected; no device memory is touched).
    AttnParams cuda = good;
    cuda.cu_seqlens = NULL;
    cuda.dtype = DTYPE_BF16;
    cuda.workspace_bytes = attn_workspace_bytes(&cuda, DEVICE_CUDA);
    cuda.workspace = aligned_alloc(16, (cuda.workspace_bytes + 15) / 16 * 16);  // C11: a multiple of 16
    EXPECT(attn_check(&cuda, DEVICE_CUDA, 1, err, sizeof err) == 0, "valid cuda problem rejected: %s", err);
    p = cuda; p.HS = 512;
    expect_rejected(&p, DEVICE_CUDA, 0, "head size 512 is not supported on cuda", "HS 512 on cuda");
    // fp32 on cuda runs the naive kernels, so the flash params must size their workspace.
    p = cuda; p.dtype = DTYPE_F32;
    EXPECT(attn_workspace_bytes(&p, DEVICE_CUDA) > attn_workspace_bytes(&cuda, DEVICE_CUDA),
           "fp32 cuda workspace must cover the naive kernels");
    p = cuda; p.workspace_bytes = 16;
    expect_rejected(&p, DEVICE_CUDA, 1, "needs a workspace", "cuda workspace too small");
    p = cuda; p.q_st.row += 1;
    expect_rejected(&p, DEVICE_CUDA, 0, "not a multiple of 16 bytes", "misaligned cuda stride");
    p = cuda; p.k = (const char *)p.k + 2;
    expect_rejected(&p, DEVICE_CUDA, 0, "aligned", "misaligned cuda pointer");
    // What the flash kernels lack is refused for them and accepted where the naive path runs it.
    p = cuda; p.softcap = 20.0f;
    EXPECT(attn_check(&p, DEVICE_CUDA, 1, err, sizeof err) == 0, "softcap on the cuda flash kernels rejected: %s",
           err);
    p.deterministic = 1;
    expect_rejected(&p, DEVICE_CUDA, 1, "softcap with the deterministic backward",
                    "softcap with the deterministic backward on the cuda flash kernels");
    EXPECT(attn_check(&p, DEVICE_CUDA, 0, err, sizeof err) == 0, "softcap forward with deterministic set rejected: %s",
           err);
    p.impl = ATTN_IMPL_NAIVE;
    p.workspace_bytes = 0;
    p.workspace = NULL;
    EXPECT(attn_check(&p, DEVICE_CUDA, 1, err, sizeof err) == 0, "softcap on naive cuda rejected: %s", err);
    // accumulate (the ring's sum over key chunks) needs the flash backward: refused where the
    // naive path runs, fp32 on cuda included (its kernels overwrite dq, dk and dv).
    p = cuda; p.accumulate = 1;
    EXPECT(attn_check(&p, DEVICE_CUDA, 1, err, sizeof err) == 0, "accumulate in bf16 on cuda rejected: %s", err);
    p.dtype = DTYPE_F32;
    p.workspace_bytes = 0;
    p.workspace = NULL;
    expect_rejected(&p, DEVICE_CUDA, 1, "accumulate", "accumulate in fp32 on cuda (the naive kernels)");
    EXPECT(attn_check(&p, DEVICE_CUDA, 0, err, sizeof err) == 0, "fp32 cuda forward with accumulate set rejected: %s",
           err);
    p = cuda; p.accumulate = 1; p.impl = ATTN_IMPL_NAIVE; p.workspace_bytes = 0; p.workspace = NULL;
    expect_rejected(&p, DEVICE_CUDA, 1, "accumulate", "accumulate with impl naive on cuda");
    p = good; p.accumulate = 1;
    EXPECT(attn_check(&p, DEVICE_CPU, 1, err, sizeof err) == 0, "accumulate on the cpu flash backward rejected: %s",
           err);
    p.impl = ATTN_IMPL_NAIVE;
    expect_rejected(&p, DEVICE_CPU, 1, "accumulate", "accumulate with impl naive on the cpu");
    p = cuda; p.alibi_slopes = slopes; p.alibi_batch_stride = 4;
    EXPECT(attn_check(&p, DEVICE_CUDA, 1, err, sizeof err) == 0, "per-batch slopes on cuda rejected: %s", err);

    p = good; p.NH = 6; p.NKV = 4;
    expect_rejected(&p, DEVICE_CPU, 0, "n_kv_head must divide n_head", "NKV not dividing NH");
    p = good; p.NKV = 0;
    expect_rejected(&p, DEVICE_CPU, 0, "NKV=0", "NKV 0");
    p = good; p.B = 0;
    expect_rejected(&p, DEVICE_CPU, 0, "B=0", "B 0");
    p = good; p.softcap = -1.0f;
    expect_rejected(&p, DEVICE_CPU, 0, "softcap -1", "negative softcap");
    p = good; p.softcap = NAN;
    expect_rejected(&p, DEVICE_CPU, 0, "softcap", "softcap NaN");
    p = good; p.softcap = INFINITY;
    expect_rejected(&p, DEVICE_CPU, 0, "softcap", "softcap inf");
    p = good; p.softcap = 30.0f;
    EXPECT(attn_check(&p, DEVICE_CPU, 1, err, sizeof err) == 0, "softcap 30 rejected on cpu: %s", err);
    p = good; p.alibi_slopes = slopes; p.alibi_batch_stride = -4;
    expect_rejected(&p, DEVICE_CPU, 0, "alibi_batch_stride -4", "negative slope stride");
    p.alibi_batch_stride = 3;
    expect_rejected(&p, DEVICE_CPU, 0, "at least NH = 4", "slope stride below NH");
    p.alibi_batch_stride = 6;
    EXPECT(attn_check(&p, DEVICE_CPU, 1, err, sizeof err) == 0, "padded slope stride rejected: %s", err);
    p.alibi_slopes = NULL;
    expect_rejected(&p, DEVICE_CPU, 0, "alibi_slopes is NULL", "slope stride without slopes");
    p = good; p.cu_seqlens = NULL; p.T_k = 12;  // bottom-right: queries 0..3 see no key
    EXPECT(attn_check(&p, DEVICE_CPU, 1, err, sizeof err) == 0, "causal T_q > T_k rejected: %s", err);
    p = good; p.dropout_p = 1.0f;
    expect_rejected(&p, DEVICE_CPU, 0, "dropout", "dropout 1");
    p = good; p.dropout_p = NAN;
    expect_rejected(&p, DEVICE_CPU, 0, "dropout", "dropout NaN");
    p = good; p.dtype = DTYPE_BF16;
    expect_rejected(&p, DEVICE_CPU, 0, "fp32 only", "bf16 on cpu");
    p = good; p.window_left = -2;
    expect_rejected(&p, DEVICE_CPU, 0, "window", "window -2");
    p = good; p.scale = INFINITY;
    expect_rejected(&p, DEVICE_CPU, 0, "scale", "scale inf");
    p = good; p.impl = (AttnImpl)7;
    expect_rejected(&p, DEVICE_CPU, 0, "implementation", "impl 7");
    p = good; p.causal = 0; p.T_q = 8;
    expect_rejected(&p, DEVICE_CPU, 0, "T_q == T_k", "documents with T_q != T_k");
    p = good; p.n_docs = 0;
    expect_rejected(&p, DEVICE_CPU, 0, "n_docs", "documents with n_docs 0");

    int cu_short[3] = {0, 16, 31};  // ends before B*T = 32
    p = good; p.cu_seqlens = cu_short; p.n_docs = 2;
    expect_rejected(&p, DEVICE_CPU, 0, "B*T", "cu_seqlens not ending at B*T");
    int cu_cross[3] = {0, 10, 32};  // the document 10..32 crosses row start 16
    p = good; p.cu_seqlens = cu_cross; p.n_docs = 2;
    expect_rejected(&p, DEVICE_CPU, 0, "crosses the start of batch row 1", "document crossing a row");
    int cu_down[5] = {0, 16, 12, 20, 32};
    p = good; p.cu_seqlens = cu_down; p.n_docs = 4;
    expect_rejected(&p, DEVICE_CPU, 0, "decreases", "decreasing cu_seqlens");
    int cu_start[3] = {1, 16, 32};
    p = good; p.cu_seqlens = cu_start; p.n_docs = 2;
    expect_rejected(&p, DEVICE_CPU, 0, "cu_seqlens[0]", "cu_seqlens not starting at 0");
    int cu_ok[5] = {0, 5, 16, 16, 32};  // an empty document is harmless
    p = good; p.cu_seqlens = cu_ok; p.n_docs = 4;
    EXPECT(attn_check(&p, DEVICE_CPU, 1, err, sizeof err) == 0, "valid documents rejected: %s", err);

    p = good; p.dq = NULL;
    expect_rejected(&p, DEVICE_CPU, 1, "'dq' is NULL", "backward without dq");
    EXPECT(attn_check(&p, DEVICE_CPU, 0, err, sizeof err) == 0, "forward must not need dq: %s", err);
    p = good; p.lse = NULL;
    expect_rejected(&p, DEVICE_CPU, 0, "lse", "no lse");
    p = good; p.o_st.head = s.HS / 2;
    expect_rejected(&p, DEVICE_CPU, 0, "overlap", "overlapping output heads");
    p = good; p.dk_st.row = 0;
    expect_rejected(&p, DEVICE_CPU, 1, "overlap", "overlapping dk rows");
    p = good; p.k_st.row = 0;  // a broadcast input is fine: it is only read
    EXPECT(attn_check(&p, DEVICE_CPU, 0, err, sizeof err) == 0, "broadcast input rejected: %s", err);
    p = good; p.v_st.batch = -1;
    expect_rejected(&p, DEVICE_CPU, 0, "negative stride", "negative stride");
    EXPECT(attn_check(NULL, DEVICE_CPU, 0, err, sizeof err) == -1, "NULL params accepted");

    free(cuda.workspace);

    outputs_free(&o);
    inputs_free(&in);
}

// ---------------------------------------------------------------------------------------------
// The entry points of attention.h as a library sees them: refused requests come back as a status
// with a message, and the process (this test) keeps running and computing afterwards.

static void test_refusals_return(void) {
    Shape s = {1, 24, 17, 2, 1, 16, 1, -1, -1, 0, 0, 0};
    Inputs in = inputs_make(s, 29);
    Outputs o = outputs_make(&s);
    char err[256];
    AttnContext *bad = attn_context_create((Device)9, NULL, ATTN_KERNEL_AUTO, err, sizeof err);
    expect_refused(bad == NULL ? -1 : 0, err, "unknown device", "context for device 9");
    bad = attn_context_create(DEVICE_CPU, NULL, (AttnKernel)5, err, sizeof err);
    expect_refused(bad == NULL ? -1 : 0, err, "kernel family", "context for kernel 5");
    AttnContext *ctx = attn_context_create(DEVICE_CPU, NULL, ATTN_KERNEL_AUTO, err, sizeof err);
    EXPECT(ctx != NULL, "cpu context: %s", err);
    if (!ctx) return;
    const AttnParams good = params_make(&in, &o, ATTN_IMPL_FLASH);
    AttnParams p;
    for (int round = 0; round < 3; round++) {  // refusals leave no state behind: again and again
        p = good; p.HS = 0;
        expect_refused(attn_forward(ctx, &p, err, sizeof err), err, "head size 0", "forward with HS 0");
        p = good; p.softcap = -2.0f;
        expect_refused(attn_forward(ctx, &p, err, sizeof err), err, "softcap", "forward with softcap -2");
        p = good; p.dtype = DTYPE_F16;
        expect_refused(attn_forward(ctx, &p, err, sizeof err), err, "fp32 only", "forward in fp16 on cpu");
        p = good; p.dq = NULL;
        expect_refused(attn_backward(ctx, &p, err, sizeof err), err, "'dq' is NULL", "backward without dq");
        p = good; p.lse = NULL;
        expect_refused(attn_merge(ctx, &good, &p, err, sizeof err), err, "shapes must be the same",
                       "merge without lse");
    }
    // A good request after the refusals: causal T_q > T_k, whose first 7 queries see no key.
    poison(o.out, n_q(&s)); poison(o.lse, n_lse(&s)); poison(o.dq, n_q(&s));
    p = good;
    EXPECT(attn_forward(ctx, &p, err, sizeof err) == 0, "good forward after refusals: %s", err);
    EXPECT(attn_backward(ctx, &p, err, sizeof err) == 0, "good backward after refusals: %s", err);
    int rows_ok = 1;
    for (int h = 0; h < s.NH; h++)
        for (int i = 0; i < s.T_q; i++) {
            const float lse = o.lse[h * s.T_q + i];
            const int empty = i < s.T_q - s.T_k;
            rows_ok &= empty ? lse == INFINITY : isfinite(lse);
            for (int d = 0; d < s.HS; d++) {
                const size_t e = ((size_t)i * s.NH + h) * s.HS + d;
                rows_ok &= empty ? o.out[e] == 0.0f && o.dq[e] == 0.0f : isfinite(o.out[e]) && isfinite(o.dq[e]);
            }
        }
    EXPECT(rows_ok, "causal T_q > T_k: rows before T_q - T_k give out 0, lse +inf, dq 0, the rest finite");
    attn_context_destroy(ctx);
    outputs_free(&o);
    inputs_free(&in);
}

// The flash kernels step a lane's Philox block along a tile instead of recomputing it:
// attn_dropout_block at 16 rows and 16 keys further is the block plus attn_dropout_row_step and
// plus 16, over random sizes (T_k up to 2^20, so the tile count needs 64 bits) and positions.
static void test_dropout_block_steps(void) {
    Rng r;
    rng_seed(&r, 11);
    int bad = 0;
    for (int trial = 0; trial < 2000; trial++) {
        AttnParams p = {0};
        p.B = 1 + (int)rng_below(&r, 4), p.NH = 1 + (int)rng_below(&r, 16);
        p.T_q = 1 + (int)rng_below(&r, 1 << 20), p.T_k = 1 + (int)rng_below(&r, 1 << 20);
        const int b = (int)rng_below(&r, (uint64_t)p.B), h = (int)rng_below(&r, (uint64_t)p.NH);
        const int i = (int)rng_below(&r, (uint64_t)p.T_q), j = (int)rng_below(&r, (uint64_t)p.T_k);
        const int rows = (p.T_q - 1 - i) / 16, keys = (p.T_k - 1 - j) / 16;  // steps that stay inside
        const int ri = rows ? (int)rng_below(&r, (uint64_t)rows + 1) : 0, kj = keys ? (int)rng_below(&r, (uint64_t)keys + 1) : 0;
        const uint64_t want = attn_dropout_block(&p, b, h, i + 16 * ri, j + 16 * kj);
        bad += want != attn_dropout_block(&p, b, h, i, j) + (uint64_t)ri * attn_dropout_row_step(&p) + 16u * (uint64_t)kj;
    }
    EXPECT(bad == 0, "%d of 2000 blocks differ from the stepped block", bad);
}

int main(void) {
    TEST_CASE("attn_check rejects bad input", test_check_bad_inputs());
    TEST_CASE("dropout blocks step by attn_dropout_row_step and 16", test_dropout_block_steps());
    TEST_CASE("refused calls return a status and the process goes on", test_refusals_return());
    TEST_CASE("attn_visible matches an explicit mask", test_visible_rules());
    TEST_CASE("dropout keep statistics", test_dropout_statistics());
    TEST_CASE("flash vs naive vs float64 over odd shapes", test_flash_vs_naive());
    TEST_CASE("backward vs float64 finite differences", test_finite_differences());
    TEST_CASE("fully masked rows: out 0, lse +inf, no NaN", test_fully_masked_rows());
    TEST_CASE("strided fused QKV equals contiguous", test_strided());
    TEST_CASE("flash is deterministic across thread counts", test_deterministic());
    return TEST_SUMMARY();
}
