// optim: LR schedule values at the warmup and decay boundaries, AdamW against a step computed
// by hand in double, the global norm and clipping multiplier, and the loss scaler's transitions.
#include <math.h>
#include <omp.h>
#include <string.h>

#include "common/check.h"
#include "model/gpt.h"
#include "trainer/train_step.h"
#include "optim/optim.h"
#include "tests/fixtures.h"
#include "tests/testlib.h"

// fp32 rounding of a value near 1 is 2^-24 ~ 6e-8 relative; a few roundings in the formula
// stay below 4 ulp, so 5e-7 relative is a safe bound that still catches any formula slip.
#define LR_RTOL 5e-7

static int close_rel(double a, double b, double rtol) { return fabs(a - b) <= rtol * fabs(b) + 1e-30; }

static Config sched_config(const char *schedule, int warmup) {
    Config c;
    config_defaults(&c);
    c.optim.lr = 1e-3f;
    c.optim.min_lr = 1e-4f;
    c.optim.warmup_steps = warmup;
    {
        char kv[96], why[256];
        snprintf(kv, sizeof kv, "optim.schedule=%s", schedule);
        CHECK(config_set(&c, kv, why, sizeof why) == 0);
    }
    return c;
}

static void test_schedule(void) {
    const double lr = 1e-3f, mn = 1e-4f;  // the config holds floats
    Config c = sched_config("cosine", 10);
    EXPECT(close_rel(lr_at(&c, 0, 110), lr / 10, LR_RTOL), "warmup step 0: %g", lr_at(&c, 0, 110));
    EXPECT(close_rel(lr_at(&c, 4, 110), lr * 5 / 10, LR_RTOL), "warmup step 4: %g", lr_at(&c, 4, 110));
    EXPECT(close_rel(lr_at(&c, 9, 110), lr, LR_RTOL), "last warmup step: %g", lr_at(&c, 9, 110));
    EXPECT(close_rel(lr_at(&c, 10, 110), lr, LR_RTOL), "first decay step: %g", lr_at(&c, 10, 110));
    // Decay over steps 10..109 (99 intervals): the midpoint p = 0.5 is not a step, check p = 1/3.
    const double p = 33.0 / 99.0;
    EXPECT(close_rel(lr_at(&c, 43, 110), mn + (lr - mn) * 0.5 * (1 + cos(M_PI * p)), LR_RTOL), "cosine p=1/3: %g",
           lr_at(&c, 43, 110));
    EXPECT(close_rel(lr_at(&c, 109, 110), mn, LR_RTOL), "last step: %g", lr_at(&c, 109, 110));
    EXPECT(close_rel(lr_at(&c, 500, 110), mn, LR_RTOL), "past the end: %g", lr_at(&c, 500, 110));

    c = sched_config("linear", 10);
    EXPECT(close_rel(lr_at(&c, 10, 110), lr, LR_RTOL), "linear first decay step");
    EXPECT(close_rel(lr_at(&c, 43, 110), lr - (lr - mn) * p, LR_RTOL), "linear p=1/3: %g", lr_at(&c, 43, 110));
    EXPECT(close_rel(lr_at(&c, 109, 110), mn, LR_RTOL), "linear last step: %g", lr_at(&c, 109, 110));

    c = sched_config("constant", 10);
    EXPECT(close_rel(lr_at(&c, 3, 110), lr * 4 / 10, LR_RTOL), "constant still warms up");
    EXPECT(close_rel(lr_at(&c, 10, 110), lr, LR_RTOL) && close_rel(lr_at(&c, 109, 110), lr, LR_RTOL),
           "constant after warmup");

    c = sched_config("cosine", 0);
    EXPECT(close_rel(lr_at(&c, 0, 5), lr, LR_RTOL), "no warmup: step 0 at lr, got %g", lr_at(&c, 0, 5));
    EXPECT(close_rel(lr_at(&c, 2, 5), (lr + mn) / 2, LR_RTOL), "no warmup: midpoint %g", lr_at(&c, 2, 5));
    EXPECT(close_rel(lr_at(&c, 4, 5), mn, LR_RTOL), "no warmup: last step %g", lr_at(&c, 4, 5));
    EXPECT(close_rel(lr_at(&c, 0, 1), mn, LR_RTOL), "a one-step run ends (and starts) at min_lr");

    c = sched_config("cosine", 8);  // warmup covers the run: the step after it is already the end
    EXPECT(close_rel(lr_at(&c, 7, 8), lr, LR_RTOL), "warmup to the last step");
    EXPECT(close_rel(lr_at(&c, 8, 8), mn, LR_RTOL), "beyond a run that is all warmup");
}

// AdamW reference in double, written from the paper's formula (not from adamw.c).
static void adamw_ref(double *p, double *m, double *v, const double *g, int n, int t, double lr, double wd,
                      double b1, double b2, double eps) {
    for (int i = 0; i < n; i++) {
        p[i] -= lr * wd * p[i];
        m[i] = b1 * m[i] + (1 - b1) * g[i];
        v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
        const double mhat = m[i] / (1 - pow(b1, t)), vhat = v[i] / (1 - pow(b2, t));
        p[i] -= lr * mhat / (sqrt(vhat) + eps);
    }
}

static void test_adamw(void) {
    Config c;
    fixture_adamw_config(&c);
    enum { N = 7 };
    // Two spans; the gap at element 6 belongs to no span and must stay untouched.
    const OptimSpan spans[2] = {{0, 4, 1}, {4, 2, 0}};
    AdamW opt;
    adamw_init(&opt, N, spans, 2, &c);
    EXPECT(opt.m[3] == 0 && opt.v[5] == 0, "fresh state not zero");
    float p[N] = {0.5f, -1.0f, 2.0f, 0.0f, 0.25f, -0.75f, 3.0f};
    double pd[N], md[N] = {0}, vd[N] = {0};
    for (int i = 0; i < N; i++) pd[i] = p[i];
    const float grads[3][N] = {{0.1f, -0.2f, 0.0f, 1e-3f, 2.0f, -4.0f, 9.0f},
                               {-0.3f, 0.2f, 0.5f, 1e-3f, -2.0f, 1.0f, 9.0f},
                               {0.05f, 0.0f, -0.5f, -1e-3f, 0.5f, 0.0f, 9.0f}};
    const float lrs[3] = {1e-2f, 5e-3f, 2e-3f}, mults[3] = {1.0f, 0.5f, 0.25f};
    for (int s = 0; s < 3; s++) {
        adamw_step_cpu(&opt, p, grads[s], s + 1, lrs[s], mults[s]);
        double g[N], pd_dec[4], pd_nodec[2];
        for (int i = 0; i < N; i++) g[i] = (double)grads[s][i] * mults[s];
        memcpy(pd_dec, pd, sizeof pd_dec);
        memcpy(pd_nodec, pd + 4, sizeof pd_nodec);
        adamw_ref(pd_dec, md, vd, g, 4, s + 1, lrs[s], FIXTURE_WEIGHT_DECAY, FIXTURE_BETA1,
                  FIXTURE_BETA2, FIXTURE_EPS);
        adamw_ref(pd_nodec, md + 4, vd + 4, g + 4, 2, s + 1, lrs[s], 0.0, FIXTURE_BETA1,
                  FIXTURE_BETA2, FIXTURE_EPS);
        memcpy(pd, pd_dec, sizeof pd_dec);
        memcpy(pd + 4, pd_nodec, sizeof pd_nodec);
    }
    // fp32 holds each parameter to ~6e-8 relative; three steps of a few fp32 operations each
    // keep the error below 1e-6 of the parameter's magnitude (plus lr*1e-6 absolute for those
    // that pass near zero, where Adam's update ~lr dominates).
    for (int i = 0; i < 6; i++)
        EXPECT(fabs(p[i] - pd[i]) <= 1e-6 * fabs(pd[i]) + 1e-8, "param %d: %.9g vs %.9g", i, p[i], pd[i]);
    for (int i = 0; i < 6; i++) {
        EXPECT(close_rel(opt.m[i], md[i], 1e-6) || fabs(opt.m[i] - md[i]) < 1e-9, "m[%d] %g vs %g", i, opt.m[i],
               md[i]);
        EXPECT(close_rel(opt.v[i], vd[i], 1e-6) || fabs(opt.v[i] - vd[i]) < 1e-12, "v[%d] %g vs %g", i, opt.v[i],
               vd[i]);
    }
    EXPECT(p[6] == 3.0f && opt.m[6] == 0 && opt.v[6] == 0, "element outside every span changed");
    adamw_free(&opt);
    EXPECT(opt.m == NULL && opt.spans == NULL, "adamw_free left pointers");
}

static void test_grad_norm(void) {
    const float x[5] = {3, 4, 0, -12, 0};
    EXPECT(sumsq_cpu(x, 5) == 169.0, "sumsq %g", sumsq_cpu(x, 5));
    EXPECT(sumsq_cpu(x, 0) == 0.0, "empty sumsq");
    float y[5] = {1, 2, INFINITY, 3, 4};
    EXPECT(isinf(sumsq_cpu(y, 5)), "inf not detected");
    y[2] = NAN;
    EXPECT(isnan(sumsq_cpu(y, 5)), "nan not detected");
    y[2] = -INFINITY;
    y[3] = NAN;
    EXPECT(!isfinite(sumsq_cpu(y, 5)), "inf and nan together");
    // Large vector: double accumulation matches a sequential double sum, and the result is the
    // same bits for any thread count (fixed blocks, fixed order).
    const size_t n = 1000003;
    float *big = xmalloc(n * sizeof(float));  // (n)
    double ref = 0;
    for (size_t i = 0; i < n; i++) {
        big[i] = (float)sin((double)i) * 1e-3f;
        ref += (double)big[i] * big[i];
    }
    omp_set_num_threads(1);
    const double one = sumsq_cpu(big, n);
    omp_set_num_threads(4);
    const double four = sumsq_cpu(big, n);
    EXPECT(one == four, "thread count changed the norm: %.17g vs %.17g", one, four);
    // Sum of 1e6 positive doubles: relative error below n * 2^-53 ~ 1e-10.
    EXPECT(close_rel(one, ref, 1e-10), "big sumsq %.17g vs %.17g", one, ref);
    free(big);

    // grad_multiplier: unscale, then torch's clip coefficient clip / (norm + 1e-6) when below 1.
    EXPECT(grad_multiplier(0.5, 1.0f, 1.0f) == 1.0f, "no clip below the threshold");
    EXPECT(close_rel(grad_multiplier(10.0, 1.0f, 1.0f), 1.0 / (10.0 + 1e-6), 1e-7), "clip 10 -> 1");
    EXPECT(grad_multiplier(1e6, 0.0f, 1.0f) == 1.0f, "clip 0 means off");
    EXPECT(close_rel(grad_multiplier(0.5, 1.0f, 1024.0f), 1.0 / 1024, 1e-7), "unscale only");
    EXPECT(close_rel(grad_multiplier(4.0, 2.0f, 256.0f), 2.0 / (4.0 + 1e-6) / 256, 1e-7), "unscale and clip");
}

static Config scaler_config(const char *loss_scale, float initial, int window) {
    Config c;
    config_defaults(&c);
    snprintf(c.precision.loss_scale, sizeof c.precision.loss_scale, "%s", loss_scale);
    c.precision.initial_loss_scale = initial;
    c.precision.loss_scale_window = window;
    return c;
}

static void test_scaler(void) {
    LossScaler s;
    Config c = scaler_config("dynamic", 1024, 3);
    scaler_init(&s, &c, 1);
    EXPECT(s.dynamic && s.scale == 1024 && s.window == 3 && s.skipped == 0, "dynamic init");
    EXPECT(scaler_update(&s, 1) == 0 && scaler_update(&s, 1) == 0 && s.scale == 1024, "grew too early");
    EXPECT(scaler_update(&s, 1) == 0 && s.scale == 2048 && s.clean_steps == 0, "no growth after window: %g",
           s.scale);
    EXPECT(scaler_update(&s, 1) == 0 && scaler_update(&s, 0) == 1, "overflow not skipped");
    EXPECT(s.scale == 1024 && s.skipped == 1 && s.clean_steps == 0, "backoff: scale %g skipped %lld", s.scale,
           s.skipped);
    EXPECT(scaler_update(&s, 0) == 1 && s.scale == 512 && s.skipped == 2, "second overflow");
    // The window restarts after an overflow: two clean steps are not enough.
    scaler_update(&s, 1);
    scaler_update(&s, 1);
    EXPECT(s.scale == 512, "grew before a full window after backoff");
    scaler_update(&s, 1);
    EXPECT(s.scale == 1024, "no growth after a full window");

    c = scaler_config("dynamic", 1e30f, 1);
    scaler_init(&s, &c, 1);
    for (int i = 0; i < 100; i++) scaler_update(&s, 1);
    EXPECT(isfinite(s.scale), "dynamic scale overflowed to inf");

    c = scaler_config("128", 65536, 2);
    scaler_init(&s, &c, 1);
    EXPECT(!s.dynamic && s.scale == 128, "fixed scale: %g", s.scale);
    for (int i = 0; i < 5; i++) scaler_update(&s, 1);
    EXPECT(s.scale == 128, "fixed scale grew");
    EXPECT(scaler_update(&s, 0) == 1 && s.scale == 128 && s.skipped == 1, "fixed scale: overflow");

    c = scaler_config("dynamic", 65536, 2);
    scaler_init(&s, &c, 0);  // bf16 / fp32 / cpu
    EXPECT(!s.dynamic && s.scale == 1.0f, "unscaled mode: scale %g", s.scale);
    for (int i = 0; i < 5; i++) scaler_update(&s, 1);
    EXPECT(s.scale == 1.0f, "unscaled mode grew");
    EXPECT(scaler_update(&s, 0) == 1 && s.scale == 1.0f && s.skipped == 1, "unscaled mode must still skip");
}

// A fixed micro-batch: token i % V, target (i + 1) % V.
static void fixed_batch(void *ctx, int *inputs, int *targets) {
    const int *bt = ctx;  // {B*T, V}
    for (int i = 0; i < bt[0]; i++) {
        inputs[i] = i % bt[1];
        targets[i] = (i + 1) % bt[1];
    }
}

// The shared train step: a non-finite gradient skips the step without touching the weights,
// the moments or the step count; the next finite step runs normally.
static void test_trainer_skip(void) {
    Config c;
    config_defaults(&c);
    const char *sets[] = {"model.n_layer=1", "model.n_head=2", "model.n_embd=16", "model.vocab_size=17",
                          "model.max_seq_len=8", "train.batch_size=2", "train.seq_len=8", "train.grad_accum=2",
                          "train.steps=4", "optim.warmup_steps=2", "data.synthetic=copy"};
    char err[256];
    for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++) CHECK(config_set(&c, sets[i], err, sizeof err) == 0);
    CHECK(config_validate(&c, err, sizeof err) == 0);
    const GPTConfig g = gpt_config_from(&c);
    Backend *be = backend_cpu_create();
    GPT *m = gpt_create(&g, be, 2, 8, &c);
    const size_t n = gpt_num_params(m);
    float *w = xmalloc(n * sizeof(float)), *after = xmalloc(n * sizeof(float));  // (n)
    gpt_init_weights_host(m, w, 7);
    for (int i = 0; i < gpt_num_tensors(m); i++)  // lnf.weight[0] = inf makes the gradients NaN
        if (strcmp(gpt_tensor(m, i)->name, "lnf.weight") == 0) w[gpt_tensor(m, i)->offset] = INFINITY;
    gpt_set_params_f32(m, w);
    Trainer *t = trainer_create(m, &c, err, sizeof err);
    if (!t) fatal(EXIT_USAGE, "trainer_create: %s", err);
    int bt[2] = {16, 17};
    StepStats st = trainer_step(t, 0, fixed_batch, bt);
    gpt_get_params_f32(m, after);
    const Optimizer *opt = trainer_optimizer(t);
    float *mom = xmalloc(2 * n * sizeof(float));   // (2n) the moments, m then v
    opt->get_state((Optimizer *)opt, NULL, mom, mom + n);
    EXPECT(st.skipped == 1 && !isfinite(st.grad_norm), "non-finite step not skipped (norm %g)", st.grad_norm);
    EXPECT(memcmp(w, after, n * sizeof(float)) == 0, "a skipped step changed the weights");
    EXPECT(opt->get_t((Optimizer *)opt) == 0 && sumsq_cpu(mom, 2 * n) == 0, "a skipped step moved AdamW");
    free(mom);
    EXPECT(trainer_scaler(t)->skipped == 1 && st.loss_scale == 1.0f, "cpu scaler: skipped %lld, scale %g",
           trainer_scaler(t)->skipped, st.loss_scale);

    gpt_init_weights_host(m, w, 7);
    gpt_set_params_f32(m, w);
    st = trainer_step(t, 1, fixed_batch, bt);
    gpt_get_params_f32(m, after);
    EXPECT(st.skipped == 0 && isfinite(st.loss) && st.grad_norm > 0, "finite step: loss %g norm %g", st.loss,
           st.grad_norm);
    EXPECT(opt->get_t((Optimizer *)opt) == 1 && memcmp(w, after, n * sizeof(float)) != 0,
           "finite step did not update");
    EXPECT(st.lr == lr_at(&c, 1, 4), "lr %g, schedule says %g", st.lr, lr_at(&c, 1, 4));
    trainer_free(t);
    gpt_free(m);
    be->destroy(be);
    free(w);
    free(after);
}

// What a trainer cannot serve comes back as an error (NULL and the message), the process goes
// on, and the same model then makes a trainer: train.cuda_graph = on on the cpu backend, and
// dist.context_parallel = 2 without a communicator of two ranks.
static void test_trainer_refusals(void) {
    Config c;
    config_defaults(&c);
    const char *sets[] = {"model.n_layer=1", "model.n_head=2", "model.n_embd=16", "model.vocab_size=17",
                          "model.max_seq_len=8", "train.batch_size=2", "train.seq_len=8", "data.synthetic=copy"};
    char err[ERR_LEN] = "";
    for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++) CHECK(config_set(&c, sets[i], err, sizeof err) == 0);
    const GPTConfig g = gpt_config_from(&c);
    Backend *be = backend_cpu_create();
    GPT *m = gpt_create(&g, be, 2, 8, &c);
    Config on = c;
    on.train.cuda_graph = CUDA_GRAPH_ON;
    EXPECT(trainer_create(m, &on, err, sizeof err) == NULL && strstr(err, "train.cuda_graph = on, but the cpu backend"),
           "cuda_graph = on on the cpu: '%s'", err);
    Config cp = c;
    cp.dist.context_parallel = 2;
    err[0] = '\0';
    EXPECT(trainer_create(m, &cp, err, sizeof err) == NULL && strstr(err, "dist.context_parallel = 2"),
           "context parallelism on one process: '%s'", err);
    Trainer *t = trainer_create(m, &c, err, sizeof err);
    EXPECT(t != NULL, "the same model refused after the refusals: %s", err);
    trainer_free(t);
    gpt_free(m);
    be->destroy(be);
}

int main(void) {
    TEST_CASE("lr schedule at warmup and decay boundaries", test_schedule());
    TEST_CASE("AdamW against a hand-computed step (decay only on decayed spans)", test_adamw());
    TEST_CASE("global norm, non-finite detection, clipping multiplier", test_grad_norm());
    TEST_CASE("loss scaler: growth, backoff, skip, fixed and unscaled modes", test_scaler());
    TEST_CASE("train step skips non-finite gradients, leaving weights and AdamW untouched", test_trainer_skip());
    TEST_CASE("trainer_create refuses what it cannot serve with an error", test_trainer_refusals());
    return TEST_SUMMARY();
}
