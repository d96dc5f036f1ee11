// train_step: one optimizer step over grad_accum micro-batches. The optimizer (optim/optim.h's
// interface, made for the backend's device) updates the parameters the model reads and keeps
// whatever master copy it needs; its deterministic sum of squares gives the global norm and
// turns inf/NaN on a non-finite gradient. With several ranks it covers only this rank's shard
// (ZeRO-1, train_step.h).
#include "trainer/train_step.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/timer.h"

struct Trainer {
    GPT *m;
    Config c;
    Comm *comm;             // NULL: one process
    int rank, world;
    ContextParallel *cp;    // dist.context_parallel's group, or NULL
    int dp;                 // data-parallel replicas: world / CP
    size_t n;               // elements of the flat parameter vector
    size_t shard_off, shard_n;   // this rank's optimizer shard of the flat vector
    size_t *counts;         // (world) every rank's shard length
    // Gradient buckets (several ranks): on the last micro-step each bucket of adjacent blocks
    // is reduce-scattered as soon as backward has finished it; 0 = one reduce-scatter after
    // the whole backward.
    size_t bucket_n;        // elements per bucket (a bucket closes once it holds this many)
    size_t bucket_lo, bucket_hi;   // the open bucket [lo, hi) of the flat vector; lo == hi: none
    Optimizer *opt;         // over the shard
    OptimState view;        // checkpoint views (trainer_optim_state)
    float *host_state;      // (n + 2 * shard_n) host master (all), m, v behind the views
    LossScaler scaler;
    int timing;             // trainer_set_timing
    int (*stop_poll)(void); // trainer_set_stop_poll; NULL: never
    int B, T, TL;           // batch, whole sequence, the tokens of it this rank holds
    int *inputs, *targets;  // (B, T) host, the current micro-batch
    int *local_in, *local_tg;  // (B, TL) host, this rank's part of it (context parallelism)
    // Launched steps not yet collected (trainer_launch / trainer_collect): with host decisions
    // their whole stats, with device decisions what the host knows (lr, stop); the rest waits in
    // the optimizer's ring of records, slot = launch number % TRAINER_MAX_PENDING.
    StepStats pending[TRAINER_MAX_PENDING];
    int n_pending;
    long long launched;     // steps launched so far
    // Steps decided on the device (trainer_step's comment in train_step.h).
    int dev_steps;
    LossScaler scaler_dev;  // the scaler as the device last had it (scaler: the host's view)
    int *staged;            // (2, accum, 2, B, T) host_alloc: two steps' micro-batches, each
                            // tokens then targets, the steps in turn
    int *dev_batch;         // (accum, 2, B, T) backend: the current step's micro-batches
    int *n_valid;           // (accum) counted targets of the current step's micro-batches
    // train.cuda_graph: the step captured once and replayed.
    int graphs;             // 1: replay; 0: launch every kernel
    int warm;               // a step has run without graph (workspaces have their sizes)
    void *graph;            // the captured step, or NULL
    float graph_scale;      // the loss scale its backward was captured with
    int *graph_valid;       // (accum) the counted targets it was captured with
    long long replays;      // steps that ran as a replay
};

const char *const STEP_PHASE_NAMES[N_STEP_PHASES] = {"forward+backward", "reduction after backward",
                                                     "norm", "optimizer", "all-gather"};

void trainer_set_timing(Trainer *t, int on) { t->timing = on; }
void trainer_set_stop_poll(Trainer *t, int (*poll)(void)) { t->stop_poll = poll; }
GPT *trainer_model(Trainer *t) { return t->m; }
Comm *trainer_comm(Trainer *t) { return t->comm; }

// Closes phase p of a timed step: waits for the device, adds the time since *t0 and restarts it.
static void phase_end(Trainer *t, StepStats *st, StepPhase p, double *t0) {
    if (!t->timing) return;
    gpt_backend(t->m)->synchronize(gpt_backend(t->m));
    const double now = now_seconds();
    st->phase_ms[p] = (now - *t0) * 1e3;
    *t0 = now;
}

// Bucket size in elements from dist.bucket_mb (MiB of gradients; 0 = no buckets: one
// reduce-scatter after backward), or FLASHGPT_BUCKET_MB when set. The default, 25 MiB, is large
// enough that each collective's fixed latency is small against its transfer, small enough that
// the first starts early in backward.
static size_t bucket_elems(double mb, size_t elem_bytes) {
    mb = config_env_override("FLASHGPT_BUCKET_MB", mb, 0, 1e6,
                             "MiB of gradients per reduction bucket, 0 to 1e6 (0: one reduction "
                             "after backward)");
    if (mb == 0) return 0;
    const size_t n = (size_t)(mb * 1048576.0 / (double)elem_bytes);
    return n ? n : 1;
}

static void bucket_flush(Trainer *t) {
    if (t->bucket_lo == t->bucket_hi) return;
    Backend *be = gpt_backend(t->m);
    t->comm->reduce_scatter_start(t->comm, gpt_grads(t->m), t->bucket_lo,
                                  t->bucket_hi - t->bucket_lo, t->counts, be->dtype);
    t->bucket_lo = t->bucket_hi = 0;
}

// gpt's grad-ready hook: the block [offset, offset + count) joins the open bucket (blocks come
// in descending order, each adjacent to the last); a full bucket starts its reduction.
static void bucket_add(void *ctx, size_t offset, size_t count) {
    Trainer *t = ctx;
    if (t->bucket_lo != t->bucket_hi && offset + count != t->bucket_lo) bucket_flush(t);
    if (t->bucket_lo == t->bucket_hi) t->bucket_hi = offset + count;
    t->bucket_lo = offset;
    if (t->bucket_hi - t->bucket_lo >= t->bucket_n) bucket_flush(t);
}

// The optimizer state is the last large allocation of a run: check it fits, so a full GPU is a
// message, not a crash. The model's current parameters become the master weights. 0, or -1
// with err set.
static int optimizer_open(Trainer *t, const OptimSpan *spans, int n_spans, char *err, size_t errlen) {
    Backend *be = gpt_backend(t->m);
    const size_t n = t->shard_n, need = optimizer_device_bytes(be->device, n);
    size_t free_b, used_b;
    if (need && be->memory(be, &free_b, &used_b) && free_b < need)
        return set_error(err, errlen, "%s: the optimizer state (fp32 master weights and AdamW moments "
                                      "of %zu parameters) needs %.0f MiB, but only %.0f MiB of GPU "
                                      "memory are free after the model and its activations (%.0f "
                                      "MiB): lower train.batch_size or set train.recompute = "
                                      "attn_gelu or block",
                         be->name, n, need / 1048576.0, free_b / 1048576.0, used_b / 1048576.0);
    t->opt = optimizer_create(be->device, be->dtype, be->stream, n, spans, n_spans, &t->c);
    float *host = xmalloc(t->n * sizeof(float));  // (n)
    gpt_get_params_f32(t->m, host);
    t->opt->set_state(t->opt, host + t->shard_off, NULL, NULL);
    free(host);
    return 0;
}

// The optimizer spans inside this rank's shard, relative to its start: one per parameter tensor
// that overlaps it (the model decides which ones decay). Returns the count (malloc'ed *out).
static int shard_spans(const Trainer *t, OptimSpan **out) {
    const int n = gpt_num_tensors(t->m);
    const size_t lo = t->shard_off, hi = t->shard_off + t->shard_n;
    OptimSpan *spans = xmalloc((size_t)(n ? n : 1) * sizeof(OptimSpan));
    int k = 0;
    for (int i = 0; i < n; i++) {
        const ParamTensor *p = gpt_tensor(t->m, i);
        const size_t a = p->offset > lo ? p->offset : lo;
        const size_t b = p->offset + p->numel < hi ? p->offset + p->numel : hi;
        if (a < b) spans[k++] = (OptimSpan){.offset = a - lo, .n = b - a, .decay = p->decay};
    }
    *out = spans;
    return k;
}

// Why this run's step cannot be one CUDA graph, or NULL when it can.
static const char *graph_obstacle(const Trainer *t, const Config *c, const Backend *be) {
    if (!t->opt->dev_open) return "the cpu backend has no CUDA graphs";
    if (t->comm)
        return "with several ranks the loss, the gradient norm and the stop requests are "
               "all-reduced on the host between backward and AdamW";
    if (c->attention.doc_mask) return "attention.doc_mask finds each batch's documents on the host";
    return NULL;
}

// train.cuda_graph: auto replays where graph_obstacle finds nothing (and says why not on a GPU),
// on is refused where it does. *wanted: whether the steps replay a graph; 0, or -1 with err set.
static int graphs_wanted(const Trainer *t, const Config *c, const Backend *be, int *wanted, char *err,
                         size_t errlen) {
    *wanted = 0;
    if (c->train.cuda_graph == CUDA_GRAPH_OFF) return 0;
    const char *why = graph_obstacle(t, c, be);
    if (why && c->train.cuda_graph == CUDA_GRAPH_ON)
        return set_error(err, errlen, "train.cuda_graph = on, but %s: set train.cuda_graph = auto or "
                                      "off", why);
    if (why && t->opt->dev_open)
        fprintf(stderr, "notice: train.cuda_graph = auto: the step runs without a CUDA graph: "
                        "%s\n", why);
    *wanted = why == NULL;
    return 0;
}

// The state of steps decided on the device: the staged batches, the optimizer's record ring and
// the scaler's device copy.
static void device_steps_open(Trainer *t) {
    Backend *be = gpt_backend(t->m);
    const int accum = t->c.train.grad_accum;
    const size_t batch = (size_t)accum * 2 * t->B * t->T;   // ints per step
    t->staged = be->host_alloc(be, 2 * batch * sizeof(int));
    t->dev_batch = be->alloc(be, batch * sizeof(int));
    t->n_valid = xcalloc((size_t)accum, sizeof(int));
    t->graph_valid = xcalloc((size_t)accum, sizeof(int));
    t->opt->dev_open(t->opt, TRAINER_MAX_PENDING, (double)accum, t->c.optim.grad_clip);
    t->opt->dev_set_scaler(t->opt, &t->scaler);
    t->scaler_dev = t->scaler;
}

Trainer *trainer_create_dist(GPT *m, const Config *c, Comm *comm, char *err, size_t errlen) {
    Backend *be = gpt_backend(m);
    Trainer *t = xcalloc(1, sizeof *t);
    t->m = m;
    t->c = *c;
    t->comm = comm && comm->world > 1 ? comm : NULL;
    t->rank = t->comm ? comm->rank : 0;
    t->world = t->comm ? comm->world : 1;
    t->n = gpt_num_params(m);
    t->counts = xmalloc((size_t)t->world * sizeof(size_t));
    comm_shard(t->n, t->world, t->rank, &t->shard_off, &t->shard_n, t->counts);
    CpLayout lay;
    if ((c->dist.context_parallel > 1 && !t->comm && cp_layout(c, 0, 1, &lay, err, errlen) != 0) ||
        (t->comm && cp_open(t->comm, c, m, &t->cp, err, errlen) != 0)) {
        trainer_free(t);
        return NULL;
    }
    t->dp = t->cp ? cp_get_layout(t->cp)->dp : t->world;
    if (t->comm) t->bucket_n = bucket_elems(c->dist.bucket_mb, dtype_size(be->dtype));
    t->B = c->train.batch_size;
    t->T = c->train.seq_len;
    t->TL = t->cp ? cp_local_len(c) : t->T;
    t->inputs = xmalloc((size_t)t->B * t->T * sizeof(int));
    t->targets = xmalloc((size_t)t->B * t->T * sizeof(int));
    t->local_in = xmalloc((size_t)t->B * t->TL * sizeof(int));
    t->local_tg = xmalloc((size_t)t->B * t->TL * sizeof(int));
    OptimSpan *spans;
    const int n_spans = shard_spans(t, &spans);
    const int opened = optimizer_open(t, spans, n_spans, err, errlen) == 0;
    free(spans);
    if (!opened) {
        trainer_free(t);
        return NULL;
    }
    // fp16 gradients underflow without a loss scale; bf16 (fp32's exponent range) and fp32 need
    // none, but the scaler still detects non-finite steps.
    scaler_init(&t->scaler, c, be->dtype == DTYPE_F16);
    t->dev_steps = t->opt->dev_open && !t->comm && !c->attention.doc_mask;
    if (t->dev_steps) device_steps_open(t);
    int graphs;
    if (graphs_wanted(t, c, be, &graphs, err, errlen) != 0) {
        trainer_free(t);
        return NULL;
    }
    t->graphs = t->dev_steps && graphs;
    return t;
}

Trainer *trainer_create(GPT *m, const Config *c, char *err, size_t errlen) {
    return trainer_create_dist(m, c, NULL, err, errlen);
}

void trainer_free(Trainer *t) {
    if (!t) return;
    Backend *be = gpt_backend(t->m);
    if (t->dev_steps) {
        be->synchronize(be);
        be->graph_free(be, t->graph);
        be->host_release(be, t->staged);
        be->release(be, t->dev_batch);
        free(t->n_valid);
        free(t->graph_valid);
    }
    if (t->opt) t->opt->destroy(t->opt);
    cp_close(t->cp);
    free(t->local_in);
    free(t->local_tg);
    free(t->host_state);
    free(t->counts);
    free(t->inputs);
    free(t->targets);
    free(t);
}

const Optimizer *trainer_optimizer(const Trainer *t) { return t->opt; }
LossScaler *trainer_scaler(Trainer *t) { return &t->scaler; }

void trainer_set_weights_f32(Trainer *t, const float *host) {
    gpt_set_params_f32(t->m, host);
    t->opt->set_state(t->opt, host + t->shard_off, NULL, NULL);
}

// The full fp32 master weights into host (n): this rank's shard copied from the optimizer into a
// temporary device vector, the others' gathered into it there (every rank takes part), then one
// download.
static void download_master(Trainer *t, float *host) {
    if (!t->comm) {
        t->opt->get_state(t->opt, host, NULL, NULL);
        return;
    }
    Backend *be = gpt_backend(t->m);
    float *all = be->alloc(be, t->n * sizeof(float));  // (n) backend memory
    t->opt->copy_master(t->opt, all + t->shard_off);
    t->comm->allgather(t->comm, all, t->counts, DTYPE_F32);
    t->comm->wait(t->comm);
    be->download(be, host, all, t->n * sizeof(float));
    be->release(be, all);
}

// The views of trainer_optim_state are host buffers the trainer owns: the master weights (all
// n, with has_master) and the moments of the shard. The optimizer copies its state into them
// and back, so checkpoints look the same whatever the device.
OptimState *trainer_optim_state(Trainer *t) {
    if (!t->host_state) t->host_state = xmalloc((t->n + 2 * t->shard_n + 1) * sizeof(float));
    float *master = t->host_state, *mom = master + t->n, *vel = mom + t->shard_n;
    t->opt->get_state(t->opt, NULL, mom, vel);
    if (t->opt->has_master) download_master(t, master);
    t->view = (OptimState){.n = t->n, .master = t->opt->has_master ? master : NULL, .m = mom,
                           .v = vel, .t = t->opt->get_t(t->opt), .shard_offset = t->shard_off,
                           .shard_n = t->comm ? t->shard_n : 0};
    return &t->view;
}

void trainer_optim_state_commit(Trainer *t) {
    const float *master = t->view.master ? t->view.master + t->shard_off : NULL;
    t->opt->set_state(t->opt, master, t->view.m, t->view.v);
    t->opt->set_t(t->opt, t->view.t);
    // The same round-to-nearest-even as the optimizer's write: the parameters are bitwise
    // those the saving run computed with.
    if (t->view.master) gpt_set_params_f32(t->m, t->view.master);
}

ContextParallel *trainer_context_parallel(Trainer *t) { return t->cp; }

// Forward of the micro-batch in t->inputs / t->targets; returns its mean loss. Under context
// parallelism this rank runs its part of each sequence, and the mean is over the whole group's
// tokens (the sum and count over the group), which the backward then divides by as well: the
// group together is one process with the whole sequences.
static float micro_forward(Trainer *t) {
    if (!t->cp) return gpt_forward(t->m, t->inputs, t->targets, t->B, t->T);
    cp_take_local(t->cp, t->inputs, t->local_in, t->B, t->T);
    cp_take_local(t->cp, t->targets, t->local_tg, t->B, t->T);
    gpt_forward(t->m, t->local_in, t->local_tg, t->B, t->TL);
    int n;
    double sums[2] = {gpt_loss_sum(t->m, &n), 0};
    sums[1] = n;
    cp_group_sum(t->cp, sums, 2);
    gpt_set_loss_tokens(t->m, (long long)sums[1]);
    return sums[1] > 0 ? (float)(sums[0] / sums[1]) : 0.0f;
}

// A step decided on the host: every number comes back before the next phase (the CPU, and
// CUDA runs with several ranks or packed documents).
static StepStats host_step(Trainer *t, long long step, NextBatchFn next, void *ctx) {
    GPT *m = t->m;
    const int accum = t->c.train.grad_accum;
    StepStats st;
    memset(&st, 0, sizeof st);
    st.loss_scale = t->scaler.scale;
    st.lr = lr_at(&t->c, step, t->c.train.steps);

    double t0 = now_seconds();
    gpt_zero_grad(m);
    double loss_sum = 0;
    // Only the last micro-step reduces: accumulation adds locally, the ranks meet once.
    const int bucketed = t->comm && t->bucket_n;
    for (int k = 0; k < accum; k++) {
        next(ctx, t->inputs, t->targets);
        // Dropout masks from the step number and the rank alone: a resumed run draws the same
        // ones, and ranks draw different ones.
        gpt_set_rng_step(m, ((uint64_t)step * (uint64_t)accum + (uint64_t)k) * (uint64_t)t->world +
                                (uint64_t)t->rank);
        loss_sum += micro_forward(t);
        if (bucketed && k == accum - 1) gpt_set_grad_ready_hook(m, bucket_add, t);
        // Each micro-batch's mean loss weighs 1/(accum * DP), so the step's gradient summed
        // over ranks is that of the mean over the global batch, multiplied by the loss scale
        // (under context parallelism the CP ranks of a group each hold part of one mean).
        gpt_backward(m, st.loss_scale / (float)(accum * t->dp));
    }
    if (bucketed) {
        bucket_flush(t);
        gpt_set_grad_ready_hook(m, NULL, NULL);
    }
    phase_end(t, &st, PHASE_COMPUTE, &t0);

    Backend *be = gpt_backend(m);
    char *params = gpt_params(m), *grads = gpt_grads(m);  // (n_params) backend memory, dtype
    const size_t es = dtype_size(be->dtype), off = t->shard_off * es;
    if (t->comm) {
        if (!bucketed)
            t->comm->reduce_scatter_sum(t->comm, grads, t->counts, be->dtype);
        t->comm->wait(t->comm);   // the buckets' reductions end here
    }
    phase_end(t, &st, PHASE_REDUCE, &t0);
    const double sumsq = t->opt->grad_sumsq(t->opt, grads + off);
    // Summed over the ranks, so every rank sees the same loss and norm and takes the same
    // clipping and skip decisions; the stop requests ride along (a count of ranks that asked).
    double sums[3] = {loss_sum, sumsq, t->stop_poll && t->stop_poll() ? 1.0 : 0.0};
    if (t->comm) t->comm->allreduce_host_f64(t->comm, sums, 3);
    st.stop = sums[2] > 0;
    st.loss = (float)(sums[0] / (accum * t->world));
    const double norm = sqrt(sums[1]) / st.loss_scale;
    st.grad_norm = (float)norm;
    st.skipped = scaler_update(&t->scaler, isfinite(norm));
    phase_end(t, &st, PHASE_NORM, &t0);
    if (st.skipped) return st;
    const float mult = grad_multiplier(norm, t->c.optim.grad_clip, st.loss_scale);
    t->opt->step(t->opt, params + off, grads + off, st.lr, mult);
    phase_end(t, &st, PHASE_UPDATE, &t0);
    if (t->comm) {
        t->comm->allgather(t->comm, params, t->counts, be->dtype);
        t->comm->wait(t->comm);
    }
    phase_end(t, &st, PHASE_GATHER, &t0);
    return st;
}

// ---- steps decided on the device ----

// The step's kernels: forward and backward of every staged micro-batch (host: their host copy),
// then the optimizer's device decisions and AdamW. Run as is, or recorded into the graph. The
// dropout masks of micro-batch k are those of micro-step step * accum + k (host_step's with one
// rank): k counts from the base device_step wrote, which the kernels read when they run.
static void device_body(Trainer *t, StepStats *st, const int *host, float scale) {
    GPT *m = t->m;
    const int accum = t->c.train.grad_accum;
    const size_t per = (size_t)2 * t->B * t->T;   // ints per micro-batch
    double t0 = now_seconds();
    gpt_zero_grad(m);
    for (int k = 0; k < accum; k++) {
        gpt_set_rng_step(m, (uint64_t)k);
        t->n_valid[k] = gpt_forward_async(m, host + k * per, t->dev_batch + k * per, t->B, t->T,
                                          t->opt->dev_loss(t->opt));
        gpt_backward(m, scale / (float)accum);
    }
    phase_end(t, st, PHASE_COMPUTE, &t0);
    t->opt->dev_step(t->opt, gpt_params(m), gpt_grads(m));
    phase_end(t, st, PHASE_UPDATE, &t0);
}

// Whether this step replays the graph, capturing it first where there is none yet or where the
// host values baked into it differ: the loss scale (fp16) and the micro-batches' counted
// targets, which the backward divides by. The first step runs without one, so every workspace
// has its size before a capture. A capture the device refuses ends the graphs with a notice
// (train.cuda_graph = on: exit 1) and the step runs without.
static int graph_ready(Trainer *t, StepStats *st, const int *host, float scale) {
    if (!t->graphs || t->timing) return 0;
    if (!t->warm) {
        t->warm = 1;
        return 0;
    }
    const int accum = t->c.train.grad_accum, N = t->B * t->T;
    const size_t per = (size_t)2 * N;
    int same = t->graph && scale == t->graph_scale;
    for (int k = 0; k < accum; k++) {
        const int *tg = host + k * per + N;
        gpt_check_batch(t->m, host + k * per, tg, t->B, t->T);
        int n = 0;
        for (int i = 0; i < N; i++) n += tg[i] >= 0;
        t->n_valid[k] = n;
        same = same && n == t->graph_valid[k];
    }
    if (same) return 1;
    Backend *be = gpt_backend(t->m);
    char err[ERR_LEN];
    be->graph_free(be, t->graph);
    t->graph = NULL;
    if (be->capture_begin(be, err, sizeof err) == 0) {
        device_body(t, st, host, scale);
        t->graph = be->capture_end(be, err, sizeof err);
    }
    if (!t->graph) {
        if (t->c.train.cuda_graph == CUDA_GRAPH_ON)
            fatal(EXIT_RUNTIME, "train.cuda_graph: %s", err);
        fprintf(stderr, "notice: train.cuda_graph = auto: %s; the run continues without graphs\n",
                err);
        t->graphs = 0;
        return 0;
    }
    t->graph_scale = scale;
    memcpy(t->graph_valid, t->n_valid, (size_t)accum * sizeof(int));
    return 1;
}

static void device_step(Trainer *t, long long step, NextBatchFn next, void *ctx, StepStats *st) {
    Backend *be = gpt_backend(t->m);
    Optimizer *o = t->opt;
    // The host's scaler changed since the device last had it (a resume, a test): the device
    // takes it. fp16's dynamic scale may have changed in a step still running, and the
    // backward's gradient scale is a kernel argument: the one wait of these steps.
    if (memcmp(&t->scaler, &t->scaler_dev, sizeof t->scaler) != 0) o->dev_set_scaler(o, &t->scaler);
    else if (t->scaler.dynamic && t->n_pending > 0) o->dev_get_scaler(o, &t->scaler);
    t->scaler_dev = t->scaler;
    memset(st, 0, sizeof *st);
    st->lr = lr_at(&t->c, step, t->c.train.steps);
    st->loss_scale = t->scaler.scale;

    // The micro-batches into page-locked memory (the previous user of this half was the step
    // before last, whose copies are long done), each copied as it is filled.
    const int accum = t->c.train.grad_accum, half = (int)(t->launched & 1);
    const size_t per = (size_t)2 * t->B * t->T;
    int *host = t->staged + (size_t)half * accum * per;
    be->upload_wait(be, half);
    for (int k = 0; k < accum; k++) {
        int *h = host + k * per;
        next(ctx, h, h + per / 2);
        be->upload_async(be, t->dev_batch + k * per, h, per * sizeof(int), half);
    }
    o->dev_begin(o, st->lr, (int)(t->launched % TRAINER_MAX_PENDING));
    gpt_set_rng_base(t->m, (uint64_t)step * (uint64_t)accum);
    const float scale = st->loss_scale;
    int replayed = graph_ready(t, st, host, scale) && be->graph_launch(be, t->graph) == 0;
    if (!replayed && t->graph) {   // stale: an op between steps grew a workspace it recorded
        be->graph_free(be, t->graph);
        t->graph = NULL;
        replayed = graph_ready(t, st, host, scale) && be->graph_launch(be, t->graph) == 0;
    }
    if (replayed) t->replays++;
    else device_body(t, st, host, scale);
    st->stop = t->stop_poll && t->stop_poll();
}

void trainer_launch(Trainer *t, long long step, NextBatchFn next, void *ctx) {
    CHECK(t->n_pending < TRAINER_MAX_PENDING);
    StepStats *st = &t->pending[t->n_pending];
    if (t->dev_steps) device_step(t, step, next, ctx, st);
    else *st = host_step(t, step, next, ctx);
    t->n_pending++;
    t->launched++;
}

int trainer_pending(const Trainer *t) { return t->n_pending; }
int trainer_stop_asked(const Trainer *t) { return t->n_pending && t->pending[t->n_pending - 1].stop; }
long long trainer_graph_replays(const Trainer *t) { return t->replays; }

int trainer_collect(Trainer *t, StepStats *out) {
    const int n = t->n_pending;
    memcpy(out, t->pending, (size_t)n * sizeof(StepStats));
    t->n_pending = 0;
    if (!t->dev_steps || n == 0) return n;
    StepRecord rec[TRAINER_MAX_PENDING];
    t->opt->dev_records(t->opt, rec, (int)((t->launched - n) % TRAINER_MAX_PENDING), n);
    for (int i = 0; i < n; i++) {
        out[i].loss = rec[i].loss;
        out[i].grad_norm = rec[i].grad_norm;
        out[i].skipped = rec[i].skipped;
        out[i].loss_scale = rec[i].loss_scale;
    }
    t->opt->dev_get_scaler(t->opt, &t->scaler);
    t->scaler_dev = t->scaler;
    return n;
}

StepStats trainer_step(Trainer *t, long long step, NextBatchFn next, void *ctx) {
    CHECK(t->n_pending == 0);
    trainer_launch(t, step, next, ctx);
    StepStats st;
    trainer_collect(t, &st);
    return st;
}
