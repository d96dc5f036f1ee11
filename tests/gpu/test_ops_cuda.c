// test_ops_cuda: the CUDA backend (model/cuda/ops_cuda*.cu) against the CPU backend (model/cpu/ops_cpu*.c,
// the fp32 reference), op by op on random inputs with odd sizes and end to end on a small GPT
// (logits, loss, every gradient; learned, rotary and ALiBi positions, packed documents, per-layer
// windows), in fp32, bf16 and fp16; the CUDA AdamW and gradient sum of
// squares (optim/adamw_cuda.cu) against adamw_step_cpu / sumsq_cpu; and determinism.
//
// Inputs are drawn in fp32, uploaded in the compute dtype and downloaded back, so both backends
// see exactly the same (rounded) values: only each op's own arithmetic differs.
//
// Tolerances, as norm-wise relative errors (rel_err_f32), derived from the dtype:
//   u = unit roundoff of the result's type: 2^-24 (fp32), 2^-8 (bf16), 2^-11 (fp16).
//   An op whose result passes through r roundings to the dtype (1 for an op computed in fp32 and
//   rounded once; 2 when a rounded intermediate feeds a matmul) is off by at most r*u per
//   element; a factor 2 covers the op's own amplification (GELU' <= 1.13, the cancellation in
//   LayerNorm's backward). Both backends add K-term sums in fp32 in different orders; their
//   difference stays below sqrt(K) * 2^-24 relative (rounding errors of random sign add like a
//   random walk: Higham & Mary, 2019), taken 4x.
//     tol(u, r, K) = 2 r u + 4 sqrt(K) 2^-24
//   The whole model chains S such stages. Independent roundings of standard deviation
//   <= u/sqrt(3) each add in quadrature, so 3 sqrt(S) * (u + the K term) is a > 5 sigma bound.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/config.h"
#include "common/rng.h"
#include "model/backend.h"
#include "model/gpt.h"
#include "optim/optim.h"
#include "optim/optim_cuda.h"
#include "tests/fixtures.h"
#include "tests/testlib.h"

#define U_F32 0x1p-24

typedef struct {
    Backend *gpu, *cpu;
    DType dt;
    double u;   // unit roundoff of dt
    Rng rng;
} Ctx;

static double tol(double u, int r, int K) { return 2.0 * r * u + 4.0 * sqrt((double)K) * U_F32; }

static float *rand_vec(Ctx *t, size_t n, float mean, float scale) {
    float *x = xmalloc(n * sizeof(float));  // (n)
    for (size_t i = 0; i < n; i++) x[i] = mean + scale * rng_normal(&t->rng);
    return x;
}

static int *rand_ids(Ctx *t, size_t n, int below) {
    int *x = xmalloc(n * sizeof(int));  // (n)
    for (size_t i = 0; i < n; i++) x[i] = (int)rng_below(&t->rng, (uint64_t)below);
    return x;
}

// A GPU buffer holding host[0..n) in the compute dtype; host is overwritten with the rounded
// values, so the CPU reference computes on exactly what the GPU sees.
static void *dev_from(Ctx *t, float *host, size_t n) {
    void *d = t->gpu->alloc(t->gpu, n * dtype_size(t->dt));
    t->gpu->upload_f32(t->gpu, d, host, n);
    t->gpu->download_f32(t->gpu, host, d, n);
    return d;
}

static void *dev_zeros(Ctx *t, size_t n) { return t->gpu->alloc(t->gpu, n * dtype_size(t->dt)); }

static int *dev_ints(Ctx *t, const int *host, size_t n) {
    int *d = t->gpu->alloc(t->gpu, n * sizeof(int));
    t->gpu->upload(t->gpu, d, host, n * sizeof(int));
    return d;
}

static float *fetch(Ctx *t, const void *d, size_t n) {
    float *h = xmalloc(n * sizeof(float));  // (n)
    t->gpu->download_f32(t->gpu, h, d, n);
    return h;
}

static float *fetch_f32(Ctx *t, const float *d, size_t n) {
    float *h = xmalloc(n * sizeof(float));  // (n)
    t->gpu->download(t->gpu, h, d, n * sizeof(float));
    return h;
}

static float *copy_of(const float *x, size_t n) {
    float *c = xmalloc(n * sizeof(float));
    memcpy(c, x, n * sizeof(float));
    return c;
}

static void expect_close(const Ctx *t, const char *what, const float *got, const float *want,
                         size_t n, double tolerance) {
    double e = rel_err_f32(got, want, n);
    printf("    %-5s %-34s rel err %.3g (tol %.3g)\n", dtype_name(t->dt), what, e, tolerance);
    EXPECT(e <= tolerance, "%s %s: rel err %.3g > tol %.3g", dtype_name(t->dt), what, e, tolerance);
}

// ---- memory ----

static void test_memory(Ctx *t) {
    const size_t n = 1000;
    float *x = rand_vec(t, n, 0.0f, 1.0f);
    void *a = dev_from(t, x, n), *b = dev_zeros(t, n);
    float *zeros = fetch(t, b, n);
    int all_zero = 1;
    for (size_t i = 0; i < n; i++) all_zero &= zeros[i] == 0.0f;
    EXPECT(all_zero, "alloc is zero-filled");
    t->gpu->copy(t->gpu, b, a, n * dtype_size(t->dt));
    float *y = fetch(t, b, n);
    EXPECT(memcmp(x, y, n * sizeof(float)) == 0,
           "copy, then a download/upload round trip, is exact");
    t->gpu->fill_zero(t->gpu, b, n * dtype_size(t->dt));
    float *z = fetch(t, b, n);
    EXPECT(memcmp(z, zeros, n * sizeof(float)) == 0, "fill_zero");
    t->gpu->release(t->gpu, a);
    t->gpu->release(t->gpu, b);
    free(x), free(y), free(z), free(zeros);
}

// x rounded to nearest (even) in dt, on the host.
static float host_round(float x, DType dt) {
    if (dt == DTYPE_F16) return (float)(_Float16)x;
    if (dt != DTYPE_BF16) return x;
    uint32_t u;
    memcpy(&u, &x, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1)) & 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

// copy_2d (its kernel: rows of >= 1 KiB in 16-byte pieces, and cudaMemcpy2DAsync otherwise),
// store_f32 with and without an addend (vectors of 4 and single elements) and upload_f32 (whose
// conversion is the store of one long row), against the CPU backend and host rounding on the same
// values: all exact (one rounding to dtype, of the same fp32 sum).
static void test_strided(Ctx *t) {
    const size_t es = dtype_size(t->dt);
    const struct { size_t rows, width, src_pitch, dst_pitch; } cases[] = {
        {66001, 768, 800, 776},   // the kernels, over many rows
        {37, 1026, 1030, 1034},   // odd widths: single elements, and copy_2d's fallback
        {5, 8, 12, 16},           // narrow rows: copy_2d's fallback
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const size_t R = cases[k].rows, W = cases[k].width, SP = cases[k].src_pitch, DP = cases[k].dst_pitch;
        const size_t nsrc = R * SP, ndst = R * DP;
        float *x = rand_vec(t, nsrc, 0.0f, 1.0f), *y = rand_vec(t, nsrc, 0.0f, 1.0f);
        float *d_x = t->gpu->alloc(t->gpu, nsrc * sizeof(float)), *d_y = t->gpu->alloc(t->gpu, nsrc * sizeof(float));
        t->gpu->upload(t->gpu, d_x, x, nsrc * sizeof(float));
        t->gpu->upload(t->gpu, d_y, y, nsrc * sizeof(float));
        float *src_h = copy_of(x, nsrc);
        void *d_src = dev_from(t, src_h, nsrc), *d_dst = dev_zeros(t, ndst);  // src_h: x rounded to dtype
        float *want = xcalloc(ndst, sizeof(float)), *got;
        t->cpu->copy_2d(t->cpu, want, DP * sizeof(float), src_h, SP * sizeof(float), W * sizeof(float), R);
        t->gpu->copy_2d(t->gpu, d_dst, DP * es, d_src, SP * es, W * es, R);
        got = fetch(t, d_dst, ndst);
        EXPECT(memcmp(got, want, ndst * sizeof(float)) == 0, "copy_2d of %zu rows of %zu (%s)", R, W, dtype_name(t->dt));
        free(got);
        for (int with_add = 0; with_add < 2; with_add++) {
            t->cpu->store_f32(t->cpu, want, DP, x, with_add ? y : NULL, SP, W, R);
            for (size_t i = 0; i < ndst; i++) want[i] = host_round(want[i], t->dt);
            t->gpu->fill_zero(t->gpu, d_dst, ndst * es);
            t->gpu->store_f32(t->gpu, d_dst, DP, d_x, with_add ? d_y : NULL, SP, W, R);
            got = fetch(t, d_dst, ndst);
            EXPECT(memcmp(got, want, ndst * sizeof(float)) == 0, "store_f32%s of %zu rows of %zu (%s)",
                   with_add ? " with an addend" : "", R, W, dtype_name(t->dt));
            free(got);
        }
        int same = 1;
        for (size_t i = 0; i < nsrc; i++) same &= src_h[i] == host_round(x[i], t->dt);
        EXPECT(same, "upload_f32 of %zu elements (%s)", nsrc, dtype_name(t->dt));
        t->gpu->release(t->gpu, d_x), t->gpu->release(t->gpu, d_y);
        t->gpu->release(t->gpu, d_src), t->gpu->release(t->gpu, d_dst);
        free(x), free(y), free(src_h), free(want);
    }
}

// ---- embedding ----

// V small: many repeats, one pass of the row sort (5 bits); V past 2^16 (GPT-2's vocabulary
// is 16 bits): three passes.
static void test_embed_v(Ctx *t, const int V) {
    const int B = 3, T = 50, C = 72, maxT = 64, N = B * T;
    int *tok = rand_ids(t, N, V), *pos = rand_ids(t, N, maxT);
    float *wte = rand_vec(t, (size_t)V * C, 0.0f, 1.0f),
          *wpe = rand_vec(t, (size_t)maxT * C, 0.0f, 1.0f);
    void *d_wte = dev_from(t, wte, (size_t)V * C), *d_wpe = dev_from(t, wpe, (size_t)maxT * C);
    int *d_tok = dev_ints(t, tok, N), *d_pos = dev_ints(t, pos, N);
    void *d_out = dev_zeros(t, (size_t)N * C);
    float *ref = xmalloc((size_t)N * C * sizeof(float));  // (N, C)
    for (int with_pos = 0; with_pos < 2; with_pos++) {
        t->gpu->embed_forward(t->gpu, d_out, d_tok, with_pos ? d_pos : NULL, d_wte, d_wpe, B, T, C);
        t->cpu->embed_forward(t->cpu, ref, tok, with_pos ? pos : NULL, wte, wpe, B, T, C);
        float *out = fetch(t, d_out, (size_t)N * C);
        expect_close(t, with_pos ? "embed_forward (pos)" : "embed_forward", out, ref,
                     (size_t)N * C, tol(t->u, 1, 2));
        free(out);
    }
    // Backward: the gradients start non-zero to check that they accumulate.
    float *dout = rand_vec(t, (size_t)N * C, 0.0f, 1.0f);
    float *dwte0 = rand_vec(t, (size_t)V * C, 0.0f, 1.0f),
          *dwpe0 = rand_vec(t, (size_t)maxT * C, 0.0f, 1.0f);
    void *d_dout = dev_from(t, dout, (size_t)N * C);
    void *d_dwte = dev_from(t, dwte0, (size_t)V * C),
         *d_dwpe = dev_from(t, dwpe0, (size_t)maxT * C);
    t->gpu->embed_backward(t->gpu, d_dwte, d_dwpe, d_dout, d_tok, NULL, B, T, C, V, maxT);
    float *dwte = copy_of(dwte0, (size_t)V * C), *dwpe = copy_of(dwpe0, (size_t)maxT * C);
    t->cpu->embed_backward(t->cpu, dwte, dwpe, dout, tok, NULL, B, T, C, V, maxT);
    float *g_dwte = fetch(t, d_dwte, (size_t)V * C), *g_dwpe = fetch(t, d_dwpe, (size_t)maxT * C);
    // A token row sums up to N contributions, a position row B.
    expect_close(t, "embed_backward dwte", g_dwte, dwte, (size_t)V * C, tol(t->u, 1, N));
    expect_close(t, "embed_backward dwpe", g_dwpe, dwpe, (size_t)maxT * C, tol(t->u, 1, B));
    // Explicit positions (packed documents restart them): a position row sums up to N.
    float *dwpe_pos = copy_of(dwpe0, (size_t)maxT * C);
    t->gpu->upload_f32(t->gpu, d_dwpe, dwpe0, (size_t)maxT * C);
    t->gpu->embed_backward(t->gpu, d_dwte, d_dwpe, d_dout, d_tok, d_pos, B, T, C, V, maxT);
    t->cpu->embed_backward(t->cpu, dwte, dwpe_pos, dout, tok, pos, B, T, C, V, maxT);
    float *g_dwpe_pos = fetch(t, d_dwpe, (size_t)maxT * C);
    expect_close(t, "embed_backward dwpe (pos)", g_dwpe_pos, dwpe_pos, (size_t)maxT * C,
                 tol(t->u, 1, N));
    free(dwpe_pos), free(g_dwpe_pos);
    // Determinism: the same inputs give bitwise the same gradients.
    t->gpu->upload_f32(t->gpu, d_dwte, dwte0, (size_t)V * C);
    t->gpu->upload_f32(t->gpu, d_dwpe, dwpe0, (size_t)maxT * C);
    t->gpu->embed_backward(t->gpu, d_dwte, d_dwpe, d_dout, d_tok, NULL, B, T, C, V, maxT);
    float *again = fetch(t, d_dwte, (size_t)V * C);
    EXPECT(memcmp(again, g_dwte, (size_t)V * C * sizeof(float)) == 0,
           "embed_backward is deterministic");
    void *bufs[] = {d_wte, d_wpe, d_tok, d_pos, d_out, d_dout, d_dwte, d_dwpe};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) t->gpu->release(t->gpu, bufs[i]);
    free(tok), free(pos), free(wte), free(wpe), free(ref), free(dout), free(dwte0), free(dwpe0);
    free(dwte), free(dwpe), free(g_dwte), free(g_dwpe), free(again);
}

static void test_embed(Ctx *t) {
    test_embed_v(t, 20);
    test_embed_v(t, 70001);
}

// ---- RoPE ----

// rope_forward and rope_backward on a fused qkv buffer, positions i % T and explicit ones (as
// packed documents give). Each output is a 2-term fp32 sum of products rounded once to the
// dtype; the value heads pass through untouched, bitwise.
static void test_rope(Ctx *t) {
    const int B = 3, T = 37, NH = 4, NKV = 2, HS = 64, maxT = 128, N = B * T;
    const int OC = (NH + 2 * NKV) * HS, half = HS / 2;
    float *table = xmalloc((size_t)maxT * HS * sizeof(float));   // (maxT, HS/2, 2)
    for (int p = 0; p < maxT; p++)
        for (int d = 0; d < half; d++) {
            const double a = p * pow(10000.0, -2.0 * d / HS);
            table[((size_t)p * half + d) * 2] = (float)cos(a);
            table[((size_t)p * half + d) * 2 + 1] = (float)sin(a);
        }
    float *d_table = (float *)t->gpu->alloc(t->gpu, (size_t)maxT * HS * sizeof(float));
    t->gpu->upload(t->gpu, d_table, table, (size_t)maxT * HS * sizeof(float));
    int *pos = rand_ids(t, N, maxT);
    int *d_pos = dev_ints(t, pos, N);
    for (int with_pos = 0; with_pos < 2; with_pos++) {
        float *x = rand_vec(t, (size_t)N * OC, 0.0f, 1.0f);
        void *d_x = dev_from(t, x, (size_t)N * OC);
        float *x0 = copy_of(x, (size_t)N * OC);
        t->gpu->rope_forward(t->gpu, d_x, d_table, with_pos ? d_pos : NULL, N, T, NH, NKV, HS);
        t->cpu->rope_forward(t->cpu, x, table, with_pos ? pos : NULL, N, T, NH, NKV, HS);
        float *g = fetch(t, d_x, (size_t)N * OC);
        expect_close(t, with_pos ? "rope_forward (pos)" : "rope_forward", g, x, (size_t)N * OC,
                     tol(t->u, 1, 2));
        int v_same = 1;
        for (int i = 0; i < N; i++)
            v_same &= memcmp(g + (size_t)i * OC + (NH + NKV) * HS, x0 + (size_t)i * OC + (NH + NKV) * HS,
                             (size_t)NKV * HS * sizeof(float)) == 0;
        EXPECT(v_same, "%s rope leaves the value heads untouched", dtype_name(t->dt));
        t->gpu->rope_backward(t->gpu, d_x, d_table, with_pos ? d_pos : NULL, N, T, NH, NKV, HS);
        t->cpu->rope_backward(t->cpu, x, table, with_pos ? pos : NULL, N, T, NH, NKV, HS);
        float *gb = fetch(t, d_x, (size_t)N * OC);
        // The CPU ran backward on its own unrounded forward result: one more rounding each side.
        expect_close(t, with_pos ? "rope_backward (pos)" : "rope_backward", gb, x, (size_t)N * OC,
                     tol(t->u, 2, 2));
        t->gpu->release(t->gpu, d_x);
        free(x), free(x0), free(g), free(gb);
    }
    t->gpu->release(t->gpu, d_table);
    t->gpu->release(t->gpu, d_pos);
    free(table), free(pos);
}

// ---- LayerNorm ----

static void test_layernorm_case(Ctx *t, int N, int C) {
    char what[96];
    float *x = rand_vec(t, (size_t)N * C, 3.0f, 1.0f);  // a large mean tests the centring
    float *w = rand_vec(t, C, 1.0f, 0.1f), *b = rand_vec(t, C, 0.0f, 0.1f);
    void *d_x = dev_from(t, x, (size_t)N * C), *d_w = dev_from(t, w, C), *d_b = dev_from(t, b, C);
    void *d_out = dev_zeros(t, (size_t)N * C);
    float *d_mean = t->gpu->alloc(t->gpu, N * sizeof(float)),
          *d_rstd = t->gpu->alloc(t->gpu, N * sizeof(float));
    float *out = xmalloc((size_t)N * C * sizeof(float)), *mean = xmalloc(N * sizeof(float)),
          *rstd = xmalloc(N * sizeof(float));
    t->gpu->layernorm_forward(t->gpu, d_out, d_mean, d_rstd, d_x, d_w, d_b, N, C);
    t->cpu->layernorm_forward(t->cpu, out, mean, rstd, x, w, b, N, C);
    float *g_out = fetch(t, d_out, (size_t)N * C), *g_mean = fetch_f32(t, d_mean, N),
          *g_rstd = fetch_f32(t, d_rstd, N);
    snprintf(what, sizeof what, "layernorm_forward out N=%d C=%d", N, C);
    expect_close(t, what, g_out, out, (size_t)N * C, tol(t->u, 1, C));
    snprintf(what, sizeof what, "layernorm_forward mean (fp32) N=%d C=%d", N, C);
    expect_close(t, what, g_mean, mean, N, tol(U_F32, 1, C));
    snprintf(what, sizeof what, "layernorm_forward rstd (fp32) N=%d C=%d", N, C);
    expect_close(t, what, g_rstd, rstd, N, tol(U_F32, 1, C));

    // Backward on the CPU's statistics, so both sides share every input.
    t->gpu->upload(t->gpu, d_mean, mean, N * sizeof(float));
    t->gpu->upload(t->gpu, d_rstd, rstd, N * sizeof(float));
    float *dout = rand_vec(t, (size_t)N * C, 0.0f, 1.0f),
          *dinp = rand_vec(t, (size_t)N * C, 0.0f, 1.0f);
    float *dw = rand_vec(t, C, 0.0f, 1.0f), *db = rand_vec(t, C, 0.0f, 1.0f);
    void *d_dout = dev_from(t, dout, (size_t)N * C), *d_dinp = dev_from(t, dinp, (size_t)N * C);
    void *d_dw = dev_from(t, dw, C), *d_db = dev_from(t, db, C), *d_dcopy = dev_zeros(t, (size_t)N * C);
    t->gpu->layernorm_backward(t->gpu, d_dinp, d_dcopy, d_dw, d_db, d_dout, d_x, d_w, d_mean,
                               d_rstd, N, C, NULL);
    t->cpu->layernorm_backward(t->cpu, dinp, NULL, dw, db, dout, x, w, mean, rstd, N, C, NULL);
    float *g_dinp = fetch(t, d_dinp, (size_t)N * C), *g_dw = fetch(t, d_dw, C),
          *g_db = fetch(t, d_db, C), *g_dcopy = fetch(t, d_dcopy, (size_t)N * C);
    snprintf(what, sizeof what, "layernorm_backward dinp (+=) N=%d C=%d", N, C);
    expect_close(t, what, g_dinp, dinp, (size_t)N * C, tol(t->u, 1, C));
    EXPECT(memcmp(g_dcopy, g_dinp, (size_t)N * C * sizeof(float)) == 0,
           "layernorm_backward N=%d C=%d: dcopy holds exactly the new dinp", N, C);
    snprintf(what, sizeof what, "layernorm_backward dw (+=) N=%d C=%d", N, C);
    expect_close(t, what, g_dw, dw, C, tol(t->u, 1, N));
    snprintf(what, sizeof what, "layernorm_backward db (+=) N=%d C=%d", N, C);
    expect_close(t, what, g_db, db, C, tol(t->u, 1, N));

    // The residual add fused in front: res = x + y in place of x (res aliases the first input),
    // then the LayerNorm of res. res is one rounded add; the LayerNorm is checked against the
    // CPU's on the GPU's (rounded) res, so both sides normalise the same values.
    float *y = rand_vec(t, (size_t)N * C, 0.0f, 1.0f), *res = xmalloc((size_t)N * C * sizeof(float));
    void *d_y = dev_from(t, y, (size_t)N * C);
    t->gpu->add_layernorm_forward(t->gpu, d_x, d_out, d_mean, d_rstd, d_x, d_y, d_w, d_b, N, C, NULL);
    t->cpu->add(t->cpu, res, x, y, (size_t)N * C, NULL);
    float *g_res = fetch(t, d_x, (size_t)N * C);
    snprintf(what, sizeof what, "add_layernorm_forward res N=%d C=%d", N, C);
    expect_close(t, what, g_res, res, (size_t)N * C, tol(t->u, 1, 2));
    t->cpu->layernorm_forward(t->cpu, out, mean, rstd, g_res, w, b, N, C);
    free(g_out), free(g_mean), free(g_rstd);
    g_out = fetch(t, d_out, (size_t)N * C), g_mean = fetch_f32(t, d_mean, N), g_rstd = fetch_f32(t, d_rstd, N);
    snprintf(what, sizeof what, "add_layernorm_forward out N=%d C=%d", N, C);
    expect_close(t, what, g_out, out, (size_t)N * C, tol(t->u, 1, C));
    snprintf(what, sizeof what, "add_layernorm_forward mean, rstd (fp32) N=%d C=%d", N, C);
    expect_close(t, what, g_mean, mean, N, tol(U_F32, 1, C));
    expect_close(t, what, g_rstd, rstd, N, tol(U_F32, 1, C));

    void *bufs[] = {d_x, d_w, d_b, d_out, d_mean, d_rstd, d_dout, d_dinp, d_dw, d_db, d_dcopy, d_y};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) t->gpu->release(t->gpu, bufs[i]);
    free(x), free(w), free(b), free(out), free(mean), free(rstd), free(g_out), free(g_mean);
    free(g_rstd), free(dout), free(dinp), free(dw), free(db), free(g_dinp), free(g_dw), free(g_db);
    free(g_dcopy), free(y), free(res), free(g_res);
}

// C = 72 runs the 16-byte vector path, C = 70 (rows not 16-byte aligned) the element-wise one;
// N = 300 ends in a partial block of rows; C = 6200 needs more than the default 48 KB of shared
// memory for the backward's column sums (fewer warps, the opt-in maximum).
static void test_layernorm(Ctx *t) {
    test_layernorm_case(t, 300, 72);
    test_layernorm_case(t, 300, 70);
    test_layernorm_case(t, 1000, 768);
    test_layernorm_case(t, 40, 6200);
}

// ---- add ----

static void test_add(Ctx *t) {
    const size_t n = 1001;
    float *a = rand_vec(t, n, 0.0f, 1.0f), *b = rand_vec(t, n, 0.0f, 1.0f);
    void *d_a = dev_from(t, a, n), *d_b = dev_from(t, b, n);
    float *ref = xmalloc(n * sizeof(float));
    t->cpu->add(t->cpu, ref, a, b, n, NULL);
    t->gpu->add(t->gpu, d_a, d_a, d_b, n, NULL);  // out aliasing a
    float *out = fetch(t, d_a, n);
    expect_close(t, "add (out aliases a)", out, ref, n, tol(t->u, 1, 2));
    t->gpu->release(t->gpu, d_a);
    t->gpu->release(t->gpu, d_b);
    free(a), free(b), free(ref), free(out);
}

// ---- dropout ----

// The GPU must drop exactly the elements the CPU drops (the same Philox draws), and scale the
// kept ones with one fp32 multiply rounded once to the dtype: tol(u, 1, 1), bitwise in fp32.
// Sizes with a ragged last Philox block (n % 4 != 0) and offsets using the counter's high word.
static void test_dropout(Ctx *t) {
    const size_t sizes[] = {1, 7, 1001, 262147};
    const float rates[] = {0.1f, 0.2f, 0.5f, 0.9f};
    const uint64_t seed = 0x0123456789abcdefull, offset = ((uint64_t)5 << 32) + 3;
    for (int si = 0; si < 4; si++)
        for (int pi = 0; pi < 4; pi++) {
            const size_t n = sizes[si];
            const float p = rates[pi];
            float *x = rand_vec(t, n, 0.0f, 1.0f);   // (n), no zeros: a 0 output means dropped
            for (size_t i = 0; i < n; i++)
                if (x[i] == 0.0f) x[i] = 1.0f;
            void *d_x = dev_from(t, x, n);
            float *ref = copy_of(x, n);
            t->cpu->dropout(t->cpu, ref, n, &(DropMask){p, seed, offset + (uint64_t)pi, NULL});
            // Every other size takes the offset as a host part plus a part in device memory
            // (the counter a CUDA graph reads), which must draw the mask of their sum.
            if (si % 2) {
                uint64_t *part = t->gpu->alloc(t->gpu, sizeof(uint64_t));
                t->gpu->set_u64(t->gpu, part, offset + (uint64_t)pi - 1000);
                t->gpu->dropout(t->gpu, d_x, n, &(DropMask){p, seed, 1000, part});
                t->gpu->synchronize(t->gpu);
                t->gpu->release(t->gpu, part);
            } else {
                t->gpu->dropout(t->gpu, d_x, n, &(DropMask){p, seed, offset + (uint64_t)pi, NULL});
            }
            float *out = fetch(t, d_x, n);
            size_t differ = 0;
            for (size_t i = 0; i < n; i++) differ += (out[i] != 0.0f) != (ref[i] != 0.0f);
            EXPECT(differ == 0, "%s dropout n %zu p %g: %zu keep decisions differ from the CPU",
                   dtype_name(t->dt), n, p, differ);
            char what[64];
            snprintf(what, sizeof what, "dropout n %zu p %g", n, p);
            if (si == 3) expect_close(t, what, out, ref, n, tol(t->u, 1, 1));
            if (t->dt == DTYPE_F32)
                EXPECT(memcmp(out, ref, n * sizeof(float)) == 0, "fp32 %s: not bitwise the CPU's",
                       what);
            t->gpu->release(t->gpu, d_x);
            free(x), free(ref), free(out);
        }
}

// The dropout mask inside add, add_layernorm_forward and layernorm_backward's copy is the
// dropout op's (whose mask the test above checks against the CPU), bit for bit: each fused op
// against the GPU's own dropout op followed by the plain op, on the same inputs, with the
// offset's per-step part in device memory. C = 72 runs the vector paths (one Philox block per
// 8 bf16/fp16 or 4 fp32 elements), C = 70 the element-wise ones; n = N C = 21000 and 21700 end
// in a ragged Philox block for the add.
static void test_fused_dropout_case(Ctx *t, int N, int C, float p) {
    const size_t n = (size_t)N * C, es = dtype_size(t->dt);
    uint64_t *part = t->gpu->alloc(t->gpu, sizeof(uint64_t));
    t->gpu->set_u64(t->gpu, part, 41);
    const DropMask d = {p, 0x5eedull, ((uint64_t)2 << 32) + 9, part};
    float *a = rand_vec(t, n, 0.0f, 1.0f), *b = rand_vec(t, n, 0.0f, 1.0f), *w = rand_vec(t, C, 0.0f, 1.0f);
    float *bias = rand_vec(t, C, 0.0f, 1.0f), *dinp = rand_vec(t, n, 0.0f, 1.0f);
    void *d_a = dev_from(t, a, n), *d_b = dev_from(t, b, n), *d_w = dev_from(t, w, C), *d_bias = dev_from(t, bias, C);
    void *d_drop = dev_from(t, b, n), *d_want = dev_zeros(t, n), *d_got = dev_zeros(t, n);
    void *d_out = dev_zeros(t, n), *d_out2 = dev_zeros(t, n);
    float *d_mean = t->gpu->alloc(t->gpu, N * sizeof(float)), *d_rstd = t->gpu->alloc(t->gpu, N * sizeof(float));
    float *d_mean2 = t->gpu->alloc(t->gpu, N * sizeof(float)), *d_rstd2 = t->gpu->alloc(t->gpu, N * sizeof(float));
    t->gpu->dropout(t->gpu, d_drop, n, &(DropMask){p, d.seed, d.offset + 41, NULL});   // b through the mask
    float *b_before = fetch(t, d_b, n);

    // add: out = a + dropout(b), into a third buffer and in place of a.
    t->gpu->add(t->gpu, d_want, d_a, d_drop, n, NULL);
    t->gpu->add(t->gpu, d_got, d_a, d_b, n, &d);
    float *want = fetch(t, d_want, n), *got = fetch(t, d_got, n);
    EXPECT(memcmp(got, want, n * sizeof(float)) == 0, "%s add N %d C %d p %g: not dropout, then add",
           dtype_name(t->dt), N, C, p);
    free(got);
    t->gpu->copy(t->gpu, d_got, d_a, n * es);
    t->gpu->add(t->gpu, d_got, d_got, d_b, n, &d);
    got = fetch(t, d_got, n);
    EXPECT(memcmp(got, want, n * sizeof(float)) == 0, "%s add in place N %d C %d p %g", dtype_name(t->dt), N, C, p);
    free(got);

    // add_layernorm_forward: res = a + dropout(b), then the LayerNorm of res.
    t->gpu->add_layernorm_forward(t->gpu, d_want, d_out, d_mean, d_rstd, d_a, d_drop, d_w, d_bias, N, C, NULL);
    t->gpu->add_layernorm_forward(t->gpu, d_got, d_out2, d_mean2, d_rstd2, d_a, d_b, d_w, d_bias, N, C, &d);
    float *res = fetch(t, d_want, n), *res2 = fetch(t, d_got, n), *out = fetch(t, d_out, n), *out2 = fetch(t, d_out2, n);
    float *m1 = fetch_f32(t, d_mean, N), *m2 = fetch_f32(t, d_mean2, N), *r1 = fetch_f32(t, d_rstd, N), *r2 = fetch_f32(t, d_rstd2, N);
    EXPECT(memcmp(res2, res, n * sizeof(float)) == 0 && memcmp(out2, out, n * sizeof(float)) == 0 &&
               memcmp(m2, m1, N * sizeof(float)) == 0 && memcmp(r2, r1, N * sizeof(float)) == 0,
           "%s add_layernorm_forward N %d C %d p %g: not dropout, then add and LayerNorm", dtype_name(t->dt), N, C, p);
    float *b_now = fetch(t, d_b, n);
    EXPECT(memcmp(b_now, b_before, n * sizeof(float)) == 0, "%s: the fused ops leave b alone", dtype_name(t->dt));

    // layernorm_backward: dcopy = dropout(new dinp); dinp, dw, db as without the mask.
    void *d_dinp = dev_from(t, dinp, n), *d_dinp2 = dev_from(t, dinp, n), *d_dcopy = dev_zeros(t, n);
    void *d_dw = dev_zeros(t, C), *d_db = dev_zeros(t, C), *d_dw2 = dev_zeros(t, C), *d_db2 = dev_zeros(t, C);
    t->gpu->layernorm_backward(t->gpu, d_dinp, d_want, d_dw, d_db, d_b, d_a, d_w, d_mean, d_rstd, N, C, NULL);
    t->gpu->dropout(t->gpu, d_want, n, &(DropMask){p, d.seed, d.offset + 41, NULL});
    t->gpu->layernorm_backward(t->gpu, d_dinp2, d_dcopy, d_dw2, d_db2, d_b, d_a, d_w, d_mean, d_rstd, N, C, &d);
    float *g1 = fetch(t, d_dinp, n), *g2 = fetch(t, d_dinp2, n), *c1 = fetch(t, d_want, n), *c2 = fetch(t, d_dcopy, n);
    float *w1 = fetch(t, d_dw, C), *w2 = fetch(t, d_dw2, C), *b1 = fetch(t, d_db, C), *b2 = fetch(t, d_db2, C);
    EXPECT(memcmp(g2, g1, n * sizeof(float)) == 0 && memcmp(w2, w1, C * sizeof(float)) == 0 &&
               memcmp(b2, b1, C * sizeof(float)) == 0,
           "%s layernorm_backward N %d C %d: dinp, dw, db as without the mask", dtype_name(t->dt), N, C);
    EXPECT(memcmp(c2, c1, n * sizeof(float)) == 0, "%s layernorm_backward N %d C %d p %g: dcopy is not dropout(new dinp)",
           dtype_name(t->dt), N, C, p);

    void *bufs[] = {part, d_a, d_b, d_w, d_bias, d_drop, d_want, d_got, d_out, d_out2, d_mean, d_rstd, d_mean2,
                    d_rstd2, d_dinp, d_dinp2, d_dcopy, d_dw, d_db, d_dw2, d_db2};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) t->gpu->release(t->gpu, bufs[i]);
    float *hosts[] = {a, b, w, bias, dinp, want, b_before, res, res2, out, out2, m1, m2, r1, r2, b_now, g1, g2,
                      c1, c2, w1, w2, b1, b2};
    for (size_t i = 0; i < sizeof hosts / sizeof hosts[0]; i++) free(hosts[i]);
}

static void test_fused_dropout(Ctx *t) {
    test_fused_dropout_case(t, 300, 72, 0.2f);
    test_fused_dropout_case(t, 310, 70, 0.5f);
}

// ---- matmul ----

static void test_matmul_case(Ctx *t, int OC, Epilogue epi, int with_bias) {
    const int N = 300, C = 72;
    char name[96];
    const int r = epi == EPI_GELU ? 2 : 1;  // GELU: pre rounded, then GELU(pre) / d(pre) rounded
    float *x = rand_vec(t, (size_t)N * C, 0.0f, 1.0f), *w = rand_vec(t, (size_t)OC * C, 0.0f, 0.1f);
    float *bias = with_bias ? rand_vec(t, OC, 0.0f, 0.1f) : NULL;
    void *d_x = dev_from(t, x, (size_t)N * C), *d_w = dev_from(t, w, (size_t)OC * C);
    void *d_bias = with_bias ? dev_from(t, bias, OC) : NULL;
    void *d_out = dev_zeros(t, (size_t)N * OC),
         *d_pre = epi == EPI_GELU ? dev_zeros(t, (size_t)N * OC) : NULL;
    float *out = xmalloc((size_t)N * OC * sizeof(float));
    float *pre = epi == EPI_GELU ? xmalloc((size_t)N * OC * sizeof(float)) : NULL;
    t->gpu->matmul_forward(t->gpu, d_out, d_pre, d_x, d_w, d_bias, N, C, OC, epi);
    t->cpu->matmul_forward(t->cpu, out, pre, x, w, bias, N, C, OC, epi);
    const char *tag =
        epi == EPI_GELU ? (with_bias ? "gelu+bias" : "gelu") : (with_bias ? "bias" : "plain");
    float *g_out = fetch(t, d_out, (size_t)N * OC);
    snprintf(name, sizeof name, "matmul_forward OC=%d %s out", OC, tag);
    expect_close(t, name, g_out, out, (size_t)N * OC, tol(t->u, r, C));
    if (epi == EPI_GELU) {
        float *g_pre = fetch(t, d_pre, (size_t)N * OC);
        snprintf(name, sizeof name, "matmul_forward OC=%d %s pre", OC, tag);
        expect_close(t, name, g_pre, pre, (size_t)N * OC, tol(t->u, 1, C));
        // Backward from the CPU's pre-activation, so both sides share every input.
        free(g_pre);
        t->gpu->download_f32(t->gpu, pre, d_pre, (size_t)N * OC);
    }

    float *dout = rand_vec(t, (size_t)N * OC, 0.0f, 1.0f);
    float *dw = rand_vec(t, (size_t)OC * C, 0.0f, 1.0f),
          *dbias = with_bias ? rand_vec(t, OC, 0.0f, 1.0f) : NULL;
    float *dinp = xmalloc((size_t)N * C * sizeof(float));
    void *d_dout = dev_from(t, dout, (size_t)N * OC), *d_dw = dev_from(t, dw, (size_t)OC * C);
    void *d_dbias = with_bias ? dev_from(t, dbias, OC) : NULL,
         *d_dinp = dev_zeros(t, (size_t)N * C);
    t->gpu->matmul_backward(t->gpu, d_dinp, d_dw, d_dbias, d_dout, d_pre, d_x, d_w, N, C, OC, epi);
    t->cpu->matmul_backward(t->cpu, dinp, dw, dbias, dout, pre, x, w, N, C, OC, epi);
    float *g_dinp = fetch(t, d_dinp, (size_t)N * C), *g_dw = fetch(t, d_dw, (size_t)OC * C);
    snprintf(name, sizeof name, "matmul_backward OC=%d %s dinp", OC, tag);
    expect_close(t, name, g_dinp, dinp, (size_t)N * C, tol(t->u, r, OC));
    snprintf(name, sizeof name, "matmul_backward OC=%d %s dw (+=)", OC, tag);
    expect_close(t, name, g_dw, dw, (size_t)OC * C, tol(t->u, r, N));
    if (with_bias) {
        float *g_dbias = fetch(t, d_dbias, OC);
        snprintf(name, sizeof name, "matmul_backward OC=%d %s dbias (+=)", OC, tag);
        expect_close(t, name, g_dbias, dbias, OC, tol(t->u, r, N));
        free(g_dbias);
    }
    void *bufs[] = {d_x, d_w, d_bias, d_out, d_pre, d_dout, d_dw, d_dbias, d_dinp};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) t->gpu->release(t->gpu, bufs[i]);
    free(x), free(w), free(bias), free(out), free(pre), free(g_out), free(dout), free(dw);
    free(dbias), free(dinp), free(g_dinp), free(g_dw);
}

static void test_matmul(Ctx *t) {
    // OC = 100 is not a multiple of 8: cuBLASLt's GELU aux layout needs one, so it also runs the
    // unfused fallback; 96 runs the fused epilogue.
    const int ocs[] = {96, 100};
    for (int i = 0; i < 2; i++) {
        test_matmul_case(t, ocs[i], EPI_NONE, 0);
        test_matmul_case(t, ocs[i], EPI_NONE, 1);
        test_matmul_case(t, ocs[i], EPI_GELU, 0);
        test_matmul_case(t, ocs[i], EPI_GELU, 1);
    }
}

// ---- softmax cross-entropy ----

// Vp = 1024 rows run the 16-byte vector path; Vp = 1001 (rows not 16-byte aligned) the
// element-wise one.
static void test_softmax_xent_case(Ctx *t, int V, int Vp) {
    const int N = 37;
    char what[96];
    float *z = rand_vec(t, (size_t)N * Vp, 0.0f, 2.0f);
    int *tgt = rand_ids(t, N, V);
    tgt[3] = tgt[10] = -1;   // ignored rows
    tgt[N - 1] = V - 1;      // the last real column
    void *d_z = dev_from(t, z, (size_t)N * Vp);
    int *d_tgt = dev_ints(t, tgt, N);
    float *d_loss = t->gpu->alloc(t->gpu, N * sizeof(float)),
          *d_lse = t->gpu->alloc(t->gpu, N * sizeof(float));
    float *loss = xmalloc(N * sizeof(float)), *lse = xmalloc(N * sizeof(float)),
          *zc = copy_of(z, (size_t)N * Vp);
    // Losses are fp32 on both sides. Per row the GPU folds <= V/512 vectors per thread into its
    // running sum, each add and rescale costing <= 2 roundings, then 9 tree levels; expf is
    // within 2 ulp and logf 1 ulp: the sum is within (2 (2 + 9) + 3) 2^-24 relative, the loss
    // within that absolutely; 64 2^-24 bounds it relative to losses of order 1 and more.
    const double tol_loss = 64 * U_F32;
    t->gpu->softmax_xent(t->gpu, d_z, d_loss, d_lse, d_tgt, N, V, Vp, 0.0f);
    t->cpu->softmax_xent(t->cpu, zc, loss, lse, tgt, N, V, Vp, 0.0f);
    float *g_loss = fetch_f32(t, d_loss, N), *g_lse = fetch_f32(t, d_lse, N),
          *g_z = fetch(t, d_z, (size_t)N * Vp);
    snprintf(what, sizeof what, "softmax_xent V=%d Vp=%d loss", V, Vp);
    expect_close(t, what, g_loss, loss, N, tol_loss);
    snprintf(what, sizeof what, "softmax_xent V=%d Vp=%d lse", V, Vp);
    expect_close(t, what, g_lse, lse, N, tol_loss);
    EXPECT(memcmp(g_z, z, (size_t)N * Vp * sizeof(float)) == 0, "dscale 0 leaves the logits alone");
    EXPECT(g_loss[3] == 0.0f && g_loss[10] == 0.0f, "ignored rows have loss 0");

    // The gradient from the CPU's lse, so both sides share every input.
    const float dscale = 0.25f;
    t->gpu->upload(t->gpu, d_lse, lse, N * sizeof(float));
    t->gpu->softmax_xent(t->gpu, d_z, d_loss, d_lse, d_tgt, N, V, Vp, dscale);
    t->cpu->softmax_xent(t->cpu, zc, loss, lse, tgt, N, V, Vp, dscale);
    free(g_z);
    g_z = fetch(t, d_z, (size_t)N * Vp);
    // dlogits = dscale (exp(z - lse) - onehot): expf within 2 ulp on both sides, then one
    // rounding to the dtype.
    snprintf(what, sizeof what, "softmax_xent V=%d Vp=%d dlogits", V, Vp);
    expect_close(t, what, g_z, zc, (size_t)N * Vp, 2 * t->u + 8 * U_F32);
    int pad_zero = 1;
    for (int i = 0; i < N; i++)
        for (int j = (tgt[i] < 0 ? 0 : V); j < Vp; j++) pad_zero &= g_z[(size_t)i * Vp + j] == 0.0f;
    EXPECT(pad_zero, "padded columns and ignored rows get dlogits 0");
    void *bufs[] = {d_z, d_tgt, d_loss, d_lse};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) t->gpu->release(t->gpu, bufs[i]);
    free(z), free(tgt), free(loss), free(lse), free(zc), free(g_loss), free(g_lse), free(g_z);
}

static void test_softmax_xent(Ctx *t) {
    test_softmax_xent_case(t, 1000, 1024);
    test_softmax_xent_case(t, 1001, 1001);
}

// ---- attention through the backend (the kernels themselves: tests/gpu/test_attention_gpu.c) ----

static void test_attention(Ctx *t) {
    const int B = 2, T = 67, NH = 4, NKV = 2, HS = 64;  // T not a multiple of any tile, GQA
    const size_t nq = (size_t)B * T * NH * HS, nk = (size_t)B * T * NKV * HS,
                 nl = (size_t)B * NH * T;
    float *q = rand_vec(t, nq, 0.0f, 1.0f), *k = rand_vec(t, nk, 0.0f, 1.0f),
          *v = rand_vec(t, nk, 0.0f, 1.0f);
    float *dout = rand_vec(t, nq, 0.0f, 1.0f);
    void *d_q = dev_from(t, q, nq), *d_k = dev_from(t, k, nk), *d_v = dev_from(t, v, nk);
    void *d_do = dev_from(t, dout, nq), *d_out = dev_zeros(t, nq);
    void *d_dq = dev_zeros(t, nq), *d_dk = dev_zeros(t, nk), *d_dv = dev_zeros(t, nk);
    float *d_lse = t->gpu->alloc(t->gpu, nl * sizeof(float));
    float *out = xmalloc(nq * sizeof(float)), *lse = xmalloc(nl * sizeof(float));
    float *dq = xmalloc(nq * sizeof(float)), *dk = xmalloc(nk * sizeof(float)),
          *dv = xmalloc(nk * sizeof(float));

    AttnParams p;
    memset(&p, 0, sizeof p);
    p.q_st = p.o_st = p.do_st = p.dq_st = (AttnStrides){(int64_t)T * NH * HS, (int64_t)NH * HS, HS};
    p.k_st = p.v_st = p.dk_st = p.dv_st =
        (AttnStrides){(int64_t)T * NKV * HS, (int64_t)NKV * HS, HS};
    p.B = B, p.T_q = p.T_k = T, p.NH = NH, p.NKV = NKV, p.HS = HS;
    p.scale = 1.0f / sqrtf((float)HS);
    p.causal = 1;
    p.window_left = p.window_right = -1;
    p.impl = ATTN_IMPL_FLASH;
    p.deterministic = 1;
    AttnParams pc = p, pg = p;
    pc.q = q, pc.k = k, pc.v = v, pc.out = out, pc.lse = lse;
    pc.dout = dout, pc.dq = dq, pc.dk = dk, pc.dv = dv;
    pg.q = d_q, pg.k = d_k, pg.v = d_v, pg.out = d_out, pg.lse = d_lse;
    pg.dout = d_do, pg.dq = d_dq, pg.dk = d_dk, pg.dv = d_dv;
    backend_attention(t->cpu, &pc, 0);
    backend_attention(t->gpu, &pg, 0);
    backend_attention(t->cpu, &pc, 1);
    backend_attention(t->gpu, &pg, 1);
    float *g_out = fetch(t, d_out, nq), *g_lse = fetch_f32(t, d_lse, nl);
    float *g_dq = fetch(t, d_dq, nq), *g_dk = fetch(t, d_dk, nk), *g_dv = fetch(t, d_dv, nk);
    // Forward: P rounded before P V, then out: 2 roundings over K = T keys. Backward: P and dS
    // rounded before their matmuls, then the result; dS = P (dP - D) cancels: 4 roundings.
    expect_close(t, "attention out", g_out, out, nq, tol(t->u, 2, T));
    expect_close(t, "attention lse (fp32)", g_lse, lse, nl, tol(U_F32, 1, HS * T));
    expect_close(t, "attention dq", g_dq, dq, nq, tol(t->u, 4, T));
    expect_close(t, "attention dk", g_dk, dk, nk, tol(t->u, 4, T * NH / NKV));
    expect_close(t, "attention dv", g_dv, dv, nk, tol(t->u, 4, T * NH / NKV));
    void *bufs[] = {d_q, d_k, d_v, d_do, d_out, d_dq, d_dk, d_dv, d_lse};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) t->gpu->release(t->gpu, bufs[i]);
    free(q), free(k), free(v), free(dout), free(out), free(lse), free(dq), free(dk), free(dv);
    free(g_out), free(g_lse), free(g_dq), free(g_dk), free(g_dv);
}

// ---- the whole model ----

static void small_config(Config *c) {
    fixture_gpu_model_config(c);
    c->model.pos_embedding = POS_LEARNED;
}

// A model variant: positions, residual dropout and the long-context options.
typedef struct {
    const char *pos;        // model.pos_embedding
    float resid_dropout;    // model.dropout
    int doc_mask;           // packed documents split at MODEL_EOT
    int window, window_every;
    int head_rows;          // rows per classifier chunk on the GPU (0: the default, one chunk)
} ModelCase;

#define MODEL_EOT 3   // data.eot_token of the packed-document cases

// The model end to end, without dropout and with model.dropout (the same masks on both backends:
// each dropout site adds one rounding to the dtype), with learned, rotary or ALiBi positions,
// packed documents and per-layer windows.
static void model_case(Ctx *t, ModelCase var) {
    Config c;
    small_config(&c);
    c.model.dropout = var.resid_dropout;
    {
        char kv[96], why[256];
        snprintf(kv, sizeof kv, "model.pos_embedding=%s", var.pos);
        CHECK(config_set(&c, kv, why, sizeof why) == 0);
    }
    c.attention.doc_mask = var.doc_mask;
    c.data.eot_token = var.doc_mask ? MODEL_EOT : -1;
    c.attention.window = var.window;
    c.attention.window_every = var.window_every;
    const float resid_dropout = var.resid_dropout;
    const int B = 2, T = 40, N = B * T;
    GPTConfig g = gpt_config_from(&c);
    GPT *mg = gpt_create(&g, t->gpu, B, T, &c), *mc = gpt_create(&g, t->cpu, B, T, &c);
    char err[ERR_LEN];
    if (var.head_rows > 0)
        EXPECT(gpt_set_head_rows(mg, var.head_rows, err, sizeof err) == 0, "%d rows refused: %s", var.head_rows, err);
    const size_t np = gpt_num_params(mg);
    float *w = xmalloc(np * sizeof(float));  // (np)
    gpt_init_weights_host(mg, w, 42);
    gpt_set_params_f32(mg, w);
    gpt_get_params_f32(mg, w);  // rounded to the dtype: the CPU model gets the same weights
    gpt_set_params_f32(mc, w);
    int *tok = rand_ids(t, N, g.V), *tgt = rand_ids(t, N, g.V);
    tgt[5] = -1;
    if (var.doc_mask) {   // a document every ~7 tokens, one ending row 0, two opening row 1
        for (int i = 0; i < N; i++)
            if (i % 7 == 4) tok[i] = MODEL_EOT;
        tok[T - 1] = tok[T] = tok[T + 1] = MODEL_EOT;
    }

    // Stages on the path to the logits: embedding, 9 per block (ln1, qkv, attention, proj, add,
    // ln2, fc, fcproj, add), lnf, the classifier matmul; the gradients add as many backwards.
    // RoPE adds one rounding per block (q and k rotated in place).
    const int S_drop = resid_dropout > 0.0f ? 2 * g.L + 1 : 0;
    const int S_rope = strcmp(var.pos, "rope") == 0 ? g.L : 0;
    const int S_fwd = 2 + 9 * g.L + 1 + S_drop + S_rope, S_bwd = 2 * S_fwd + 1;
    const double k_term = 4.0 * sqrt(4.0 * g.C) * U_F32;   // longest fp32 sum: K = 4C
    const double tol_fwd = 3.0 * sqrt((double)S_fwd) * (t->u + k_term);
    const double tol_bwd = 3.0 * sqrt((double)S_bwd) * (t->u + k_term);

    gpt_set_rng_step(mg, 3);
    gpt_set_rng_step(mc, 3);
    const float loss_g = gpt_forward(mg, tok, tgt, B, T), loss_c = gpt_forward(mc, tok, tgt, B, T);
    printf("    %-5s loss gpu %.6f cpu %.6f\n", dtype_name(t->dt), loss_g, loss_c);
    EXPECT(fabsf(loss_g - loss_c) <= tol_fwd * fabsf(loss_c), "model loss %g vs %g", loss_g,
           loss_c);
    float *lg = xmalloc((size_t)N * g.V * sizeof(float)),
          *lc = xmalloc((size_t)N * g.V * sizeof(float));
    gpt_logits_f32(mg, lg);
    gpt_logits_f32(mc, lc);
    expect_close(t, "model logits", lg, lc, (size_t)N * g.V, tol_fwd);
    float *pl_g = xmalloc(N * sizeof(float)), *pl_c = xmalloc(N * sizeof(float));
    gpt_losses_f32(mg, pl_g);
    gpt_losses_f32(mc, pl_c);
    expect_close(t, "model per-token losses", pl_g, pl_c, N, tol_fwd);

    // A loss scale, as fp16 training uses: it keeps fp16 gradients out of the subnormal range
    // (a power of two, so exact for every dtype).
    const float grad_scale = 1024.0f;
    gpt_zero_grad(mg);
    gpt_zero_grad(mc);
    gpt_backward(mg, grad_scale);
    gpt_backward(mc, grad_scale);
    float *gg = xmalloc(np * sizeof(float)), *gc = xmalloc(np * sizeof(float));
    gpt_get_grads_f32(mg, gg);
    gpt_get_grads_f32(mc, gc);
    for (int i = 0; i < gpt_num_tensors(mg); i++) {
        const ParamTensor *pt = gpt_tensor(mg, i);
        char name[96];
        snprintf(name, sizeof name, "grad %s", pt->name);
        expect_close(t, name, gg + pt->offset, gc + pt->offset, pt->numel, tol_bwd);
    }
    // Determinism: the same step again gives bitwise the same gradients.
    gpt_forward(mg, tok, tgt, B, T);
    gpt_zero_grad(mg);
    gpt_backward(mg, grad_scale);
    float *gg2 = xmalloc(np * sizeof(float));
    gpt_get_grads_f32(mg, gg2);
    EXPECT(memcmp(gg, gg2, np * sizeof(float)) == 0, "model gradients are bitwise reproducible");
    if (resid_dropout > 0.0f) {   // the counter CUDA graphs read: base 1 + step 2 is step 3
        gpt_set_rng_base(mg, 1);
        gpt_set_rng_step(mg, 2);
        const float loss_base = gpt_forward(mg, tok, tgt, B, T);
        gpt_zero_grad(mg);
        gpt_backward(mg, grad_scale);
        gpt_get_grads_f32(mg, gg2);
        EXPECT(loss_base == loss_g && memcmp(gg, gg2, np * sizeof(float)) == 0,
               "dropout from the device counter: loss %.9g vs %.9g, gradients %s", loss_base,
               loss_g, memcmp(gg, gg2, np * sizeof(float)) ? "differ" : "equal");
    }
    gpt_free(mg);
    gpt_free(mc);
    free(w), free(tok), free(tgt), free(lg), free(lc), free(pl_g), free(pl_c), free(gg), free(gc),
        free(gg2);
}

static void test_model(Ctx *t) { model_case(t, (ModelCase){"learned", 0.0f, 0, -1, 1, 0}); }
static void test_model_dropout(Ctx *t) { model_case(t, (ModelCase){"learned", 0.2f, 0, -1, 1, 0}); }
static void test_model_rope(Ctx *t) { model_case(t, (ModelCase){"rope", 0.0f, 0, -1, 1, 0}); }
static void test_model_alibi(Ctx *t) { model_case(t, (ModelCase){"alibi", 0.0f, 0, -1, 1, 0}); }
static void test_model_rope_docs(Ctx *t) { model_case(t, (ModelCase){"rope", 0.0f, 1, 9, 2, 0}); }
static void test_model_learned_docs(Ctx *t) { model_case(t, (ModelCase){"learned", 0.0f, 1, -1, 1, 0}); }
static void test_model_head_chunks(Ctx *t) { model_case(t, (ModelCase){"learned", 0.0f, 0, -1, 1, 13}); }

// ---- AdamW and the gradient sum of squares ----

static void test_adamw(Ctx *t) {
    Config c;
    fixture_adamw_config(&c);
    // Spans with and without decay, one longer than a kernel chunk, and a gap left untouched.
    const OptimSpan spans[] = {{0, 1000, 1}, {1000, 37, 0}, {1100, 40000, 1}};
    const size_t n = 41100;
    float *master = rand_vec(t, n, 0.0f, 0.5f), *grads = rand_vec(t, n, 0.0f, 1.0f);
    void *d_grads = dev_from(t, grads, n);   // grads now hold the dtype's values on both sides
    void *d_params = dev_from(t, master, n);
    float *rounded_start = copy_of(master, n);
    AdamWCuda og;
    AdamW oc;
    adamw_cuda_init(&og, n, spans, 3, &c, (DType)t->dt, NULL);
    adamw_init(&oc, n, spans, 3, &c);
    adamw_cuda_upload(&og, master, NULL, NULL);
    const float lrs[] = {1e-3f, 6e-4f, 3e-4f}, mults[] = {1.0f, 0.5f, 1.0f / 1024.0f};
    for (int s = 0; s < 3; s++) {
        t->gpu->synchronize(t->gpu);
        adamw_cuda_step(&og, d_params, d_grads, lrs[s], mults[s]);
        adamw_step_cpu(&oc, master, grads, s + 1, lrs[s], mults[s]);
    }
    float *g_master = xmalloc(n * sizeof(float)), *g_m = xmalloc(n * sizeof(float)),
          *g_v = xmalloc(n * sizeof(float));
    adamw_cuda_download(&og, g_master, g_m, g_v);
    EXPECT(memcmp(g_master, master, n * sizeof(float)) == 0,
           "%s AdamW master weights bitwise as the CPU", dtype_name(t->dt));
    EXPECT(memcmp(g_m, oc.m, n * sizeof(float)) == 0 && memcmp(g_v, oc.v, n * sizeof(float)) == 0,
           "%s AdamW moments bitwise as the CPU", dtype_name(t->dt));
    EXPECT(adamw_cuda_get_t(&og) == 3, "step count %lld after 3 steps", adamw_cuda_get_t(&og));
    // The compute-dtype parameters are the master weights rounded once; the gap between the
    // spans keeps its starting values.
    float *g_params = fetch(t, d_params, n);
    void *d_round = dev_from(t, master, n);   // master now rounded to the dtype
    int same = 1;
    for (size_t i = 0; i < n; i++) same &= g_params[i] == master[i];
    for (size_t i = 1037; i < 1100; i++) same &= g_params[i] == rounded_start[i];
    EXPECT(same, "%s AdamW params are the rounded master weights", dtype_name(t->dt));

    // Sum of squares: double sums in another order differ by at most n 2^-53 relative.
    const double ss_g = adamw_cuda_grad_sumsq(&og, d_grads), ss_c = sumsq_cpu(grads, n);
    EXPECT(fabs(ss_g - ss_c) <= (double)n * 0x1p-53 * ss_c, "sumsq %.17g vs %.17g", ss_g, ss_c);
    grads[777] = INFINITY;
    t->gpu->upload_f32(t->gpu, d_grads, grads, n);
    EXPECT(!isfinite(adamw_cuda_grad_sumsq(&og, d_grads)),
           "an inf gradient makes the sum non-finite");
    grads[777] = NAN;
    t->gpu->upload_f32(t->gpu, d_grads, grads, n);
    EXPECT(!isfinite(adamw_cuda_grad_sumsq(&og, d_grads)),
           "a NaN gradient makes the sum non-finite");

    adamw_cuda_free(&og);
    adamw_free(&oc);
    t->gpu->release(t->gpu, d_grads);
    t->gpu->release(t->gpu, d_params);
    t->gpu->release(t->gpu, d_round);
    free(master), free(grads), free(rounded_start), free(g_master), free(g_m), free(g_v),
        free(g_params);
}

// Usage: test_ops_cuda [fp32|bf16|fp16]   (default: all three)
// Usage: test_ops_cuda [fp32|bf16|fp16|--quick]: one dtype, or every dtype; --quick is bf16
// alone, the subset compute-sanitizer runs (make test-gpu-sanitize).
int main(int argc, char **argv) {
    const DType dts[] = {DTYPE_F32, DTYPE_BF16, DTYPE_F16};
    const char *only = argc > 1 ? (strcmp(argv[1], "--quick") == 0 ? "bf16" : argv[1]) : NULL;
    for (int i = 0; i < 3; i++) {
        if (only && strcmp(only, dtype_name(dts[i])) != 0) continue;
        Ctx t;
        memset(&t, 0, sizeof t);
        t.dt = dts[i];
        t.u = dtype_unit_roundoff(t.dt);
        t.gpu = backend_cuda_create(t.dt, 0, ATTN_KERNEL_AUTO);
        t.cpu = backend_cpu_create();
        rng_seed(&t.rng, 1234 + (uint64_t)i);
        char name[64];
#define RUN(label, fn)                                                  \
    snprintf(name, sizeof name, "%s %s", label, dtype_name(t.dt));      \
    TEST_CASE(name, fn(&t))
        RUN("memory", test_memory);
        RUN("strided copies and fp32 stores", test_strided);
        RUN("embedding", test_embed);
        RUN("layernorm", test_layernorm);
        RUN("add", test_add);
        RUN("dropout", test_dropout);
        RUN("dropout inside add, add+ln and ln backward", test_fused_dropout);
        RUN("matmul", test_matmul);
        RUN("softmax_xent", test_softmax_xent);
        RUN("attention", test_attention);
        RUN("rope", test_rope);
        RUN("model", test_model);
        RUN("model with dropout", test_model_dropout);
        RUN("model rope", test_model_rope);
        RUN("model alibi", test_model_alibi);
        RUN("model rope, packed documents, window 9 on even layers", test_model_rope_docs);
        RUN("model learned, packed documents", test_model_learned_docs);
        RUN("model, classifier in chunks of 13 rows", test_model_head_chunks);
        RUN("adamw", test_adamw);
#undef RUN
        t.gpu->destroy(t.gpu);
        t.cpu->destroy(t.cpu);
    }
    return TEST_SUMMARY();
}
