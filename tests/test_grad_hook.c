// gpt_set_grad_ready_hook: every backward reports blocks that tile the flat gradient vector
// exactly once, in descending order of offset (lnf, layers L-1 .. 0, wpe, wte), each block's
// gradient already final when it is reported (what data parallelism reduces while backward goes
// on), also when every target is ignored; and the hook changes no gradient.
#include <string.h>

#include "common/check.h"
#include "common/rng.h"
#include "model/gpt.h"
#include "tests/testlib.h"

enum { TB = 2, TT = 8, MAX_BLOCKS = 64 };

typedef struct {
    GPT *m;
    int n;
    size_t off[MAX_BLOCKS], count[MAX_BLOCKS];
    float *snap[MAX_BLOCKS];   // the block's gradient when it was reported (count floats)
} Record;

static void record_block(void *ctx, size_t offset, size_t count) {
    Record *r = ctx;
    CHECK(r->n < MAX_BLOCKS);
    const float *g = (const float *)gpt_grads(r->m) + offset;   // cpu backend: host fp32
    r->off[r->n] = offset;
    r->count[r->n] = count;
    r->snap[r->n] = xmalloc(count * sizeof(float));
    memcpy(r->snap[r->n], g, count * sizeof(float));
    r->n++;
}

static void record_clear(Record *r) {
    for (int i = 0; i < r->n; i++)
        free(r->snap[i]);
    r->n = 0;
}

static GPTConfig hook_config(PosEmbedding pos) {
    return (GPTConfig){.V = 50, .Vp = 128, .maxT = TT, .L = 3, .NH = 2, .NKV = 2, .C = 16,
                       .HS = 8, .pos = pos, .rope_theta = 10000.0f};
}

// Offset and length of the tensors whose names start with prefix (adjacent in the vector).
static void tensor_range(GPT *m, const char *prefix, size_t *off, size_t *count) {
    size_t lo = (size_t)-1, hi = 0;
    for (int i = 0; i < gpt_num_tensors(m); i++) {
        const ParamTensor *t = gpt_tensor(m, i);
        if (strncmp(t->name, prefix, strlen(prefix)) != 0) continue;
        if (t->offset < lo) lo = t->offset;
        if (t->offset + t->numel > hi) hi = t->offset + t->numel;
    }
    *off = lo;
    *count = hi - lo;
}

// The blocks of one backward: the expected names in order, a tiling in descending order, and
// each block's snapshot equal to the final gradient (nothing wrote to it after the report).
static void check_blocks(GPT *m, const Record *r, const float *final_grads, const char *what) {
    const GPTConfig *g = gpt_cfg(m);
    const char *expect[MAX_BLOCKS];
    char names[MAX_BLOCKS][16];
    int k = 0;
    expect[k++] = "lnf.";
    for (int l = g->L - 1; l >= 0; l--) {
        snprintf(names[l], sizeof names[l], "h.%d.", l);
        expect[k++] = names[l];
    }
    if (g->pos == POS_LEARNED) expect[k++] = "wpe";
    expect[k++] = "wte";
    EXPECT(r->n == k, "%s: %d blocks reported, expected %d", what, r->n, k);
    size_t end = gpt_num_params(m), covered = 0;
    for (int i = 0; i < r->n && i < k; i++) {
        size_t off, count;
        tensor_range(m, expect[i], &off, &count);
        EXPECT(r->off[i] == off && r->count[i] == count,
               "%s: block %d is [%zu, +%zu), expected %s [%zu, +%zu)", what, i, r->off[i],
               r->count[i], expect[i], off, count);
        EXPECT(r->off[i] + r->count[i] == end, "%s: block %d does not end where block %d begins",
               what, i, i - 1);
        end = r->off[i];
        covered += r->count[i];
        EXPECT(memcmp(r->snap[i], final_grads + r->off[i], r->count[i] * sizeof(float)) == 0,
               "%s: block %s changed after it was reported", what, expect[i]);
    }
    EXPECT(end == 0 && covered == gpt_num_params(m), "%s: %zu of %zu elements covered", what,
           covered, gpt_num_params(m));
}

static void run_case(PosEmbedding pos, int ignore_all) {
    GPTConfig g = hook_config(pos);
    Backend *be = backend_cpu_create();
    GPT *m = gpt_create(&g, be, TB, TT, NULL);
    const size_t n = gpt_num_params(m);
    float *params = xmalloc(n * sizeof(float));   // (n)
    float *plain = xmalloc(n * sizeof(float));    // (n) gradients without the hook
    float *hooked = xmalloc(n * sizeof(float));   // (n) with it
    gpt_init_weights_host(m, params, 3);
    gpt_set_params_f32(m, params);
    int tokens[TB * TT], targets[TB * TT];
    Rng rng;
    rng_seed(&rng, 9);
    for (int i = 0; i < TB * TT; i++) {
        tokens[i] = (int)(rng_u32(&rng) % (uint32_t)g.V);
        targets[i] = ignore_all ? -1 : (int)(rng_u32(&rng) % (uint32_t)g.V);
    }
    // Two micro-steps, as gradient accumulation runs them: the second adds onto the first.
    gpt_zero_grad(m);
    for (int k = 0; k < 2; k++) {
        gpt_forward(m, tokens, targets, TB, TT);
        gpt_backward(m, 0.5f);
    }
    gpt_get_grads_f32(m, plain);

    Record r = {.m = m};
    gpt_set_grad_ready_hook(m, record_block, &r);
    gpt_zero_grad(m);
    char what[64];
    for (int k = 0; k < 2; k++) {
        gpt_forward(m, tokens, targets, TB, TT);
        gpt_backward(m, 0.5f);
        gpt_get_grads_f32(m, hooked);
        snprintf(what, sizeof what, "pos %d, ignore_all %d, backward %d", (int)pos, ignore_all, k);
        check_blocks(m, &r, hooked, what);
        record_clear(&r);
    }
    EXPECT(memcmp(plain, hooked, n * sizeof(float)) == 0, "the hook changed the gradients");
    gpt_set_grad_ready_hook(m, NULL, NULL);
    gpt_forward(m, tokens, targets, TB, TT);
    gpt_backward(m, 0.5f);
    EXPECT(r.n == 0, "a cleared hook was still called %d times", r.n);
    free(params);
    free(plain);
    free(hooked);
    gpt_free(m);
    be->destroy(be);
}

int main(void) {
    TEST_CASE("grad hook: learned positions", run_case(POS_LEARNED, 0));
    TEST_CASE("grad hook: rope (no wpe block)", run_case(POS_ROPE, 0));
    TEST_CASE("grad hook: every target ignored still reports every block",
              run_case(POS_LEARNED, 1));
    return TEST_SUMMARY();
}
