// GPU decode attention tests: attn_decode (the split-KV kernel) against attn_forward on the same
// problem (the flash path the model's decode step used before it) and a float64 reference, on a
// KV cache laid out (B, NKV, T_max, HS) as the model's, for T_k in {1, 17, 1000, 4097, 70000},
// GQA groups of 1, 4 and 12 heads, 1 to 8 queries, bf16 and fp16, HS 64 and 128, windows, ALiBi
// and fully masked rows (more queries than keys). Every case checks that the split kernel ran
// (attn_decode_splits), with more than one split for long caches, and that a caller's workspace
// of attn_workspace_bytes gives the very bits of the context's (a smaller one is refused). Then
// the model: a small bf16 and fp16 RoPE GPT decoding greedily with the split kernel and without
// it (gpt_set_decode_split) picks the same tokens, three sequences decoded together give the
// single sequence's logits, and a 1000-token prompt prefilled (gpt_decode_prefill, in one chunk
// and in chunks of 384, dense and on bigbird layers) gives the logits of feeding it step by step and the same greedy tokens;
// a batch whose cache does not fit the GPU's free memory is refused before anything is made.
//
// Tolerance (STYLE.md): the split kernel's rms error against float64 stays within 2x the flash
// path's (a same-precision implementation; the flash kernel also rounds P to the element type,
// the split kernel keeps it in fp32), plus 1e-4 for fp32 accumulation-order noise (sums of up
// to 7e4 terms at 2^-24 each stay under 1e-5 rms). Its lse, computed in fp32 from the same
// rounded inputs, stays within 1e-4 * (1 + |lse|) of float64's: a log-sum-exp over 7e4 terms
// accumulated in fp32 is good to a few 1e-6 relative.
//
// Model tolerance: the two decode paths differ by the attention output's rounding (an ulp of
// the element type, 2^-8 for bf16, 2^-11 for fp16), and the batched one and the prefill by the
// matmuls' and the attention's sum order, each rounding carried through two layers and the head; their logits stay within 8 unit
// roundoffs (rms, relative: two layers of 4 roundings each between the attention output and
// the next residual), and greedy tokens may differ only where the top two logits are closer
// than that (then the sequences part, and the test stops).
//
// Usage: test_decode_gpu [--quick]   (--quick: the cases up to T_k 4097, for compute-sanitizer)
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention/attention.h"
#include "attention/mask.h"
#include "common/check.h"
#include "common/config.h"
#include "common/rng.h"
#include "model/backend.h"
#include "model/gpt.h"
#include "tests/testlib.h"
#include "tests/gpu/cuda_ok.h"

typedef struct {
    DType dtype;
    int B, T_q, T_k, NH, NKV, HS;
    int window, alibi;   // window_left (-1 unbounded); ALiBi slopes on
} Case;

// A device tensor of n elements of the backend's dtype and its rounded values on the host.
typedef struct {
    float *h;
    void *d;
    size_t n;
} Tensor;

static Tensor tensor_random(Backend *be, size_t n, float amp, Rng *rng) {
    Tensor t = {malloc(n * sizeof(float)), be->alloc(be, n * dtype_size(be->dtype)), n};
    for (size_t i = 0; i < n; i++) t.h[i] = amp * (2.f * rng_uniform(rng) - 1.f);
    be->upload_f32(be, t.d, t.h, n);
    be->download_f32(be, t.h, t.d, n);   // the values the GPU holds
    return t;
}
static void tensor_free(Backend *be, Tensor *t) {
    free(t->h);
    be->release(be, t->d);
}

// float64 attention of query row (b, h, i) into out (HS); returns its lse (+inf when masked).
static double ref_row(const AttnParams *p, const Tensor *q, const Tensor *k, const Tensor *v,
                      const float *slopes, int b, int h, int i, double *out) {
    const int kvh = h / (p->NH / p->NKV);
    const AttnKeyRange r = attn_key_range(p, b, i);
    const float *qr = q->h + b * p->q_st.batch + i * p->q_st.row + h * p->q_st.head;
    const int64_t pos = i + attn_query_shift(p);
    double *s = malloc((size_t)(r.hi > r.lo ? r.hi - r.lo : 1) * sizeof(double)), mx = -INFINITY;
    for (int j = r.lo; j < r.hi; j++) {
        const float *kr = k->h + b * p->k_st.batch + j * p->k_st.row + kvh * p->k_st.head;
        double dot = 0;
        for (int d = 0; d < p->HS; d++) dot += (double)qr[d] * kr[d];
        double sc = dot * p->scale;
        if (slopes) sc -= (double)slopes[h] * (double)llabs(pos - j);
        s[j - r.lo] = sc;
        if (sc > mx) mx = sc;
    }
    for (int d = 0; d < p->HS; d++) out[d] = 0;
    if (r.hi <= r.lo) {
        free(s);
        return INFINITY;
    }
    double sum = 0;
    for (int j = r.lo; j < r.hi; j++) {
        const double e = exp(s[j - r.lo] - mx);
        const float *vr = v->h + b * p->v_st.batch + j * p->v_st.row + kvh * p->v_st.head;
        sum += e;
        for (int d = 0; d < p->HS; d++) out[d] += e * vr[d];
    }
    for (int d = 0; d < p->HS; d++) out[d] /= sum;
    free(s);
    return mx + log(sum);
}

// Output and lse of one run, on the host.
typedef struct {
    float *out, *lse;
} Result;

static Result run(Backend *be, AttnParams *p, int split, size_t n_out, size_t n_lse) {
    char err[512];
    Result r = {malloc(n_out * sizeof(float)), malloc(n_lse * sizeof(float))};
    const int rc = split ? attn_decode(be->attn, p, err, sizeof err) : attn_forward(be->attn, p, err, sizeof err);
    EXPECT(rc == 0, "%s: %s", split ? "attn_decode" : "attn_forward", err);
    CUDA_OK(cudaDeviceSynchronize());
    be->download_f32(be, r.out, p->out, n_out);
    CUDA_OK(cudaMemcpy(r.lse, p->lse, n_lse * sizeof(float), cudaMemcpyDeviceToHost));
    return r;
}

// rms of (a - ref) over rms of ref.
static double rel_err(const float *a, const double *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += (a[i] - ref[i]) * (a[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void run_case(Backend *be, const Case *c, Rng *rng) {
    const int T_max = c->T_k + 3, HS = c->HS;   // the cache holds more rows than are filled
    const size_t n_q = (size_t)c->B * c->T_q * c->NH * HS, n_lse = (size_t)c->B * c->NH * c->T_q;
    const size_t n_kv = (size_t)c->B * c->NKV * T_max * HS;
    Tensor q = tensor_random(be, n_q, 2.f, rng), k = tensor_random(be, n_kv, 1.f, rng),
           v = tensor_random(be, n_kv, 1.f, rng);
    AttnParams p;
    memset(&p, 0, sizeof p);
    p.q = q.d;
    p.k = k.d;
    p.v = v.d;
    p.out = be->alloc(be, n_q * dtype_size(c->dtype));
    p.lse = be->alloc(be, n_lse * sizeof(float));
    p.q_st = p.o_st = (AttnStrides){(int64_t)c->T_q * c->NH * HS, (int64_t)c->NH * HS, HS};
    p.k_st = p.v_st = (AttnStrides){(int64_t)c->NKV * T_max * HS, HS, (int64_t)T_max * HS};
    p.B = c->B;
    p.T_q = c->T_q;
    p.T_k = c->T_k;
    p.NH = c->NH;
    p.NKV = c->NKV;
    p.HS = HS;
    p.scale = 1.0f / sqrtf((float)HS);
    p.causal = 1;
    p.window_left = c->window;
    p.window_right = -1;
    p.dtype = c->dtype;
    p.impl = ATTN_IMPL_FLASH;
    float *slopes = NULL;
    if (c->alibi) {
        slopes = malloc((size_t)c->NH * sizeof(float));
        for (int h = 0; h < c->NH; h++) slopes[h] = powf(2.f, -8.f * (h + 1) / c->NH);
        p.alibi_slopes = be->alloc(be, (size_t)c->NH * sizeof(float));
        CUDA_OK(cudaMemcpy((void *)p.alibi_slopes, slopes, (size_t)c->NH * sizeof(float), cudaMemcpyHostToDevice));
    }
    const int splits = attn_decode_splits(be->attn, &p);
    EXPECT(splits >= 1, "the split kernel does not take this case");
    if (c->B == 1 && c->T_k >= 4097 && c->window < 0)
        EXPECT(splits > 1, "a cache of %d keys runs in %d split(s)", c->T_k, splits);

    double *ref = malloc(n_q * sizeof(double)), *lse_ref = malloc(n_lse * sizeof(double));
    for (int b = 0; b < c->B; b++)
        for (int h = 0; h < c->NH; h++)
            for (int i = 0; i < c->T_q; i++)
                lse_ref[((size_t)b * c->NH + h) * c->T_q + i] =
                    ref_row(&p, &q, &k, &v, slopes, b, h, i,
                            ref + (size_t)b * p.o_st.batch + i * p.o_st.row + h * p.o_st.head);
    Result split = run(be, &p, 1, n_q, n_lse), flash = run(be, &p, 0, n_q, n_lse);
    // The caller's workspace of attn_workspace_bytes: the same kernel, the same bits.
    p.workspace_bytes = attn_workspace_bytes(&p, DEVICE_CUDA);
    CUDA_OK(cudaMalloc(&p.workspace, p.workspace_bytes));
    Result own = run(be, &p, 1, n_q, n_lse);
    EXPECT(memcmp(own.out, split.out, n_q * sizeof(float)) == 0 && memcmp(own.lse, split.lse, n_lse * sizeof(float)) == 0,
           "attn_decode in the caller's workspace differs from the context's");
    char err[512] = "";
    p.workspace_bytes -= 16;
    EXPECT(attn_decode(be->attn, &p, err, sizeof err) != 0 && strstr(err, "needs a workspace"),
           "a workspace 16 bytes short was accepted: %s", err);
    CUDA_OK(cudaFree(p.workspace));
    p.workspace = NULL;
    p.workspace_bytes = 0;
    free(own.out);
    free(own.lse);
    const double e_split = rel_err(split.out, ref, n_q), e_flash = rel_err(flash.out, ref, n_q);
    EXPECT(e_split <= 2 * e_flash + 1e-4, "out rms error %.3g against float64, flash path %.3g", e_split, e_flash);
    int lse_bad = 0, masked_bad = 0;
    for (size_t x = 0; x < n_lse; x++) {
        if (isinf(lse_ref[x])) {
            masked_bad += !(isinf(split.lse[x]) && split.lse[x] > 0);
            for (int d = 0; d < HS; d++) {   // its row of out: (b, h, i) of index x
                const size_t b = x / ((size_t)c->NH * c->T_q), h = x / c->T_q % c->NH, i = x % c->T_q;
                masked_bad += split.out[b * p.o_st.batch + i * p.o_st.row + h * p.o_st.head + d] != 0.f;
            }
        } else if (!(fabs(split.lse[x] - lse_ref[x]) <= 1e-4 * (1 + fabs(lse_ref[x])))) {
            if (!lse_bad) printf("  lse[%zu] %.7g, float64 %.7g\n", x, split.lse[x], lse_ref[x]);
            lse_bad++;
        }
    }
    EXPECT(lse_bad == 0, "%d lse values off", lse_bad);
    EXPECT(masked_bad == 0, "%d values of fully masked rows are not lse +inf, out 0", masked_bad);
    printf("  %s B=%d T_q=%d T_k=%d NH=%d NKV=%d HS=%d window=%d alibi=%d: %d splits, out error %.3g "
           "(flash path %.3g)\n", dtype_name(c->dtype), c->B, c->T_q, c->T_k, c->NH, c->NKV, HS, c->window,
           c->alibi, splits, e_split, e_flash);
    free(split.out);
    free(split.lse);
    free(flash.out);
    free(flash.lse);
    free(ref);
    free(lse_ref);
    free(slopes);
    if (p.alibi_slopes) be->release(be, (void *)p.alibi_slopes);
    be->release(be, p.out);
    be->release(be, p.lse);
    tensor_free(be, &q);
    tensor_free(be, &k);
    tensor_free(be, &v);
}

// A 2-layer RoPE GPT with GQA (4 query heads, 2 K/V heads of 64) and GPT-2's initialisation
// with the weights scaled up so that the logits are far from uniform; sparse: bigbird layers
// (band 2 blocks, 1 global, 2 random), which a 1000-token prompt crosses.
static GPT *sparse_model(Backend *be, int sparse) {
    GPTConfig g = {.V = 101, .Vp = 128, .maxT = 1100, .L = 2, .NH = 4, .NKV = 2, .C = 256, .HS = 64,
                   .pos = POS_ROPE, .rope_theta = 10000.0f};
    Config run;
    config_defaults(&run);
    if (sparse) {
        run.attention.sparse = ATTN_SPARSE_BIGBIRD;
        run.attention.sparse_band = 256;
        run.attention.sparse_global = 128;
        run.attention.sparse_random = 2;
    }
    GPT *m = gpt_create(&g, be, 1, 64, &run);
    float *params = malloc(gpt_num_params(m) * sizeof(float));
    gpt_init_weights_host(m, params, 5);
    for (size_t i = 0; i < gpt_num_params(m); i++) params[i] *= 4.f;
    gpt_set_params_f32(m, params);
    free(params);
    return m;
}

static GPT *small_model(Backend *be) { return sparse_model(be, 0); }

static int argmax(const float *x, int n, float *gap) {
    int best = 0, second = -1;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) {
            second = best;
            best = i;
        } else if (second < 0 || x[i] > x[second]) {
            second = i;
        }
    *gap = x[best] - x[second];
    return best;
}

// The greedy tokens of the logits ls and lp (V) of two paths at position pos: 1 when they agree
// (the token in *token), 0 when they part, which is allowed only at a near tie (the top-two gap
// of ls under tol of its largest magnitude).
static int same_greedy(const float *ls, const float *lp, int V, double tol, int pos, int *token) {
    float gap_s, gap_p;
    const int ts = argmax(ls, V, &gap_s), tp = argmax(lp, V, &gap_p);
    if (ts != tp) {
        float mx = 0;
        for (int i = 0; i < V; i++) mx = fmaxf(mx, fabsf(ls[i]));
        EXPECT(gap_s < tol * mx, "greedy tokens %d and %d at position %d, top-2 gap %g of %g", ts, tp, pos,
               gap_s, mx);
        return 0;
    }
    *token = ts;
    return 1;
}

// The logit tolerance of two paths whose attention outputs each round once to the dtype: they
// may differ by a rounding u per element; each of the L layers carries that through C-wide
// reductions (projection, LayerNorm, MLP, classifier), where independent roundings grow as
// sqrt(C): logits within L * sqrt(C) * u of each other (32u here).
static double model_tol(const GPT *m, DType dt) {
    return gpt_cfg(m)->L * sqrt((double)gpt_cfg(m)->C) * dtype_unit_roundoff(dt);
}

static void test_model(DType dt) {
    enum { PROMPT = 1000, NEW = 60, NB = 3 };
    Backend *be = backend_cuda_create(dt, 0, ATTN_KERNEL_AUTO);
    GPT *split = small_model(be), *plain = small_model(be), *batched = small_model(be);
    gpt_set_decode_split(plain, 0);
    // The batch's cache holds the positions it feeds, fewer than max_seq_len (the singles' cache):
    // other strides, the same logits; its V < Vp logits come down in one download per step.
    char err[ERR_LEN];
    EXPECT(gpt_decode_reserve(batched, NB, PROMPT + NEW, err, sizeof err) == 0, "%s", err);
    const int V = gpt_cfg(split)->V;
    const double tol = model_tol(split, dt);
    float *ls = malloc((size_t)V * sizeof(float)), *lp = malloc((size_t)V * sizeof(float));
    float *lb = malloc((size_t)NB * V * sizeof(float));
    Rng rng;
    rng_seed(&rng, 77);
    int token = (int)rng_below(&rng, V), same = 0, parted = 0;
    double worst = 0, worst_batch = 0;
    for (int pos = 0; pos < PROMPT + NEW; pos++) {
        const int tokens[NB] = {token, token, token};
        gpt_decode_step(split, token, pos, ls);
        gpt_decode_step(plain, token, pos, lp);
        gpt_decode_batch(batched, tokens, NB, pos, lb);
        const double e = rel_err_f32(ls, lp, (size_t)V), eb = rel_err_f32(lb + (size_t)(NB - 1) * V, ls, (size_t)V);
        worst = e > worst ? e : worst;
        worst_batch = eb > worst_batch ? eb : worst_batch;
        if (pos < PROMPT) {
            token = (int)rng_below(&rng, V);
            continue;
        }
        if (!same_greedy(ls, lp, V, tol, pos, &token)) {
            parted = 1;
            break;
        }
        same++;
    }
    EXPECT(worst < tol, "split and unsplit decode logits differ by %.3g (tolerance %.3g)", worst, tol);
    EXPECT(worst_batch < tol, "batched and single decode logits differ by %.3g", worst_batch);
    printf("  %s: %d greedy tokens the same%s; logits differ by %.3g (split/unsplit), %.3g (batch/single)\n",
           dtype_name(dt), same, parted ? " then a near tie" : "", worst, worst_batch);
    free(ls);
    free(lp);
    free(lb);
    gpt_free(split);
    gpt_free(plain);
    gpt_free(batched);
    be->destroy(be);
}

// A PROMPT-token prompt prefilled (chunks of `rows`, 0: the default) against the same prompt fed
// step by step: the logits after it, then greedy tokens until NEW or a near tie.
static void test_prefill(DType dt, int rows, int sparse) {
    enum { PROMPT = 1000, NEW = 60 };
    Backend *be = backend_cuda_create(dt, 0, ATTN_KERNEL_AUTO);
    GPT *pre = sparse_model(be, sparse), *step = sparse_model(be, sparse);
    char err[ERR_LEN];
    if (rows > 0) EXPECT(gpt_set_prefill_rows(pre, rows, err, sizeof err) == 0, "%d rows refused: %s", rows, err);
    const int V = gpt_cfg(pre)->V;
    const double tol = model_tol(pre, dt);
    int *prompt = malloc(PROMPT * sizeof(int));
    Rng rng;
    rng_seed(&rng, 78);
    for (int i = 0; i < PROMPT; i++) prompt[i] = (int)rng_below(&rng, V);
    float *lp = malloc((size_t)V * sizeof(float)), *ls = malloc((size_t)V * sizeof(float));
    gpt_decode_prefill(pre, prompt, PROMPT, 1, 0, lp);
    for (int i = 0; i < PROMPT; i++) gpt_decode_step(step, prompt[i], i, ls);
    double worst = rel_err_f32(ls, lp, (size_t)V);
    int same = 0, parted = 0, token = 0;
    for (int pos = PROMPT; pos < PROMPT + NEW; pos++) {
        if (!same_greedy(ls, lp, V, tol, pos, &token)) {
            parted = 1;
            break;
        }
        same++;
        gpt_decode_step(pre, token, pos, lp);
        gpt_decode_step(step, token, pos, ls);
        const double e = rel_err_f32(ls, lp, (size_t)V);
        worst = e > worst ? e : worst;
    }
    EXPECT(worst < tol, "prefilled and stepped logits differ by %.3g (tolerance %.3g)", worst, tol);
    printf("  %s%s, chunks of %d: %d greedy tokens the same%s; logits differ by %.3g\n", dtype_name(dt),
           sparse ? " bigbird" : "", rows > 0 ? rows : 4096, same, parted ? " then a near tie" : "", worst);
    free(prompt);
    free(lp);
    free(ls);
    gpt_free(pre);
    gpt_free(step);
    be->destroy(be);
}

// 2^20 sequences of 1100 positions (about 2 TiB of cache) do not fit any GPU: refused with the
// bytes needed and free, and nothing allocated (a batch of 2 still fits afterwards). 2^18
// sequences of the 1100 positions (about 300 GiB) do not fit one H200 either, but a cache of the
// 16 positions a short sample feeds (about 9 GiB with the activations) does.
static void test_batch_beyond_memory(void) {
    Backend *be = backend_cuda_create(DTYPE_BF16, 0, ATTN_KERNEL_AUTO);
    GPT *m = small_model(be), *many = small_model(be);
    const int maxT = gpt_cfg(m)->maxT;
    char err[512] = "";
    EXPECT(gpt_decode_reserve(m, 1 << 20, maxT, err, sizeof err) == -1 && strstr(err, "GiB free on the GPU"),
           "a cache beyond the GPU's memory: %s", err);
    EXPECT(gpt_decode_reserve(m, 2, maxT, err, sizeof err) == 0, "2 sequences after the refusal: %s", err);
    EXPECT(gpt_decode_reserve(many, 1 << 18, maxT, err, sizeof err) == -1 && strstr(err, "GiB free on the GPU"),
           "2^18 sequences of %d positions: %s", maxT, err);
    EXPECT(gpt_decode_reserve(many, 1 << 18, 16, err, sizeof err) == 0, "2^18 sequences of 16 positions: %s", err);
    gpt_free(m);
    gpt_free(many);
    be->destroy(be);
}

int main(int argc, char **argv) {
    const int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    const DType dts[] = {DTYPE_BF16, DTYPE_F16};
    const int tks[] = {1, 17, 1000, 4097, 70000};
    const int groups[][2] = {{4, 4}, {8, 2}};   // (NH, NKV): GQA groups of 1 and 4 heads
    Rng rng;
    rng_seed(&rng, 4242);
    for (int di = 0; di < 2; di++) {
        Backend *be = backend_cuda_create(dts[di], 0, ATTN_KERNEL_AUTO);
        Case cases[64];
        int n = 0;
        for (int ti = 0; ti < 5; ti++)
            for (int gi = 0; gi < 2; gi++) {
                if (quick && tks[ti] > 4097) continue;
                cases[n++] = (Case){dts[di], 1 + ti % 2, 1, tks[ti], groups[gi][0], groups[gi][1], 64, -1, 0};
            }
        const Case extra[] = {
            {dts[di], 2, 3, 1, 8, 2, 64, -1, 0},        // two of three queries see no key
            {dts[di], 1, 4, 4097, 8, 2, 64, -1, 0},     // 16 rows per group: two row chunks
            {dts[di], 1, 8, 1000, 4, 4, 128, -1, 0},    // the most queries, HS 128
            {dts[di], 1, 1, 4097, 12, 1, 64, -1, 0},    // MQA: 12 rows, the second chunk partial
            {dts[di], 8, 1, 1000, 12, 12, 64, -1, 0},   // batch 8
            {dts[di], 2, 2, 4097, 8, 2, 64, 300, 0},    // a window: the split covers only it
            {dts[di], 1, 1, 4097, 8, 8, 64, -1, 1},     // ALiBi
            {dts[di], 1, 1, 70000, 8, 2, 128, -1, 0},   // a long cache, HS 128
            {dts[di], 1, 2, 70000, 4, 1, 64, 1000, 1},  // a long cache, window and ALiBi
        };
        for (size_t e = 0; e < sizeof extra / sizeof extra[0]; e++)
            if (!quick || extra[e].T_k <= 4097) cases[n++] = extra[e];
        for (int i = 0; i < n; i++) {
            char name[128];
            snprintf(name, sizeof name, "decode %s T_q=%d T_k=%d NH=%d NKV=%d", dtype_name(dts[di]),
                     cases[i].T_q, cases[i].T_k, cases[i].NH, cases[i].NKV);
            TEST_CASE(name, run_case(be, &cases[i], &rng));
        }
        be->destroy(be);
        char name[64];
        snprintf(name, sizeof name, "greedy decode, split = unsplit, batch = single (%s)", dtype_name(dts[di]));
        TEST_CASE(name, test_model(dts[di]));
        snprintf(name, sizeof name, "prefill = steps, one chunk (%s)", dtype_name(dts[di]));
        TEST_CASE(name, test_prefill(dts[di], 0, 0));
        snprintf(name, sizeof name, "prefill = steps, chunks of 384 (%s)", dtype_name(dts[di]));
        TEST_CASE(name, test_prefill(dts[di], 384, 0));
        snprintf(name, sizeof name, "prefill = steps, bigbird, chunks of 384 (%s)", dtype_name(dts[di]));
        TEST_CASE(name, test_prefill(dts[di], 384, 1));
    }
    TEST_CASE("a batch beyond the GPU's memory refused, fitting with a cache of the positions it feeds",
              test_batch_beyond_memory());
    return TEST_SUMMARY();
}
