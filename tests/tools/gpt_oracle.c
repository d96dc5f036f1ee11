// gpt_oracle: the C half of the PyTorch oracle tests (tests/test_oracle.py). Builds a small
// random GPT on the CPU backend, runs one forward + backward on a fixed batch and then
// train.steps optimizer steps through the shared Trainer, and writes everything PyTorch needs
// to redo the same computation into one safetensors file:
//   param.<name>, grad.<name>   initial weights and the gradient of the first batch's mean loss
//   tokens, targets (B, T) I32  the first batch (targets < 0 are ignored)
//   logits (B, T, V), loss ()   the first batch's forward
//   train.inputs, train.targets (steps * grad_accum, B, T) I32: every micro-batch in order
//   train.loss, train.lr, train.grad_norm (steps) F32, final.<name>: weights after training
//   metadata: config (the run config as JSON), decayed (comma-separated decayed tensor names)
// Usage: gpt_oracle OUT.safetensors [--init WEIGHTS.safetensors] [--set section.key=value ...]
// --init takes the initial weights from a file with one F32 tensor per gpt_tensor name (written
// by the Python side: this also checks st_read against an independent writer).
// Context parallelism: under mpirun -np N with --set dist.context_parallel=N every rank holds its
// zigzag part of each sequence (the same batches on every rank); the logits, loss and gradients
// written (by rank 0) are the whole group's, so the file compares with one process's directly.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/config.h"
#include "common/rng.h"
#include "common/safetensors.h"
#include "dist/comm.h"
#include "dist/launch.h"
#include "model/gpt.h"
#include "trainer/train_step.h"

// Share of targets replaced by -1 ("ignore"), so the ignore path is part of every comparison.
#define IGNORE_FRACTION 0.1f
// With data.eot_token >= 0, share of inputs replaced by it: ~4 documents per row of 37.
#define EOT_FRACTION 0.1f

// The oracle model of test_oracle.py; --set overrides any of it.
static const char *const DEFAULTS[] = {
    "model.n_layer=2",        "model.n_head=4",        "model.n_kv_head=2",
    "model.n_embd=64",        "model.vocab_size=101",  "model.max_seq_len=64",
    "train.batch_size=3",     "train.seq_len=37",      "train.steps=0",
    "train.seed=1234",        "optim.decay_embeddings=true",
    "data.synthetic=copy",  // only to satisfy validation: the driver makes its own batches
};

typedef struct {
    const int *inputs, *targets;  // (n_batches, B, T)
    int BT, next;
} Batches;

static void next_batch(void *ctx, int *inputs, int *targets) {
    Batches *b = ctx;
    memcpy(inputs, b->inputs + (size_t)b->next * b->BT, (size_t)b->BT * sizeof(int));
    memcpy(targets, b->targets + (size_t)b->next * b->BT, (size_t)b->BT * sizeof(int));
    b->next++;
}

// Random inputs and a learnable target (a fixed function of the current token), some ignored.
// With eot >= 0 some inputs are the end-of-text token, and the first batch (B, T) holds the
// edge cases of document splitting: an eot ending row 0, and two at the start of row 1 (a
// one-token document at a row start).
static void make_batches(Rng *rng, int *inputs, int *targets, size_t n, int V, int eot, int T) {
    for (size_t i = 0; i < n; i++) {
        inputs[i] = (int)rng_below(rng, (uint64_t)V);
        if (eot >= 0 && rng_uniform(rng) < EOT_FRACTION) inputs[i] = eot;
        targets[i] = rng_uniform(rng) < IGNORE_FRACTION ? -1 : (3 * inputs[i] + 1) % V;
    }
    if (eot < 0 || n < (size_t)2 * T) return;
    const size_t edges[3] = {(size_t)T - 1, (size_t)T, (size_t)T + 1};
    for (int k = 0; k < 3; k++) {
        inputs[edges[k]] = eot;
        if (targets[edges[k]] >= 0) targets[edges[k]] = (3 * eot + 1) % V;
    }
}

// GPT-2 initialisation made harder to pass by accident: 2-D weights scaled up 4x (std 0.08,
// so attention is far from uniform) and noise on LayerNorm weights and on the (zero) biases,
// so every parameter influences the loss through a non-trivial path.
static void random_weights(const GPT *m, float *host, uint64_t seed) {
    gpt_init_weights_host(m, host, seed);
    Rng rng;
    rng_seed(&rng, seed ^ 0x9e3779b97f4a7c15ull);
    for (int i = 0; i < gpt_num_tensors(m); i++) {
        const ParamTensor *t = gpt_tensor(m, i);
        float *p = host + t->offset;
        const int ln_weight = strstr(t->name, "ln") != NULL && strstr(t->name, ".weight") != NULL;
        for (size_t j = 0; j < t->numel; j++) {
            if (t->ndim == 2) p[j] *= 4.0f;
            else p[j] += (ln_weight ? 0.1f : 0.05f) * rng_normal(&rng);
        }
    }
}

static void load_weights(const GPT *m, float *host, const char *path) {
    StFile f;
    char err[512];
    if (st_read(&f, path, err, sizeof err) != 0) fatal(EXIT_USAGE, "%s", err);
    for (int i = 0; i < gpt_num_tensors(m); i++) {
        const ParamTensor *t = gpt_tensor(m, i);
        const StTensor *s = st_find(&f, t->name);
        if (!s || s->dtype != DTYPE_F32 || s->nbytes != t->numel * sizeof(float))
            fatal(EXIT_USAGE, "%s: needs an F32 tensor '%s' of %zu elements", path, t->name, t->numel);
        memcpy(host + t->offset, s->data, s->nbytes);
    }
    st_free(&f);
}

static void add_named(StFile *f, char (*names)[128], int *k, const char *prefix, const ParamTensor *t,
                      const float *data) {
    snprintf(names[*k], 128, "%s%s", prefix, t->name);
    int64_t shape[2] = {t->shape[0], t->shape[1]};
    st_add(f, names[(*k)++], DTYPE_F32, t->ndim, shape, data + t->offset);
}

// One forward and backward of the first batch (B, T) by the context-parallel group: each rank
// runs its part, the loss is the mean over the group's tokens, and the whole group's logits (B,
// T, V) and gradients (summed over the ranks) land in every rank's buffers. Returns the loss.
static float group_forward_backward(GPT *m, ContextParallel *cp, Comm *world, const int *inputs,
                                    const int *targets, int B, int T, int V, float *logits,
                                    float *grads) {
    const CpLayout *lay = cp_get_layout(cp);
    const int TL = T / lay->cp;
    int *lin = xmalloc((size_t)B * TL * sizeof(int)), *ltg = xmalloc((size_t)B * TL * sizeof(int));
    float *llog = xmalloc((size_t)B * TL * V * sizeof(float));  // (B, TL, V)
    cp_take_local(cp, inputs, lin, B, T);
    cp_take_local(cp, targets, ltg, B, T);
    gpt_forward(m, lin, ltg, B, TL);
    int n;
    double sums[2] = {gpt_loss_sum(m, &n), 0};
    sums[1] = n;
    cp_group_sum(cp, sums, 2);
    gpt_set_loss_tokens(m, (long long)sums[1]);
    gpt_logits_f32(m, llog);
    // Each element of the whole logits comes from exactly one rank (the others add 0).
    memset(logits, 0, (size_t)B * T * V * sizeof(float));
    for (int b = 0; b < B; b++)
        for (int t = 0; t < TL; t++)
            memcpy(logits + ((size_t)b * T + ring_global_pos(lay->cp_rank, lay->cp, TL, t)) * V,
                   llog + ((size_t)b * TL + t) * V, (size_t)V * sizeof(float));
    world->allreduce_sum(world, logits, (size_t)B * T * V, DTYPE_F32);
    gpt_backward(m, 1.0f);
    gpt_get_grads_f32(m, grads);
    world->allreduce_sum(world, grads, gpt_num_params(m), DTYPE_F32);
    free(lin);
    free(ltg);
    free(llog);
    return (float)(sums[0] / sums[1]);
}

int main(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || argv[1][0] == '-') {
        fprintf(stderr, "usage: gpt_oracle OUT.safetensors [--init WEIGHTS.safetensors] [--set key=value ...]\n");
        return argc < 2 || argv[1][0] == '-' ? EXIT_USAGE : EXIT_OK;
    }
    const char *out = argv[1], *init = NULL;
    Config c;
    char err[512];
    config_defaults(&c);
    for (size_t i = 0; i < sizeof DEFAULTS / sizeof DEFAULTS[0]; i++)
        if (config_set(&c, DEFAULTS[i], err, sizeof err) != 0) fatal(EXIT_RUNTIME, "%s", err);
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--init") == 0 && i + 1 < argc) {
            init = argv[++i];
            continue;
        }
        if (strcmp(argv[i], "--set") != 0 || i + 1 >= argc)
            fatal(EXIT_USAGE, "unexpected argument '%s' (usage: gpt_oracle OUT [--init FILE] [--set key=value ...])",
                  argv[i]);
        if (config_set(&c, argv[++i], err, sizeof err) != 0) fatal(EXIT_USAGE, "%s", err);
    }
    if (config_validate(&c, err, sizeof err) != 0) fatal(EXIT_USAGE, "%s", err);

    const int B = c.train.batch_size, T = c.train.seq_len, steps = c.train.steps;
    const int n_batches = steps > 0 ? steps * c.train.grad_accum : 1;
    const GPTConfig g = gpt_config_from(&c);
    Backend *be = backend_cpu_create();
    Comm *world = NULL;
    if (c.dist.context_parallel > 1) {
        LaunchInfo li;
        if (launch_detect(&li, err, sizeof err) != 0) fatal(EXIT_USAGE, "%s", err);
        if (li.world != c.dist.context_parallel)
            fatal(EXIT_USAGE, "gpt_oracle: launch exactly dist.context_parallel = %d ranks (one "
                              "group: every rank reads the same batches)", c.dist.context_parallel);
        world = comm_open(&li, DEVICE_CPU, NULL, 300.0, err, sizeof err);
        if (!world) fatal(EXIT_USAGE, "%s", err);
    }
    GPT *m = gpt_create(&g, be, B, world ? cp_local_len(&c) : T, &c);
    const size_t np = gpt_num_params(m), BT = (size_t)B * T;
    const int nt = gpt_num_tensors(m);

    float *params0 = xmalloc(np * sizeof(float));    // (np) initial weights
    float *grads = xmalloc(np * sizeof(float));      // (np) gradient of the first batch
    float *params1 = xmalloc(np * sizeof(float));    // (np) weights after training
    float *logits = xmalloc(BT * g.V * sizeof(float));  // (B, T, V)
    int *inputs = xmalloc((size_t)n_batches * BT * sizeof(int));   // (n_batches, B, T)
    int *targets = xmalloc((size_t)n_batches * BT * sizeof(int));  // (n_batches, B, T)
    float *losses = xcalloc((size_t)steps + 1, sizeof(float));     // (steps)
    float *lrs = xcalloc((size_t)steps + 1, sizeof(float));        // (steps)
    float *norms = xcalloc((size_t)steps + 1, sizeof(float));      // (steps)
    Rng rng;
    rng_seed(&rng, (uint64_t)c.train.seed + 1);
    make_batches(&rng, inputs, targets, (size_t)n_batches * BT, g.V,
                 c.attention.doc_mask ? c.data.eot_token : -1, T);
    if (init) load_weights(m, params0, init);
    else random_weights(m, params0, (uint64_t)c.train.seed);
    gpt_set_params_f32(m, params0);

    // The trainer takes the weights as they are now (the forward below does not change them)
    // and, with context parallelism, opens the group and gives the model its ring.
    Trainer *tr = trainer_create_dist(m, &c, world, err, sizeof err);
    if (!tr) fatal(EXIT_USAGE, "%s", err);
    ContextParallel *cp = trainer_context_parallel(tr);
    gpt_zero_grad(m);
    float loss;
    if (cp) {
        loss = group_forward_backward(m, cp, world, inputs, targets, B, T, g.V, logits, grads);
    } else {
        loss = gpt_forward(m, inputs, targets, B, T);
        gpt_logits_f32(m, logits);
        gpt_backward(m, 1.0f);
        gpt_get_grads_f32(m, grads);
    }

    Batches batches = {inputs, targets, (int)BT, 0};
    for (int s = 0; s < steps; s++) {
        StepStats st = trainer_step(tr, s, next_batch, &batches);
        if (st.skipped) fatal(EXIT_RUNTIME, "step %d was skipped (grad norm %g)", s, st.grad_norm);
        losses[s] = st.loss;
        lrs[s] = st.lr;
        norms[s] = st.grad_norm;
    }
    gpt_get_params_f32(m, params1);
    if (world && world->rank != 0) {   // rank 0 writes for the group
        trainer_free(tr);
        gpt_free(m);
        comm_close(world);
        be->destroy(be);
        return EXIT_OK;
    }

    StFile f;
    st_init(&f);
    char(*names)[128] = xmalloc((size_t)3 * nt * sizeof *names);
    char *decayed = xcalloc((size_t)nt, 72);
    int k = 0;
    for (int i = 0; i < nt; i++) {
        const ParamTensor *t = gpt_tensor(m, i);
        add_named(&f, names, &k, "param.", t, params0);
        add_named(&f, names, &k, "grad.", t, grads);
        if (steps > 0) add_named(&f, names, &k, "final.", t, params1);
        if (t->decay) strcat(strcat(decayed, *decayed ? "," : ""), t->name);
    }
    const int64_t sh_bt[2] = {B, T}, sh_logits[3] = {B, T, g.V}, sh_mb[3] = {n_batches, B, T}, sh_s[1] = {steps};
    st_add(&f, "tokens", DTYPE_I32, 2, sh_bt, inputs);
    st_add(&f, "targets", DTYPE_I32, 2, sh_bt, targets);
    st_add(&f, "logits", DTYPE_F32, 3, sh_logits, logits);
    st_add(&f, "loss", DTYPE_F32, 0, NULL, &loss);
    if (steps > 0) {
        st_add(&f, "train.inputs", DTYPE_I32, 3, sh_mb, inputs);
        st_add(&f, "train.targets", DTYPE_I32, 3, sh_mb, targets);
        st_add(&f, "train.loss", DTYPE_F32, 1, sh_s, losses);
        st_add(&f, "train.lr", DTYPE_F32, 1, sh_s, lrs);
        st_add(&f, "train.grad_norm", DTYPE_F32, 1, sh_s, norms);
    }
    char *cfg_json = config_to_json(&c);
    st_set_meta(&f, "config", cfg_json);
    st_set_meta(&f, "decayed", decayed);
    int rc = st_write(&f, out, err, sizeof err);
    if (rc != 0) fprintf(stderr, "error: %s\n", err);

    free(cfg_json);
    st_free(&f);
    free(names);
    free(decayed);
    trainer_free(tr);
    gpt_free(m);
    comm_close(world);
    be->destroy(be);
    free(params0);
    free(grads);
    free(params1);
    free(logits);
    free(inputs);
    free(targets);
    free(losses);
    free(lrs);
    free(norms);
    return rc == 0 ? EXIT_OK : EXIT_RUNTIME;
}
