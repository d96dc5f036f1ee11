// Context parallelism end to end on the CUDA backend, several ranks in one process on one GPU:
// P GPT models with the same weights, each holding its zigzag part of every sequence
// (gpt_set_ring over tests/ring_hub.h's in-memory link, a thread and a stream per rank), run
// forward and backward; their logits (at the tokens' global positions), summed loss and summed
// gradients must match one model on the whole sequences. Learned positions, RoPE with GQA, and
// RoPE with a sliding window; 2 and 4 ranks. Then a 20-step training run (AdamW, the same
// config) with 2 ranks: its loss curve against one model's on the whole sequences.
//
// Tolerance: both sides are judged by the CPU backend (fp32) on the same weights and data. The
// unsplit CUDA model's relative L2 error e against it measures what the dtype costs here; the
// ring may differ from it by its own rounding of the same size (the chunk outputs are rounded
// once more before their fp32 merge), so it may be at most 2 e + 2^-8. The training runs keep
// their fp32 master weights and the AdamW step on the host (adamw_step_cpu, the same for every
// side), so the curves differ only by the models' forward and backward: the ring's largest
// relative loss error over the 20 steps against the fp32 curve may be at most 2 x the unsplit
// CUDA model's + 2^-8, by the same argument.
#include "../ring_hub.h"
#include "../testlib.h"
#include "common/check.h"
#include "common/config.h"
#include "common/rng.h"
#include "model/gpt.h"
#include "optim/optim.h"

enum { B = 2, T = 384 };  // the whole sequence; a rank holds T / P of it
enum { STEPS = 20 };      // of the training runs

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
// `count` targets; logits (B, Tm, V) are read between the two (backward overwrites them), unless
// NULL. Returns the summed loss of the model's tokens.
static double step(GPT *m, const int *tok, const int *tgt, int Tm, long long count, float *logits) {
    gpt_zero_grad(m);
    gpt_forward(m, tok, tgt, B, Tm);
    if (logits) gpt_logits_f32(m, logits);
    int n;
    const double loss_sum = gpt_loss_sum(m, &n);
    gpt_set_loss_tokens(m, count);
    gpt_backward(m, 1.0f);
    return loss_sum;
}

// Rank `rank` of P's tokens of the whole sequences tok, tgt (B, T): local (B, T / P) each.
static void take_local(int rank, int P, const int *tok, const int *tgt, int *ltok, int *ltgt) {
    const int TL = T / P;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < TL; t++) {
            const int gp = ring_global_pos(rank, P, TL, t);
            ltok[b * TL + t] = tok[b * T + gp];
            ltgt[b * TL + t] = tgt[b * T + gp];
        }
}

// A ring rank's model on be: B x T / P tokens, weights w, the ring through port.
static GPT *ring_model(const Config *c, Backend *be, const float *w, Port *port) {
    GPTConfig g = gpt_config_from(c);
    GPT *m = gpt_create(&g, be, B, T / port->hub->P, c);
    gpt_set_params_f32(m, w);
    const RingLink link = hub_link(port);
    char err[ERR_LEN];
    if (gpt_set_ring(m, &link, err, sizeof err) != 0) fatal(EXIT_USAGE, "gpt_set_ring: %s", err);
    return m;
}

static void *rank_main(void *arg) {
    RankJob *j = arg;
    const int P = j->hub->P, TL = T / P;
    Backend *be = backend_cuda_create(j->c->precision.dtype, 0, ATTN_KERNEL_AUTO);
    Port port = {j->hub, be, j->rank};
    GPT *m = ring_model(j->c, be, j->w, &port);
    int *tok = xmalloc(sizeof(int) * B * TL), *tgt = xmalloc(sizeof(int) * B * TL);
    take_local(j->rank, P, j->tok, j->tgt, tok, tgt);
    j->logits = xmalloc(sizeof(float) * B * TL * gpt_cfg(m)->V);
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

// The model every case trains: 2 layers of 2 heads of size 64 (a flash kernel's), bf16.
static void case_config(Config *c, int P, int pos, int n_kv, int window) {
    config_defaults(c);
    c->model.n_layer = 2;
    c->model.n_head = 2;
    c->model.n_kv_head = n_kv;
    c->model.n_embd = 128;
    c->model.vocab_size = 97;
    c->model.max_seq_len = T;
    c->model.pos_embedding = pos;
    c->train.batch_size = B;
    c->train.seq_len = T;
    c->attention.window = window;
    c->precision.dtype = DTYPE_BF16;
    c->dist.context_parallel = P;
}

// Weights (n) of c's model rounded to bf16 once, so every model starts from the same values,
// and random whole sequences tok, tgt (B, T).
static float *case_inputs(const Config *c, Backend *gpu, uint64_t seed, int *tok, int *tgt,
                          size_t *n) {
    GPTConfig g = gpt_config_from(c);
    GPT *m0 = gpt_create(&g, gpu, B, T, c);
    *n = gpt_num_params(m0);
    float *w = xmalloc(sizeof(float) * *n);
    gpt_init_weights_host(m0, w, 5);
    gpt_set_params_f32(m0, w);
    gpt_get_params_f32(m0, w);
    gpt_free(m0);
    Rng rng;
    rng_seed(&rng, seed);
    for (int i = 0; i < B * T; i++) {
        tok[i] = (int)rng_below(&rng, (uint64_t)c->model.vocab_size);
        tgt[i] = (int)rng_below(&rng, (uint64_t)c->model.vocab_size);
    }
    return w;
}

static void run_case(int P, int pos, int n_kv, int window) {
    Config c;
    case_config(&c, P, pos, n_kv, window);
    Config cc = c;
    cc.precision.dtype = DTYPE_F32;
    GPTConfig g = gpt_config_from(&c);
    const int V = g.V, TL = T / P;

    Backend *gpu = backend_cuda_create(DTYPE_BF16, 0, ATTN_KERNEL_AUTO), *cpu = backend_cpu_create();
    int *tok = xmalloc(sizeof(int) * B * T), *tgt = xmalloc(sizeof(int) * B * T);
    size_t n;
    float *w = case_inputs(&c, gpu, 31 + (uint64_t)P, tok, tgt, &n);

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

// ---- the 20-step training run ----

typedef struct {
    const Config *c;
    float *w;                   // (n) fp32 master weights: every model takes them at each step
    const int *tok, *tgt;       // (B, T) whole sequences, the same batch every step
    AdamW opt;
    Hub *hub;
    pthread_barrier_t bar;
    float *grads[HUB_MAXP];     // (n) each rank's gradients of the step
    double loss_sum[HUB_MAXP];  // each rank's summed loss of the step
    double curve[STEPS];        // the mean loss over the whole sequences, per step
} Curve;

typedef struct {
    Curve *cv;
    int rank;
} CurveJob;

// AdamW over m's tensors (their weight decay as the trainer's), c's hyperparameters.
static void curve_optimizer(AdamW *opt, const GPT *m, const Config *c) {
    const int nt = gpt_num_tensors(m);
    OptimSpan *spans = xmalloc(sizeof(OptimSpan) * (size_t)nt);
    for (int i = 0; i < nt; i++) {
        const ParamTensor *t = gpt_tensor(m, i);
        spans[i] = (OptimSpan){.offset = t->offset, .n = t->numel, .decay = t->decay};
    }
    adamw_init(opt, gpt_num_params(m), spans, nt, c);
    free(spans);
}

// One step's update from the summed gradients in grads (n), on the host.
static void curve_update(Curve *cv, int s, const float *grads) {
    adamw_step_cpu(&cv->opt, cv->w, grads, s + 1, lr_at(cv->c, s, STEPS), 1.0f);
}

static void *curve_rank_main(void *arg) {
    CurveJob *j = arg;
    Curve *cv = j->cv;
    const int P = cv->hub->P, TL = T / P;
    Backend *be = backend_cuda_create(cv->c->precision.dtype, 0, ATTN_KERNEL_AUTO);
    Port port = {cv->hub, be, j->rank};
    GPT *m = ring_model(cv->c, be, cv->w, &port);
    const size_t n = gpt_num_params(m);
    int *tok = xmalloc(sizeof(int) * B * TL), *tgt = xmalloc(sizeof(int) * B * TL);
    take_local(j->rank, P, cv->tok, cv->tgt, tok, tgt);
    for (int s = 0; s < STEPS; s++) {
        gpt_set_params_f32(m, cv->w);
        cv->loss_sum[j->rank] = step(m, tok, tgt, TL, (long long)B * T, NULL);
        gpt_get_grads_f32(m, cv->grads[j->rank]);
        pthread_barrier_wait(&cv->bar);
        if (j->rank == 0) {  // the gradients and losses summed over the ring, one update
            double loss = 0;
            for (int r = 0; r < P; r++) loss += cv->loss_sum[r];
            for (int r = 1; r < P; r++)
                for (size_t i = 0; i < n; i++) cv->grads[0][i] += cv->grads[r][i];
            cv->curve[s] = loss / ((double)B * T);
            curve_update(cv, s, cv->grads[0]);
        }
        pthread_barrier_wait(&cv->bar);
    }
    gpt_free(m);
    be->destroy(be);
    free(tok);
    free(tgt);
    return NULL;
}

// The same training on one model of be over the whole sequences: cv->curve.
static void curve_whole(Curve *cv, Backend *be, const Config *c) {
    GPTConfig g = gpt_config_from(c);
    GPT *m = gpt_create(&g, be, B, T, c);
    float *grads = xmalloc(sizeof(float) * gpt_num_params(m));
    for (int s = 0; s < STEPS; s++) {
        gpt_set_params_f32(m, cv->w);
        cv->curve[s] = step(m, cv->tok, cv->tgt, T, (long long)B * T, NULL) / ((double)B * T);
        gpt_get_grads_f32(m, grads);
        curve_update(cv, s, grads);
    }
    free(grads);
    gpt_free(m);
}

// A fresh run from weights w0 (n): its AdamW state and master weights of its own.
static void curve_init(Curve *cv, const Config *c, Backend *be, const float *w0, size_t n,
                       const int *tok, const int *tgt) {
    memset(cv, 0, sizeof *cv);
    cv->c = c;
    cv->w = xmalloc(sizeof(float) * n);
    memcpy(cv->w, w0, sizeof(float) * n);
    cv->tok = tok;
    cv->tgt = tgt;
    GPTConfig g = gpt_config_from(c);
    GPT *m = gpt_create(&g, be, B, T, c);
    curve_optimizer(&cv->opt, m, c);
    gpt_free(m);
}

static void curve_free(Curve *cv) {
    adamw_free(&cv->opt);
    free(cv->w);
}

// The largest relative difference of curve a from the reference curve ref over the steps.
static double curve_err(const double *a, const double *ref) {
    double e = 0;
    for (int s = 0; s < STEPS; s++) e = fmax(e, fabs(a[s] - ref[s]) / ref[s]);
    return e;
}

static void run_curve(int P, int pos, int n_kv, int window) {
    Config c;
    case_config(&c, P, pos, n_kv, window);
    c.optim.lr = 1e-3f;
    c.optim.warmup_steps = 2;
    Config cc = c;
    cc.precision.dtype = DTYPE_F32;
    Backend *gpu = backend_cuda_create(DTYPE_BF16, 0, ATTN_KERNEL_AUTO), *cpu = backend_cpu_create();
    int *tok = xmalloc(sizeof(int) * B * T), *tgt = xmalloc(sizeof(int) * B * T);
    size_t n;
    float *w0 = case_inputs(&c, gpu, 71 + (uint64_t)P, tok, tgt, &n);

    Curve ring, one, ref;
    curve_init(&ring, &c, gpu, w0, n, tok, tgt);
    Hub hub;
    hub_init(&hub, P);
    ring.hub = &hub;
    pthread_barrier_init(&ring.bar, NULL, (unsigned)P);
    CurveJob jobs[HUB_MAXP];
    pthread_t th[HUB_MAXP];
    for (int r = 0; r < P; r++) {
        ring.grads[r] = xmalloc(sizeof(float) * n);
        jobs[r] = (CurveJob){&ring, r};
        pthread_create(&th[r], NULL, curve_rank_main, &jobs[r]);
    }
    for (int r = 0; r < P; r++) pthread_join(th[r], NULL);
    pthread_barrier_destroy(&ring.bar);
    hub_destroy(&hub);
    for (int r = 0; r < P; r++) free(ring.grads[r]);

    curve_init(&one, &c, gpu, w0, n, tok, tgt);
    curve_whole(&one, gpu, &c);
    curve_init(&ref, &cc, cpu, w0, n, tok, tgt);
    curve_whole(&ref, cpu, &cc);
    const double e = curve_err(ring.curve, ref.curve), b = curve_err(one.curve, ref.curve);
    printf("  P=%d %s kv %d window %d, %d steps: loss %.4f -> %.4f (fp32 %.4f -> %.4f); largest "
           "rel err ring/unsplit %.2e/%.2e\n",
           P, config_choice_name("model.pos_embedding", pos), n_kv, window, STEPS, ring.curve[0],
           ring.curve[STEPS - 1], ref.curve[0], ref.curve[STEPS - 1], e, b);
    EXPECT(ref.curve[STEPS - 1] < ref.curve[0], "the fp32 run does not learn: %.4f -> %.4f",
           ref.curve[0], ref.curve[STEPS - 1]);
    EXPECT(e <= 2 * b + 0x1p-8, "loss curve %.3e > 2 x %.3e + 2^-8", e, b);
    curve_free(&ring);
    curve_free(&one);
    curve_free(&ref);
    free(w0);
    free(tok);
    free(tgt);
    gpu->destroy(gpu);
    cpu->destroy(cpu);
}

int main(void) {
    TEST_CASE("2 ranks, learned positions", run_case(2, POS_LEARNED, 2, -1));
    TEST_CASE("4 ranks, RoPE, GQA (1 kv head)", run_case(4, POS_ROPE, 1, -1));
    TEST_CASE("4 ranks, RoPE, window 100", run_case(4, POS_ROPE, 2, 100));
    TEST_CASE("2 ranks, ALiBi", run_case(2, POS_ALIBI, 2, -1));
    TEST_CASE("2 ranks, learned positions, 20 AdamW steps", run_curve(2, POS_LEARNED, 2, -1));
    return TEST_SUMMARY();
}
