// Context parallelism end to end on the CUDA backend, several ranks in one process on one GPU:
// P GPT models with the same weights, each holding its zigzag part of every sequence
// (gpt_set_ring over tests/ring_hub.h's in-memory link, a thread and a stream per rank), run
// forward and backward; their logits (at the tokens' global positions), summed loss and summed
// gradients must match one model on the whole sequences. Learned positions, RoPE with GQA, and
// RoPE with a sliding window; 2 and 4 ranks.
//
// Tolerance: both sides are judged by the CPU backend (fp32) on the same weights and data. The
// unsplit CUDA model's relative L2 error e against it measures what the dtype costs here; the
// ring may differ from it by its own rounding of the same size (the chunk outputs are rounded
// once more before their fp32 merge), so it may be at most 2 e + 2^-8.
#include "../ring_hub.h"
#include "../testlib.h"
#include "common/config.h"
#include "common/rng.h"
#include "model/gpt.h"

enum { B = 2, T = 384 };  // the whole sequence; a rank holds T / P of it

typedef struct {
    const Config *c;
    const float *w;          // (n) weights, already rounded to the dtype
    const int *tok, *tgt;    // (B, T) whole sequences
    Hub *hub;
    int rank;
    float *logits, *grads;   // out: (B, T / P, V) at the local tokens, (n)
    double loss_sum;
} RankJob;

// One model's forward and backward over B x Tm tokens (ring set or not), the loss a mean over
// `count` targets; logits (B, Tm, V) are read between the two (backward overwrites them).
static double step(GPT *m, const int *tok, const int *tgt, int Tm, long long count, float *logits) {
    gpt_zero_grad(m);
    gpt_forward(m, tok, tgt, B, Tm);
    gpt_logits_f32(m, logits);
    int n;
    const double loss_sum = gpt_loss_sum(m, &n);
    gpt_set_loss_tokens(m, count);
    gpt_backward(m, 1.0f);
    return loss_sum;
}

static void *rank_main(void *arg) {
    RankJob *j = arg;
    const int P = j->hub->P, TL = T / P;
    Backend *be = backend_cuda_create(j->c->precision.dtype, 0, ATTN_KERNEL_AUTO);
    GPTConfig g = gpt_config_from(j->c);
    GPT *m = gpt_create(&g, be, B, TL, j->c);
    gpt_set_params_f32(m, j->w);
    Port port = {j->hub, be, j->rank};
    const RingLink link = hub_link(&port);
    gpt_set_ring(m, &link);
    int *tok = xmalloc(sizeof(int) * B * TL), *tgt = xmalloc(sizeof(int) * B * TL);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < TL; t++) {
            const int gp = ring_global_pos(j->rank, P, TL, t);
            tok[b * TL + t] = j->tok[b * T + gp];
            tgt[b * TL + t] = j->tgt[b * T + gp];
        }
    j->logits = xmalloc(sizeof(float) * B * TL * g.V);
    j->loss_sum = step(m, tok, tgt, TL, (long long)B * T, j->logits);
    j->grads = xmalloc(sizeof(float) * gpt_num_params(m));
    gpt_get_grads_f32(m, j->grads);
    gpt_free(m);
    be->destroy(be);
    free(tok);
    free(tgt);
    return NULL;
}

// The whole sequences on one model of be: logits (B, T, V), gradients (n), the loss.
static float whole(Backend *be, const Config *c, const float *w, const int *tok, const int *tgt,
                   float *logits, float *grads) {
    GPTConfig g = gpt_config_from(c);
    GPT *m = gpt_create(&g, be, B, T, c);
    gpt_set_params_f32(m, w);
    const float loss = (float)(step(m, tok, tgt, T, (long long)B * T, logits) / ((double)B * T));
    gpt_get_grads_f32(m, grads);
    gpt_free(m);
    return loss;
}

static void run_case(int P, int pos, int n_kv, int window) {
    Config c;
    config_defaults(&c);
    c.model.n_layer = 2;
    c.model.n_head = 2;
    c.model.n_kv_head = n_kv;
    c.model.n_embd = 128;  // head size 64: a flash kernel's
    c.model.vocab_size = 97;
    c.model.max_seq_len = T;
    c.model.pos_embedding = pos;
    c.train.batch_size = B;
    c.train.seq_len = T;
    c.attention.window = window;
    c.precision.dtype = DTYPE_BF16;
    c.dist.context_parallel = P;
    Config cc = c;
    cc.precision.dtype = DTYPE_F32;
    GPTConfig g = gpt_config_from(&c);
    const int V = g.V, TL = T / P;

    // Weights rounded to bf16 once, so every model starts from the same values.
    Backend *gpu = backend_cuda_create(DTYPE_BF16, 0, ATTN_KERNEL_AUTO), *cpu = backend_cpu_create();
    GPT *m0 = gpt_create(&g, gpu, B, T, &c);
    const size_t n = gpt_num_params(m0);
    float *w = xmalloc(sizeof(float) * n);
    gpt_init_weights_host(m0, w, 5);
    gpt_set_params_f32(m0, w);
    gpt_get_params_f32(m0, w);
    gpt_free(m0);
    Rng rng;
    rng_seed(&rng, 31 + (uint64_t)P);
    int *tok = xmalloc(sizeof(int) * B * T), *tgt = xmalloc(sizeof(int) * B * T);
    for (int i = 0; i < B * T; i++) {
        tok[i] = (int)rng_below(&rng, (uint64_t)c.model.vocab_size);
        tgt[i] = (int)rng_below(&rng, (uint64_t)c.model.vocab_size);
    }

    Hub hub;
    hub_init(&hub, P);
    RankJob jobs[HUB_MAXP];
    pthread_t th[HUB_MAXP];
    for (int r = 0; r < P; r++) {
        jobs[r] = (RankJob){.c = &c, .w = w, .tok = tok, .tgt = tgt, .hub = &hub, .rank = r};
        pthread_create(&th[r], NULL, rank_main, &jobs[r]);
    }
    for (int r = 0; r < P; r++) pthread_join(th[r], NULL);
    hub_destroy(&hub);

    // The ranks' results assembled at global positions; their gradients and losses summed.
    float *lg_ring = xmalloc(sizeof(float) * B * T * V), *gr_ring = xcalloc(n, sizeof(float));
    double loss_ring = 0;
    for (int r = 0; r < P; r++) {
        for (int b = 0; b < B; b++)
            for (int t = 0; t < TL; t++)
                memcpy(lg_ring + ((size_t)b * T + ring_global_pos(r, P, TL, t)) * V,
                       jobs[r].logits + ((size_t)b * TL + t) * V, sizeof(float) * V);
        for (size_t i = 0; i < n; i++) gr_ring[i] += jobs[r].grads[i];
        loss_ring += jobs[r].loss_sum;
        free(jobs[r].logits);
        free(jobs[r].grads);
    }
    loss_ring /= (double)B * T;

    float *lg_one = xmalloc(sizeof(float) * B * T * V), *gr_one = xmalloc(sizeof(float) * n);
    float *lg_ref = xmalloc(sizeof(float) * B * T * V), *gr_ref = xmalloc(sizeof(float) * n);
    const float loss_one = whole(gpu, &c, w, tok, tgt, lg_one, gr_one);
    const float loss_ref = whole(cpu, &cc, w, tok, tgt, lg_ref, gr_ref);
    const double slack = 0x1p-8;
    const double e_lg = rel_err_f32(lg_ring, lg_ref, (size_t)B * T * V), b_lg = rel_err_f32(lg_one, lg_ref, (size_t)B * T * V);
    const double e_gr = rel_err_f32(gr_ring, gr_ref, n), b_gr = rel_err_f32(gr_one, gr_ref, n);
    const double e_ls = fabs(loss_ring - loss_ref) / loss_ref, b_ls = fabs(loss_one - loss_ref) / loss_ref;
    printf("  P=%d %s kv %d window %d: ring/unsplit rel err logits %.2e/%.2e grads %.2e/%.2e loss %.2e/%.2e\n",
           P, config_choice_name("model.pos_embedding", pos), n_kv, window, e_lg, b_lg, e_gr, b_gr, e_ls, b_ls);
    EXPECT(e_lg <= 2 * b_lg + slack, "logits %.3e > 2 x %.3e + 2^-8", e_lg, b_lg);
    EXPECT(e_gr <= 2 * b_gr + slack, "gradients %.3e > 2 x %.3e + 2^-8", e_gr, b_gr);
    EXPECT(e_ls <= 2 * b_ls + slack, "loss %.3e > 2 x %.3e + 2^-8", e_ls, b_ls);
    free(lg_ring); free(gr_ring); free(lg_one); free(gr_one); free(lg_ref); free(gr_ref);
    free(w); free(tok); free(tgt);
    gpu->destroy(gpu);
    cpu->destroy(cpu);
}

int main(void) {
    TEST_CASE("2 ranks, learned positions", run_case(2, POS_LEARNED, 2, -1));
    TEST_CASE("4 ranks, RoPE, GQA (1 kv head)", run_case(4, POS_ROPE, 1, -1));
    TEST_CASE("4 ranks, RoPE, window 100", run_case(4, POS_ROPE, 2, 100));
    TEST_CASE("2 ranks, ALiBi", run_case(2, POS_ALIBI, 2, -1));
    return TEST_SUMMARY();
}
