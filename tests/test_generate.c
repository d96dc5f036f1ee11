// Batched generation on the CPU backend: gpt_generate_batch over B sequences draws, for every
// sequence b, the tokens gpt_generate draws alone with the same generator (seeded S + b), and
// gpt_decode_batch's logits are those of gpt_decode_step per sequence, for learned, RoPE and
// ALiBi positions with GQA and a sliding window, greedy and sampled. Then the refusals: a batch
// beyond memory is refused before anything is allocated, and a cache keeps its batch size.
//
// Tolerance: the batched and the single-row logits are the same sums, summed in another order by
// sgemm (B rows instead of one): fp32 rounding only, 1e-5 relative as the op tests use.
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

// A CPU model with GPT-2's initialisation from seed, attention.window on every other layer.
static GPT *tiny_model(Backend *be, PosEmbedding pos, int window) {
    GPTConfig g = tiny_config(pos);
    Config run;
    config_defaults(&run);
    run.attention.window = window;
    run.attention.window_every = 2;
    GPT *m = gpt_create(&g, be, 1, g.maxT, &run);
    float *params = xmalloc(gpt_num_params(m) * sizeof(float));
    gpt_init_weights_host(m, params, 99);
    gpt_set_params_f32(m, params);
    free(params);
    return m;
}

static void test_batch_equals_single(PosEmbedding pos, int window, float temperature, int top_k, int B) {
    Backend *be = backend_cpu_create();
    GPT *single = tiny_model(be, pos, window), *batched = tiny_model(be, pos, window);
    const GPTConfig *g = gpt_cfg(single);
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

static void test_refusals(void) {
    Backend *be = backend_cpu_create();
    GPT *m = tiny_model(be, POS_ROPE, -1);
    char err[ERR_LEN] = "";
    EXPECT(gpt_decode_reserve(m, 1 << 30, err, sizeof err) == -1, "a cache beyond memory was accepted");
    EXPECT(strstr(err, "GiB") && strstr(err, "1073741824 sequences"), "message: %s", err);
    EXPECT(gpt_decode_reserve(m, 3, err, sizeof err) == 0, "3 sequences refused: %s", err);
    EXPECT(gpt_decode_reserve(m, 3, err, sizeof err) == 0, "the same batch again refused: %s", err);
    EXPECT(gpt_decode_reserve(m, 2, err, sizeof err) == -1 && strstr(err, "holds 3 sequences"),
           "another batch size: %s", err);
    gpt_free(m);
    be->destroy(be);
}

int main(void) {
    const PosEmbedding poss[] = {POS_LEARNED, POS_ROPE, POS_ALIBI};
    const char *names[] = {"learned", "rope", "alibi"};
    for (int i = 0; i < 3; i++) {
        char name[96];
        snprintf(name, sizeof name, "batch of 3 greedy = single (%s)", names[i]);
        TEST_CASE(name, test_batch_equals_single(poss[i], -1, 0.0f, 0, 3));
        snprintf(name, sizeof name, "batch of 5 sampled = single, window 7 (%s)", names[i]);
        TEST_CASE(name, test_batch_equals_single(poss[i], 7, 1.0f, 0, 5));
        snprintf(name, sizeof name, "batch of 2 top-k 5 = single (%s)", names[i]);
        TEST_CASE(name, test_batch_equals_single(poss[i], -1, 0.8f, 5, 2));
    }
    TEST_CASE("batch beyond memory and another batch size refused", test_refusals());
    return TEST_SUMMARY();
}
