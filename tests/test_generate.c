// Batched generation on the CPU backend: gpt_generate_batch over B sequences draws, for every
// sequence b, the tokens gpt_generate draws alone with the same generator (seeded S + b), and
// gpt_decode_batch's logits are those of gpt_decode_step per sequence, for learned, RoPE and
// ALiBi positions with GQA and a sliding window, greedy and sampled. The prefill
// (gpt_decode_prefill: the prompt in chunks of forward passes) gives the logits of feeding the
// prompt step by step, and the same greedy tokens after it, in one chunk and in many, from
// position 0 and after a seek, and on block-sparse layers (chunks cut at the 128-token blocks);
// prefilled for B sequences, every sequence's cache is sequence 0's. A cache reserved for fewer
// positions than max_seq_len gives the same results and ends generation at its end; a step of B
// sequences downloads its logits once. Then the refusals: a batch beyond memory is refused
// before anything is allocated, and a cache keeps its batch size and its length.
//
// Tolerance: the batched and the single-row logits, and the prefilled and the stepped ones, are
// the same sums, summed in another order (sgemm over B or a chunk's rows instead of one, the
// attention over a chunk's query tile): fp32 rounding only, 1e-5 relative as the op tests use.
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/config.h"
#include "common/rng.h"
#include "model/backend.h"
#include "model/generate.h"
#include "model/gpt.h"
#include "tests/testlib.h"

enum { N_PROMPT = 5, N_NEW = 30, MAX_B = 5 };
#define LOGIT_TOL 1e-5

static GPTConfig tiny_config(PosEmbedding pos) {
    return (GPTConfig){.V = 101, .Vp = 128, .maxT = 40, .L = 2, .NH = 4, .NKV = 2, .C = 64,
                       .HS = 16, .pos = pos, .rope_theta = 10000.0f};
}

// A CPU model of max_seq_len maxT with GPT-2's initialisation from seed, attention.window on
// every other layer, the run's attention.sparse (none unless the caller sets it).
static GPT *model_with(Backend *be, PosEmbedding pos, int maxT, const Config *run) {
    GPTConfig g = tiny_config(pos);
    g.maxT = maxT;
    GPT *m = gpt_create(&g, be, 1, 1, run);
    float *params = xmalloc(gpt_num_params(m) * sizeof(float));
    gpt_init_weights_host(m, params, 99);
    gpt_set_params_f32(m, params);
    free(params);
    return m;
}

static GPT *tiny_model(Backend *be, PosEmbedding pos, int window) {
    Config run;
    config_defaults(&run);
    run.attention.window = window;
    run.attention.window_every = 2;
    return model_with(be, pos, tiny_config(pos).maxT, &run);
}

enum { PREFILL_NEW = 20, MAX_PROMPT = 700 };

// A prompt of n tokens fed at pos0 by gpt_decode_prefill in chunks of `rows` (0: the default)
// against the same prompt fed by gpt_decode_step, on two models made by make(): the logits after
// it, then PREFILL_NEW greedy tokens of each.
typedef struct {
    PosEmbedding pos;
    int window, maxT, sparse;   // sparse: bigbird (band 2 blocks, 1 global, 2 random)
    int n, pos0, rows;
} PrefillCase;

static GPT *prefill_model(Backend *be, const PrefillCase *c) {
    Config run;
    config_defaults(&run);
    run.attention.window = c->window;
    run.attention.window_every = 2;
    if (c->sparse) {
        run.attention.sparse = ATTN_SPARSE_BIGBIRD;
        run.attention.sparse_band = 256;
        run.attention.sparse_global = 128;
        run.attention.sparse_random = 2;
        run.attention.sparse_seed = 3;
    }
    GPT *m = model_with(be, c->pos, c->maxT, &run);
    char err[ERR_LEN];
    EXPECT(gpt_decode_reserve(m, 1, c->maxT, err, sizeof err) == 0, "%s", err);
    gpt_decode_seek(m, c->pos0);
    return m;
}

static void test_prefill_equals_steps(PrefillCase c) {
    Backend *be = backend_cpu_create();
    GPT *pre = prefill_model(be, &c), *step = prefill_model(be, &c);
    const int V = gpt_cfg(pre)->V;
    char err[ERR_LEN];
    if (c.rows > 0)
        EXPECT(gpt_set_prefill_rows(pre, c.rows, err, sizeof err) == 0, "%d rows refused: %s", c.rows, err);
    int prompt[MAX_PROMPT];
    Rng r;
    rng_seed(&r, 11 + (uint64_t)c.n);
    for (int i = 0; i < c.n; i++) prompt[i] = (int)rng_below(&r, (uint64_t)V);
    float *lp = xmalloc((size_t)V * sizeof(float)), *ls = xmalloc((size_t)V * sizeof(float));
    gpt_decode_prefill(pre, prompt, c.n, 1, c.pos0, lp);
    for (int i = 0; i < c.n; i++) gpt_decode_step(step, prompt[i], c.pos0 + i, ls);
    const double e = rel_err_f32(lp, ls, (size_t)V);
    EXPECT(e < LOGIT_TOL, "prefilled logits rel err %g against the steps'", e);
    int got_pre[PREFILL_NEW], got_step[PREFILL_NEW];
    Rng unused;
    rng_seed(&unused, 0);
    const int np = gpt_generate_from(pre, 1, c.pos0 + c.n, lp, PREFILL_NEW, 0.0f, 0, &unused, got_pre);
    const int ns = gpt_generate_from(step, 1, c.pos0 + c.n, ls, PREFILL_NEW, 0.0f, 0, &unused, got_step);
    EXPECT(np == ns && np == PREFILL_NEW, "drew %d and %d tokens", np, ns);
    EXPECT(memcmp(got_pre, got_step, (size_t)np * sizeof(int)) == 0,
           "greedy tokens after the prefill differ from those after the steps");
    free(lp);
    free(ls);
    gpt_free(pre);
    gpt_free(step);
    be->destroy(be);
}

// Prefilled for B sequences, each sequence's logits are the single prefill's, and so are those
// of the next step (every cache a copy of sequence 0's).
static void test_prefill_batch(void) {
    enum { B = 3, N = 23 };
    Backend *be = backend_cpu_create();
    GPT *one = tiny_model(be, POS_ROPE, 7), *many = tiny_model(be, POS_ROPE, 7);
    const int V = gpt_cfg(one)->V;
    int prompt[N], tokens[B] = {5, 5, 5};
    for (int i = 0; i < N; i++) prompt[i] = (7 * i + 3) % V;
    float *l1 = xmalloc((size_t)V * sizeof(float)), *lb = xmalloc((size_t)B * V * sizeof(float));
    char err[ERR_LEN];
    EXPECT(gpt_set_prefill_rows(many, 6, err, sizeof err) == 0, "6 rows refused: %s", err);
    gpt_decode_prefill(one, prompt, N, 1, 0, l1);
    gpt_decode_prefill(many, prompt, N, B, 0, lb);
    for (int b = 0; b < B; b++)
        EXPECT(rel_err_f32(lb + (size_t)b * V, l1, (size_t)V) < LOGIT_TOL, "sequence %d's prefill logits", b);
    gpt_decode_step(one, 5, N, l1);
    gpt_decode_batch(many, tokens, B, N, lb);
    for (int b = 0; b < B; b++)
        EXPECT(rel_err_f32(lb + (size_t)b * V, l1, (size_t)V) < LOGIT_TOL, "sequence %d's next step", b);
    free(l1);
    free(lb);
    gpt_free(one);
    gpt_free(many);
    be->destroy(be);
}

// short_cache: the batch's cache holds the N_PROMPT + N_NEW positions it feeds
// (gpt_decode_reserve), the single sequence's max_seq_len (the first step's): other strides,
// the same results.
static void test_batch_equals_single(PosEmbedding pos, int window, float temperature, int top_k, int B,
                                     int short_cache) {
    Backend *be = backend_cpu_create();
    GPT *single = tiny_model(be, pos, window), *batched = tiny_model(be, pos, window);
    const GPTConfig *g = gpt_cfg(single);
    char err[ERR_LEN];
    if (short_cache)
        EXPECT(gpt_decode_reserve(batched, B, N_PROMPT + N_NEW, err, sizeof err) == 0, "%s", err);
    const int prompt[N_PROMPT] = {3, 14, 15, 92, 65};
    int one[N_NEW], many[MAX_B * N_NEW];
    Rng rngs[MAX_B];
    for (int b = 0; b < B; b++) rng_seed(&rngs[b], 7 + (uint64_t)b);
    const int n = gpt_generate_batch(batched, B, 0, prompt, N_PROMPT, N_NEW, temperature, top_k, rngs,
                                     many);
    EXPECT(n == N_NEW, "drew %d of %d tokens", n, N_NEW);
    int same = 1;
    for (int b = 0; b < B; b++) {
        Rng r;
        rng_seed(&r, 7 + (uint64_t)b);
        EXPECT(gpt_generate(single, prompt, N_PROMPT, N_NEW, temperature, top_k, &r, one) == n,
               "the single sequence drew another count");
        same &= memcmp(one, many + (size_t)b * N_NEW, (size_t)n * sizeof(int)) == 0;
    }
    EXPECT(same, "a batched sequence differs from its single-sequence generation (pos %d, T %g, B %d)",
           pos, temperature, B);
    // The logits of one more step over the cache each holds, sequence by sequence.
    int tokens[MAX_B];
    float *lb = xmalloc((size_t)B * g->V * sizeof(float)), *ls = xmalloc((size_t)g->V * sizeof(float));
    for (int b = 0; b < B; b++) tokens[b] = many[(size_t)b * N_NEW + N_NEW - 1];
    gpt_decode_batch(batched, tokens, B, N_PROMPT + N_NEW - 1, lb);
    gpt_decode_step(single, tokens[B - 1], N_PROMPT + N_NEW - 1, ls);   // single holds sequence B-1
    const double e = rel_err_f32(lb + (size_t)(B - 1) * g->V, ls, (size_t)g->V);
    EXPECT(e < LOGIT_TOL, "batched logits rel err %g", e);
    free(lb);
    free(ls);
    gpt_free(single);
    gpt_free(batched);
    be->destroy(be);
}

// A cache of fewer positions than max_seq_len: generation stops at its end, with the tokens the
// full-length cache draws first (greedy), and gpt_decode_positions says where that end is.
static void test_short_cache_stops_at_its_end(void) {
    enum { ROOM = 12 };
    Backend *be = backend_cpu_create();
    GPT *full = tiny_model(be, POS_ROPE, -1), *cut = tiny_model(be, POS_ROPE, -1);
    char err[ERR_LEN];
    EXPECT(gpt_decode_positions(cut) == gpt_cfg(cut)->maxT, "an unreserved cache holds %d positions",
           gpt_decode_positions(cut));
    EXPECT(gpt_decode_reserve(cut, 1, N_PROMPT + ROOM, err, sizeof err) == 0, "%s", err);
    EXPECT(gpt_decode_positions(cut) == N_PROMPT + ROOM, "reserved %d, holds %d", N_PROMPT + ROOM,
           gpt_decode_positions(cut));
    const int prompt[N_PROMPT] = {3, 14, 15, 92, 65};
    int a[N_NEW], b[N_NEW];
    Rng r;
    rng_seed(&r, 1);
    EXPECT(gpt_generate(full, prompt, N_PROMPT, N_NEW, 0.0f, 0, &r, a) == N_NEW, "full cache drew fewer");
    const int n = gpt_generate(cut, prompt, N_PROMPT, N_NEW, 0.0f, 0, &r, b);
    EXPECT(n == ROOM, "a cache of %d positions after a %d-token prompt drew %d tokens", N_PROMPT + ROOM,
           N_PROMPT, n);
    EXPECT(memcmp(a, b, (size_t)ROOM * sizeof(int)) == 0, "the short cache's tokens differ");
    gpt_free(full);
    gpt_free(cut);
    be->destroy(be);
}

// The CPU backend with its downloads counted: the ops run on a copy of its struct (the same
// private state), whose download entries count and forward to the original.
typedef struct {
    Backend be;   // first: the ops receive &be
    Backend *inner;
    int downloads;
} CountingBackend;

static void counted_download(Backend *be, void *host, const void *src, size_t bytes) {
    CountingBackend *c = (CountingBackend *)be;
    c->downloads++;
    c->inner->download(c->inner, host, src, bytes);
}

static void counted_download_f32(Backend *be, float *host, const void *src, size_t n) {
    CountingBackend *c = (CountingBackend *)be;
    c->downloads++;
    c->inner->download_f32(c->inner, host, src, n);
}

// A decode step of B sequences downloads its logits once (one wait for the device), whatever
// B, with V < Vp (rows padded on the device) and the batch's logits those of single steps.
static void test_one_download_per_step(void) {
    enum { B = 4 };
    CountingBackend c = {.inner = backend_cpu_create()};
    c.be = *c.inner;
    c.be.download = counted_download;
    c.be.download_f32 = counted_download_f32;
    GPT *m = tiny_model(&c.be, POS_LEARNED, -1), *one = tiny_model(c.inner, POS_LEARNED, -1);
    const GPTConfig *g = gpt_cfg(m);
    CHECK(g->V < g->Vp);
    char err[ERR_LEN];
    EXPECT(gpt_decode_reserve(m, B, 8, err, sizeof err) == 0, "%s", err);
    int tokens[B] = {7, 7, 7, 7};
    float *lb = xmalloc((size_t)B * g->V * sizeof(float)), *l1 = xmalloc((size_t)g->V * sizeof(float));
    for (int pos = 0; pos < 3; pos++) {
        c.downloads = 0;
        gpt_decode_batch(m, tokens, B, pos, lb);
        EXPECT(c.downloads == 1, "step at %d: %d downloads", pos, c.downloads);
        gpt_decode_step(one, tokens[0], pos, l1);
        for (int b = 0; b < B; b++)
            EXPECT(rel_err_f32(lb + (size_t)b * g->V, l1, (size_t)g->V) < LOGIT_TOL,
                   "step at %d: sequence %d's logits", pos, b);
    }
    free(lb);
    free(l1);
    gpt_free(m);
    gpt_free(one);
    c.inner->destroy(c.inner);
}

static void test_refusals(void) {
    Backend *be = backend_cpu_create();
    GPT *m = tiny_model(be, POS_ROPE, -1);
    char err[ERR_LEN] = "";
    const int maxT = gpt_cfg(m)->maxT;
    EXPECT(gpt_decode_reserve(m, 1 << 30, maxT, err, sizeof err) == -1, "a cache beyond memory was accepted");
    EXPECT(strstr(err, "GiB") && strstr(err, "1073741824 sequences"), "message: %s", err);
    EXPECT(gpt_decode_reserve(m, 1, 0, err, sizeof err) == -1 && strstr(err, "need 1 to model.max_seq_len"),
           "a cache of 0 positions: %s", err);
    EXPECT(gpt_decode_reserve(m, 1, maxT + 1, err, sizeof err) == -1 && strstr(err, "need 1 to model.max_seq_len"),
           "a cache beyond max_seq_len: %s", err);
    EXPECT(gpt_decode_reserve(m, 3, 20, err, sizeof err) == 0, "3 sequences refused: %s", err);
    EXPECT(gpt_decode_reserve(m, 3, 20, err, sizeof err) == 0, "the same batch again refused: %s", err);
    EXPECT(gpt_decode_reserve(m, 3, 10, err, sizeof err) == 0, "fewer positions refused: %s", err);
    EXPECT(gpt_decode_reserve(m, 2, 20, err, sizeof err) == -1 && strstr(err, "holds 3 sequences of 20 positions"),
           "another batch size: %s", err);
    EXPECT(gpt_decode_reserve(m, 3, 21, err, sizeof err) == -1 && strstr(err, "holds 3 sequences of 20 positions"),
           "more positions: %s", err);
    EXPECT(gpt_set_prefill_rows(m, 0, err, sizeof err) == -1 && strstr(err, "0 rows per prefill chunk: need 1 to"),
           "0 prefill rows: %s", err);
    EXPECT(gpt_set_prefill_rows(m, 1 << 30, err, sizeof err) == -1 && strstr(err, "need 1 to"),
           "2^30 prefill rows: %s", err);
    gpt_free(m);
    be->destroy(be);
}

int main(void) {
    const PosEmbedding poss[] = {POS_LEARNED, POS_ROPE, POS_ALIBI};
    const char *names[] = {"learned", "rope", "alibi"};
    for (int i = 0; i < 3; i++) {
        char name[96];
        snprintf(name, sizeof name, "batch of 3 greedy = single (%s)", names[i]);
        TEST_CASE(name, test_batch_equals_single(poss[i], -1, 0.0f, 0, 3, 0));
        snprintf(name, sizeof name, "batch of 5 sampled = single, window 7 (%s)", names[i]);
        TEST_CASE(name, test_batch_equals_single(poss[i], 7, 1.0f, 0, 5, 0));
        snprintf(name, sizeof name, "batch of 2 top-k 5 = single (%s)", names[i]);
        TEST_CASE(name, test_batch_equals_single(poss[i], -1, 0.8f, 5, 2, 0));
        snprintf(name, sizeof name, "batch of 3 in a cache of the fed positions = single, window 7 (%s)",
                 names[i]);
        TEST_CASE(name, test_batch_equals_single(poss[i], 7, 1.0f, 0, 3, 1));
    }
    for (int i = 0; i < 3; i++) {
        char name[96];
        snprintf(name, sizeof name, "prefill = steps, one chunk, window 7 (%s)", names[i]);
        TEST_CASE(name, test_prefill_equals_steps((PrefillCase){poss[i], 7, 40, 0, 20, 0, 0}));
    }
    TEST_CASE("prefill = steps, chunks of 3 (rope)",
              test_prefill_equals_steps((PrefillCase){POS_ROPE, -1, 40, 0, 19, 0, 3}));
    TEST_CASE("prefill = steps, chunks of 4 after a seek to 5 (learned)",
              test_prefill_equals_steps((PrefillCase){POS_LEARNED, 7, 40, 0, 14, 5, 4}));
    TEST_CASE("prefill = steps, bigbird, 128-token chunks (rope)",
              test_prefill_equals_steps((PrefillCase){POS_ROPE, -1, MAX_PROMPT, 1, 650, 0, 200}));
    TEST_CASE("prefill = steps, bigbird, from 37, one chunk to the block edge (alibi)",
              test_prefill_equals_steps((PrefillCase){POS_ALIBI, -1, MAX_PROMPT, 1, 600, 37, 0}));
    TEST_CASE("prefill of 3 sequences = 3 copies of one", test_prefill_batch());
    TEST_CASE("a cache shorter than max_seq_len: generation stops at its end", test_short_cache_stops_at_its_end());
    TEST_CASE("a decode step of 4 sequences downloads its logits once", test_one_download_per_step());
    TEST_CASE("batch beyond memory, bad cache lengths, another batch size, more positions refused",
              test_refusals());
    return TEST_SUMMARY();
}
