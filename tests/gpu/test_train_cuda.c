// test_train_cuda: training on the CUDA backend through the same Trainer as the CPU
// (trainer/train_step.c): a 50-step loss curve against the CPU backend (fp32 and bf16), fp16 with
// an injected overflow (the step is skipped, the loss scale halves, weights and AdamW state stay
// bitwise), bitwise identical losses of two identical runs (attention.deterministic), and exact
// resume through a checkpoint (save at step k, load into a fresh model, continue: the same
// losses bitwise), and train.cuda_graph: 20 replayed steps bitwise those launched kernel by
// kernel (bf16, fp16 with an injected overflow inside the graph, fp32, gradient accumulation,
// attention and model dropout), auto replaying with dropout, and steps collected after several
// launches. With dropout the fp32 loss curve runs as graph replays (the masks' micro-step from
// the device counter) against the CPU's host-decided steps: a mask that differs anywhere moves
// the loss by far more than the tolerance.
//
// Loss-curve tolerance, relative per step, derived as in tests/gpu/test_ops_cuda.c: the forward
// chains S = 2 + 9L + 1 rounding stages (2L + 1 more with model.dropout: each residual dropout
// site rounds once to the dtype), each off by at most u (the dtype's unit roundoff) plus
// the fp32 K-term sum difference 4 sqrt(K) 2^-24 (K = 4C, the longest sum); independent roundings
// add in quadrature, so 3 sqrt(S) (u + k_term) is a > 5 sigma bound on one forward's loss. Both
// runs start from the same (dtype-rounded) weights and AdamW normalises every update to about lr
// whatever the gradient's rounding, so the weights of the two runs stay within rounding of each
// other's trajectory and the bound is applied to every step. (The CPU-vs-PyTorch oracle measured
// < 1e-5 per-step loss drift over 30 fp32 steps; the fp32 bound here is 7.7e-5.)
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/config.h"
#include "common/fileio.h"
#include "common/rng.h"
#include "model/backend.h"
#include "trainer/checkpoint.h"
#include "model/gpt.h"
#include "trainer/train_step.h"
#include "optim/optim.h"
#include "tests/fixtures.h"
#include "tests/testlib.h"

#define U_F32 0x1p-24
#define STEPS 50
#define B 4
#define T 32

// A learnable task: each row follows the chain x -> (5x + 1) mod V from a random start, with one
// token in ten replaced by noise. The whole data position is the Rng state.
static void chain_batch(void *ctx, int *inputs, int *targets) {
    Rng *r = ctx;
    const int V = 100;
    for (int b = 0; b < B; b++) {
        int x = (int)rng_below(r, V);
        for (int t = 0; t < T; t++) {
            const int next = rng_below(r, 10) == 0 ? (int)rng_below(r, V) : (5 * x + 1) % V;
            inputs[b * T + t] = x;
            targets[b * T + t] = next;
            x = next;
        }
    }
}

static void small_config(Config *c, DType dt) {
    fixture_gpu_model_config(c);
    c->train.batch_size = B;
    c->train.seq_len = T;
    c->train.grad_accum = 2;
    c->train.steps = STEPS;
    c->optim.lr = 1e-3f;
    c->optim.min_lr = 1e-4f;
    c->optim.warmup_steps = 5;
    c->optim.grad_clip = 1.0f;
    c->precision.dtype = dt;
}

// Elements of the flat parameter vector of c's model.
static size_t num_params(const Config *c) {
    GPTConfig g = gpt_config_from(c);
    Backend *cpu = backend_cpu_create();
    GPT *m = gpt_create(&g, cpu, 1, 1, c);
    const size_t n = gpt_num_params(m);
    gpt_free(m);
    cpu->destroy(cpu);
    return n;
}

// A model and its trainer on `be`, starting from weights rounded to be's dtype (so a CPU run can
// start from exactly the same values). w (gpt_num_params) receives those weights.
static Trainer *make_run(Backend *be, const Config *c, GPT **m_out, float *w) {
    GPTConfig g = gpt_config_from(c);
    GPT *m = gpt_create(&g, be, B, T, c);
    gpt_init_weights_host(m, w, 42);
    gpt_set_params_f32(m, w);
    gpt_get_params_f32(m, w);
    char err[ERR_LEN];
    Trainer *t = trainer_create(m, c, err, sizeof err);
    if (!t) fatal(EXIT_USAGE, "trainer_create: %s", err);
    trainer_set_weights_f32(t, w);
    *m_out = m;
    return t;
}

// Runs steps [from, to) and stores their losses (and skipped flags) in losses[step].
static void run_steps(Trainer *t, long long from, long long to, Rng *data, float *losses) {
    for (long long s = from; s < to; s++) {
        StepStats st = trainer_step(t, s, chain_batch, data);
        losses[s] = st.skipped ? NAN : st.loss;
    }
}

static void test_loss_curve(DType dt, float dropout) {
    Config c;
    small_config(&c, dt);
    c.attention.dropout = dropout;
    c.model.dropout = dropout;
    Backend *gpu = backend_cuda_create(dt, 0, ATTN_KERNEL_AUTO), *cpu = backend_cpu_create();
    GPT *mg, *mc;
    const size_t n = num_params(&c);
    float *w = xmalloc(n * sizeof(float)), *wc = xmalloc(n * sizeof(float));  // (n)
    Trainer *tg = make_run(gpu, &c, &mg, w);
    Config cc = c;
    cc.precision.dtype = DTYPE_F32;
    GPTConfig g = gpt_config_from(&cc);
    mc = gpt_create(&g, cpu, B, T, &cc);
    char err[ERR_LEN];
    Trainer *tc = trainer_create(mc, &cc, err, sizeof err);
    if (!tc) fatal(EXIT_USAGE, "trainer_create: %s", err);
    memcpy(wc, w, n * sizeof(float));
    trainer_set_weights_f32(tc, wc);   // the GPU run's rounded weights

    float lg[STEPS], lc[STEPS];
    Rng dg, dc;
    rng_seed(&dg, 7);
    rng_seed(&dc, 7);
    run_steps(tg, 0, STEPS, &dg, lg);
    run_steps(tc, 0, STEPS, &dc, lc);
    EXPECT(trainer_graph_replays(tg) == STEPS - 1, "%s dropout %g: %lld of %d steps replayed the "
           "graph (train.cuda_graph = auto)", dtype_name(dt), dropout, trainer_graph_replays(tg),
           STEPS);

    const int S = 2 + 9 * c.model.n_layer + 1 + (dropout > 0 ? 2 * c.model.n_layer + 1 : 0);
    const double k_term = 4.0 * sqrt(4.0 * c.model.n_embd) * U_F32;
    const double tol = 3.0 * sqrt((double)S) * (dtype_unit_roundoff(dt) + k_term);
    double worst = 0;
    int worst_step = 0;
    for (int s = 0; s < STEPS && !isnan(worst); s++) {
        const double rel = fabs((double)lg[s] - lc[s]) / fabs((double)lc[s]);
        if (isnan(rel) || rel > worst) worst = rel, worst_step = s;   // NaN (a skipped step) ends it
    }
    printf("    %-5s dropout %g: loss step 0 gpu %.5f cpu %.5f, step %d gpu %.5f cpu %.5f; worst rel "
           "diff %.2e at step %d (tol %.2e)\n", dtype_name(dt), dropout, lg[0], lc[0], STEPS - 1,
           lg[STEPS - 1], lc[STEPS - 1], worst, worst_step, tol);
    EXPECT(worst <= tol, "%s loss curve: step %d gpu %g cpu %g (rel %.2e > %.2e)", dtype_name(dt),
           worst_step, lg[worst_step], lc[worst_step], worst, tol);
    EXPECT(lc[STEPS - 1] < 0.7f * lc[0], "the chain task is partly learnt in %d steps (%g -> %g)",
           STEPS, lc[0], lc[STEPS - 1]);
    trainer_free(tg);
    trainer_free(tc);
    gpt_free(mg);
    gpt_free(mc);
    gpu->destroy(gpu);
    cpu->destroy(cpu);
    free(w), free(wc);
}

// fp16 with a loss scale of 2^99: the scaled dlogits overflow fp16 (max 65504), every gradient
// turns inf/NaN, and the step must be skipped with nothing touched but the scaler.
static void test_fp16_overflow(void) {
    Config c;
    small_config(&c, DTYPE_F16);
    c.precision.initial_loss_scale = 0x1p99f;
    Backend *gpu = backend_cuda_create(DTYPE_F16, 0, ATTN_KERNEL_AUTO);
    GPT *m;
    float *w = xmalloc(num_params(&c) * sizeof(float));  // (n)
    Trainer *t = make_run(gpu, &c, &m, w);
    const size_t np = gpt_num_params(m);
    float *after = xmalloc(np * sizeof(float));  // (np)
    Rng data;
    rng_seed(&data, 3);
    StepStats st = trainer_step(t, 0, chain_batch, &data);
    EXPECT(st.skipped == 1 && !isfinite(st.grad_norm), "overflowing fp16 step not skipped (norm %g)",
           st.grad_norm);
    EXPECT(st.loss_scale == 0x1p99f && trainer_scaler(t)->scale == 0x1p98f,
           "loss scale %g -> %g, expected 2^99 -> 2^98", st.loss_scale, trainer_scaler(t)->scale);
    EXPECT(trainer_scaler(t)->skipped == 1, "scaler counted %lld skipped steps",
           trainer_scaler(t)->skipped);
    gpt_get_params_f32(m, after);
    EXPECT(memcmp(w, after, np * sizeof(float)) == 0, "a skipped step changed the fp16 weights");
    const OptimState *os = trainer_optim_state(t);
    EXPECT(memcmp(w, os->master, np * sizeof(float)) == 0, "a skipped step changed the master weights");
    EXPECT(os->t == 0 && sumsq_cpu(os->m, np) == 0 && sumsq_cpu(os->v, np) == 0,
           "a skipped step moved AdamW (t %lld)", os->t);
    // A sane scale afterwards trains normally.
    trainer_scaler(t)->scale = 1024.0f;
    st = trainer_step(t, 1, chain_batch, &data);
    EXPECT(st.skipped == 0 && isfinite(st.loss) && st.grad_norm > 0, "fp16 step at scale 1024: loss %g, "
           "norm %g", st.loss, st.grad_norm);
    os = trainer_optim_state(t);
    EXPECT(os->t == 1, "AdamW step count %lld after one clean step", os->t);
    trainer_free(t);
    gpt_free(m);
    gpu->destroy(gpu);
    free(w), free(after);
}

// Two runs of the same config and data on fresh models: bitwise identical losses.
static void test_determinism(DType dt) {
    Config c;
    small_config(&c, dt);
    const size_t n = num_params(&c);
    float *w = xmalloc(n * sizeof(float));
    float losses[2][STEPS];
    for (int run = 0; run < 2; run++) {
        Backend *gpu = backend_cuda_create(dt, 0, ATTN_KERNEL_AUTO);
        GPT *m;
        Trainer *t = make_run(gpu, &c, &m, w);
        Rng data;
        rng_seed(&data, 11);
        run_steps(t, 0, 20, &data, losses[run]);
        trainer_free(t);
        gpt_free(m);
        gpu->destroy(gpu);
    }
    EXPECT(memcmp(losses[0], losses[1], 20 * sizeof(float)) == 0,
           "%s: two identical runs differ (step 19: %.9g vs %.9g)", dtype_name(dt), losses[0][19],
           losses[1][19]);
    free(w);
}

// Save at step K through the checkpoint code, load into a fresh model and trainer, continue:
// the losses of steps K.. must be bitwise those of the uninterrupted run.
static void test_resume(DType dt) {
    enum { K = 6, END = 14 };
    Config c;
    small_config(&c, dt);
    c.precision.loss_scale_window = 4;   // fp16: the scale grows during the run, so resuming
                                         // must restore it
    char dir[] = "/tmp/flashgpt_resume_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    const size_t n = num_params(&c);
    float *w = xmalloc(n * sizeof(float));
    float full[END], resumed[END];
    char err[1024], path[4096];

    Backend *gpu = backend_cuda_create(dt, 0, ATTN_KERNEL_AUTO);
    GPT *m;
    Trainer *t = make_run(gpu, &c, &m, w);
    Rng data;
    rng_seed(&data, 5);
    run_steps(t, 0, K, &data, full);
    TrainState st;
    memset(&st, 0, sizeof st);
    st.step = K;
    st.world_size = 1;
    st.scaler = *trainer_scaler(t);
    memcpy(st.rng, data.s, sizeof st.rng);   // the test's whole data position
    const int rc = checkpoint_save_state(dir, m, trainer_optim_state(t), &st, &c, 2, path,
                                         sizeof path, err, sizeof err);
    EXPECT(rc == 0, "checkpoint_save_state: %s", err);
    run_steps(t, K, END, &data, full);
    trainer_free(t);
    gpt_free(m);

    GPTConfig g = gpt_config_from(&c);
    m = gpt_create(&g, gpu, B, T, &c);
    t = trainer_create(m, &c, err, sizeof err);
    if (!t) fatal(EXIT_USAGE, "trainer_create: %s", err);
    TrainState st2;
    memset(&st2, 0, sizeof st2);
    const int lrc = checkpoint_load(path, m, trainer_optim_state(t), &st2, err, sizeof err);
    EXPECT(lrc == 0, "checkpoint_load: %s", err);
    trainer_optim_state_commit(t);
    *trainer_scaler(t) = st2.scaler;
    memcpy(data.s, st2.rng, sizeof data.s);
    run_steps(t, st2.step, END, &data, resumed);
    EXPECT(st2.step == K && memcmp(full + K, resumed + K, (END - K) * sizeof(float)) == 0,
           "%s: resumed losses differ (step %d: %.9g vs %.9g)", dtype_name(dt), END - 1,
           full[END - 1], resumed[END - 1]);
    printf("    %-5s resume at step %d, loss scale %g: step %d loss %.6f\n", dtype_name(dt), K,
           st2.scaler.scale, END - 1, resumed[END - 1]);
    trainer_free(t);
    gpt_free(m);
    gpu->destroy(gpu);
    remove_tree(dir);
    free(w);
}

// ---- train.cuda_graph: the replayed step against the same step launched kernel by kernel ----

#define GRAPH_STEPS 20

typedef struct {
    float loss[GRAPH_STEPS], norm[GRAPH_STEPS], scale[GRAPH_STEPS];
    int skipped[GRAPH_STEPS];
    float *master, *params;   // (n) after the last step
    long long replays;        // steps that ran as a graph replay
} GraphRun;

// GRAPH_STEPS steps of c from the same weights and data with train.cuda_graph = mode. With
// overflow_at >= 0 (fp16) the loss scale is set to 2^26 before that step: the scaled dlogits
// (2^26 / 256 tokens) overflow fp16, and the scaler halves its way down over skipped steps, each
// one a graph captured for its scale and replayed.
static void graph_run(const Config *base, CudaGraphMode mode, int overflow_at, GraphRun *out) {
    Config c = *base;
    c.train.cuda_graph = mode;
    Backend *gpu = backend_cuda_create(c.precision.dtype, 0, ATTN_KERNEL_AUTO);
    GPT *m;
    const size_t n = num_params(&c);
    float *w = xmalloc(n * sizeof(float));  // (n)
    Trainer *t = make_run(gpu, &c, &m, w);
    Rng data;
    rng_seed(&data, 21);
    for (int s = 0; s < GRAPH_STEPS; s++) {
        if (s == overflow_at) trainer_scaler(t)->scale = 0x1p26f;
        StepStats st = trainer_step(t, s, chain_batch, &data);
        out->loss[s] = st.loss;
        out->norm[s] = st.grad_norm;
        out->scale[s] = st.loss_scale;
        out->skipped[s] = st.skipped;
    }
    out->master = xmalloc(n * sizeof(float));
    out->params = xmalloc(n * sizeof(float));
    memcpy(out->master, trainer_optim_state(t)->master, n * sizeof(float));
    gpt_get_params_f32(m, out->params);
    out->replays = trainer_graph_replays(t);
    trainer_free(t);
    gpt_free(m);
    gpu->destroy(gpu);
    free(w);
}

// dropout > 0: attention.dropout and model.dropout both, so every mask of the step (attention
// probabilities, embeddings, branch outputs) comes from the counter the replay reads.
static void test_graph_bitwise(DType dt, int accum, int overflow_at, float dropout) {
    Config c;
    small_config(&c, dt);
    c.train.grad_accum = accum;
    c.attention.dropout = dropout;
    c.model.dropout = dropout;
    c.train.steps = GRAPH_STEPS;
    c.precision.loss_scale_window = 3;   // fp16: the scale also grows, a new graph each time
    const size_t n = num_params(&c);
    GraphRun on, off;
    graph_run(&c, CUDA_GRAPH_ON, overflow_at, &on);
    graph_run(&c, CUDA_GRAPH_OFF, overflow_at, &off);
    int skipped = 0, first_diff = -1;
    for (int s = 0; s < GRAPH_STEPS; s++) {
        skipped += on.skipped[s];
        const int same = memcmp(&on.loss[s], &off.loss[s], sizeof(float)) == 0 &&
                         memcmp(&on.norm[s], &off.norm[s], sizeof(float)) == 0 &&
                         on.scale[s] == off.scale[s] && on.skipped[s] == off.skipped[s];
        if (!same && first_diff < 0) first_diff = s;
    }
    printf("    %-5s accum %d dropout %g: %lld replays, %d skipped steps, step %d loss %.6f norm "
           "%.4f scale %g\n", dtype_name(dt), accum, dropout, on.replays, skipped, GRAPH_STEPS - 1,
           on.loss[GRAPH_STEPS - 1], on.norm[GRAPH_STEPS - 1], on.scale[GRAPH_STEPS - 1]);
    // Every step after the first (the warm-up) replays, the ones after a capture included.
    EXPECT(on.replays == GRAPH_STEPS - 1 && off.replays == 0, "%lld replays with graphs on "
           "(expected %d), %lld with graphs off", on.replays, GRAPH_STEPS - 1, off.replays);
    EXPECT(first_diff < 0, "%s accum %d: graph and no-graph steps differ from step %d (loss %.9g "
           "vs %.9g, norm %.9g vs %.9g)", dtype_name(dt), accum, first_diff,
           first_diff < 0 ? 0 : on.loss[first_diff], first_diff < 0 ? 0 : off.loss[first_diff],
           first_diff < 0 ? 0 : on.norm[first_diff], first_diff < 0 ? 0 : off.norm[first_diff]);
    EXPECT(memcmp(on.master, off.master, n * sizeof(float)) == 0 &&
               memcmp(on.params, off.params, n * sizeof(float)) == 0,
           "%s accum %d: graph and no-graph weights differ after %d steps", dtype_name(dt), accum,
           GRAPH_STEPS);
    if (overflow_at >= 0) {
        int clean_after = 0;
        for (int s = overflow_at + 1; s < GRAPH_STEPS; s++) clean_after += !on.skipped[s];
        EXPECT(on.skipped[overflow_at] && clean_after > 0,
               "the injected overflow at step %d: skipped %d, then %d clean steps", overflow_at,
               on.skipped[overflow_at], clean_after);
    }
    EXPECT(on.loss[GRAPH_STEPS - 1] < on.loss[0], "%s accum %d: no learning (%g -> %g)",
           dtype_name(dt), accum, on.loss[0], on.loss[GRAPH_STEPS - 1]);
    free(on.master), free(on.params), free(off.master), free(off.params);
}

// Dropout reads its masks' micro-step from device memory, so auto replays the graph with it:
// the same numbers as cuda_graph = off. A replay that repeated one step's masks would still
// match off only if off repeated them too; the CPU loss curve with dropout rules that out.
static void test_graph_dropout_auto(void) {
    Config c;
    small_config(&c, DTYPE_BF16);
    c.model.dropout = 0.1f;
    c.attention.dropout = 0.1f;
    c.train.steps = GRAPH_STEPS;
    GraphRun a, off;
    graph_run(&c, CUDA_GRAPH_AUTO, -1, &a);
    graph_run(&c, CUDA_GRAPH_OFF, -1, &off);
    const size_t n = num_params(&c);
    EXPECT(a.replays == GRAPH_STEPS - 1, "dropout under auto: %lld replays, expected %d",
           a.replays, GRAPH_STEPS - 1);
    EXPECT(memcmp(a.loss, off.loss, sizeof a.loss) == 0 &&
               memcmp(a.master, off.master, n * sizeof(float)) == 0,
           "dropout: auto and off differ (step %d loss %.9g vs %.9g)", GRAPH_STEPS - 1,
           a.loss[GRAPH_STEPS - 1], off.loss[GRAPH_STEPS - 1]);
    EXPECT(a.loss[GRAPH_STEPS - 1] < a.loss[0], "dropout: no learning (%g -> %g)", a.loss[0],
           a.loss[GRAPH_STEPS - 1]);
    free(a.master), free(a.params), free(off.master), free(off.params);
}

// Launched steps report later: trainer_launch x k, then one trainer_collect gives the numbers
// trainer_step gives one by one.
static void test_collect_later(void) {
    Config c;
    small_config(&c, DTYPE_BF16);
    c.train.steps = GRAPH_STEPS;
    GraphRun one;
    graph_run(&c, CUDA_GRAPH_AUTO, -1, &one);
    Backend *gpu = backend_cuda_create(DTYPE_BF16, 0, ATTN_KERNEL_AUTO);
    GPT *m;
    float *w = xmalloc(num_params(&c) * sizeof(float));
    Trainer *t = make_run(gpu, &c, &m, w);
    Rng data;
    rng_seed(&data, 21);
    StepStats got[TRAINER_MAX_PENDING];
    int n = 0;
    for (int s = 0; s < GRAPH_STEPS; s++) {
        trainer_launch(t, s, chain_batch, &data);
        if (s % 7 == 6 || s == GRAPH_STEPS - 1) n += trainer_collect(t, got + n);
    }
    int same = n == GRAPH_STEPS;
    for (int s = 0; s < n && same; s++) same = got[s].loss == one.loss[s] && got[s].grad_norm == one.norm[s];
    EXPECT(same, "collected %d steps; they differ from trainer_step's", n);
    trainer_free(t);
    gpt_free(m);
    gpu->destroy(gpu);
    free(w), free(one.master), free(one.params);
}

// Usage: test_train_cuda [--quick]: --quick runs the fp16 overflow step and the bf16 resume
// only (16 steps through every kernel of a training step and the checkpoint code), the subset
// compute-sanitizer runs (make test-gpu-sanitize).
int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--quick") == 0) {
        TEST_CASE("fp16 overflow skips the step", test_fp16_overflow());
        TEST_CASE("exact resume bf16", test_resume(DTYPE_BF16));
        return TEST_SUMMARY();
    }
    TEST_CASE("loss curve fp32 vs cpu", test_loss_curve(DTYPE_F32, 0.0f));
    TEST_CASE("loss curve bf16 vs cpu", test_loss_curve(DTYPE_BF16, 0.0f));
    TEST_CASE("loss curve fp32 vs cpu, dropout, graph replays", test_loss_curve(DTYPE_F32, 0.1f));
    TEST_CASE("fp16 overflow skips the step", test_fp16_overflow());
    TEST_CASE("deterministic bf16", test_determinism(DTYPE_BF16));
    TEST_CASE("deterministic fp16", test_determinism(DTYPE_F16));
    TEST_CASE("exact resume bf16", test_resume(DTYPE_BF16));
    TEST_CASE("exact resume fp16", test_resume(DTYPE_F16));
    TEST_CASE("graph = no graph, bf16", test_graph_bitwise(DTYPE_BF16, 1, -1, 0.0f));
    TEST_CASE("graph = no graph, bf16, grad_accum 3", test_graph_bitwise(DTYPE_BF16, 3, -1, 0.0f));
    TEST_CASE("graph = no graph, fp16 with an overflow", test_graph_bitwise(DTYPE_F16, 2, 6, 0.0f));
    TEST_CASE("graph = no graph, fp32", test_graph_bitwise(DTYPE_F32, 2, -1, 0.0f));
    TEST_CASE("graph = no graph, bf16, dropout, grad_accum 3",
              test_graph_bitwise(DTYPE_BF16, 3, -1, 0.1f));
    TEST_CASE("graph = no graph, fp16 with an overflow, dropout",
              test_graph_bitwise(DTYPE_F16, 2, 6, 0.1f));
    TEST_CASE("dropout: auto replays the graph", test_graph_dropout_auto());
    TEST_CASE("launched steps collected later", test_collect_later());
    return TEST_SUMMARY();
}
