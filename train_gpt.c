// train_gpt: subcommand dispatch and the training loop. It composes the modules below and
// holds no kernel or model code of its own.
#include "cli/cli.h"               // defines: the other subcommands and what they share
#include "cli/prepare.h"           // defines: the prepare subcommand (streams text into shards)
#include "cli/stop.h"              // defines: SIGTERM / SIGINT as a request to stop cleanly
#include "common/check.h"           // defines: fatal, exit codes, checked host I/O
#include "common/config.h"          // defines: Config and the one table of config keys
#include "common/fileio.h"          // defines: atomic writes, mkdir_p
#include "common/metrics.h"         // defines: metrics.jsonl writer
#include "common/rng.h"             // defines: serialisable RNG
#include "common/timer.h"           // defines: now_seconds, format_eta
#include "data/dataset.h"           // defines: shards and synthetic tasks behind one batch interface
#include "data/tokenizer.h"         // defines: llm.c tokenizer files (decode samples)
#include "dist/comm.h"              // defines: collectives (single, MPI, NCCL) for data parallelism
#include "dist/launch.h"            // defines: torchrun / mpirun / srun detection
#include "model/backend.h"          // defines: the op set, cpu (and cuda) backends
#include "model/gpt.h"              // defines: the GPT model over a backend
#include "trainer/checkpoint.h"     // defines: checkpoint directories, resume
#include "trainer/eval.h"           // defines: the evaluation loop
#include "trainer/guard.h"          // defines: the divergence guard's bookkeeping
#include "trainer/resume.h"         // defines: going back to the newest checkpoint that loads
#include "trainer/train_step.h"     // defines: one optimizer step (accumulation, clipping, AdamW)

#include <math.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------------------------

static void usage_main(FILE *f) {
    fprintf(f,
            "usage: train_gpt <command> [options]   (train_gpt <command> --help for details)\n"
            "  train    train a GPT from a JSON config; resumes from the newest checkpoint\n"
            "  eval     print the mean validation loss of a checkpoint over token shards\n"
            "  sample   generate text from a checkpoint\n"
            "  prepare  tokenize a text file into token shards and a tokenizer file\n"
            "  bench    time training steps of a config\n"
            "  export   write a checkpoint as a Hugging Face GPT-2 directory\n"
            "  import   turn llm.c or Hugging Face GPT-2 weights into a checkpoint\n");
}

static void next_batch(void *ctx, int *inputs, int *targets) { dataset_next(ctx, inputs, targets); }

// ----------------------------------------------------------------------------------------------
// train

typedef struct {
    Config cfg;
    GPT *model;
    Backend *be;
    Trainer *trainer;
    Dataset *train, *val;
    Tokenizer *tok;
    Metrics metrics;
    Rng rng;              // sampling
    TrainState state;
    LaunchInfo launch;
    Comm *comm;           // the ranks of a data-parallel run (world size 1: single process)
    Guard guard;          // train.divergence_steps
    int went_back;        // the guard sent the run back, and no checkpoint was written since
    // Data the guard skips: when the next global batch would start at stream index skip_from,
    // it starts at skip_to instead (the windows the bad steps read); skip_to 0: none.
    uint64_t skip_from, skip_to;
    CpLayout cp;          // dist.context_parallel's groups: the data-parallel slice is the group's
} Run;
// One forward and backward of a zero batch on the GPU (evaluation mode: no dropout, so the run's
// dropout stream is untouched) before anything is written: an unsupported head size or a batch
// that does not fit in memory fails here with its message and exit code 2, not at step 1.
// The gradients it leaves are cleared by the first training step.
static void probe_device(GPT *m, int B, int T) {
    int *zeros = xcalloc((size_t)B * T, sizeof(int));  // (B, T) token 0 predicting token 0
    gpt_set_training(m, 0);
    gpt_forward(m, zeros, zeros, B, T);
    gpt_backward(m, 1.0f);
    gpt_backend(m)->synchronize(gpt_backend(m));
    gpt_set_training(m, 1);
    free(zeros);
}

// Loads the newest checkpoint of log.dir that loads on every rank (trainer/resume.h) with the
// state the run keeps beside the model: the loss scaler, the sampling RNG, the data position and
// the guard's running mean. path receives the checkpoint; returns the world size that wrote it.
static int go_back(Run *r, char *path, size_t path_len) {
    char err[ERR_LEN];
    const int rc = trainer_resume(r->trainer, &r->cfg, r->cfg.log.dir, &r->state, path, path_len,
                                  err, sizeof err);
    if (rc < 0) fatal(EXIT_USAGE, "%s", err);
    if (rc == 0) fatal(EXIT_RUNTIME, "no checkpoint in log.dir '%s' to go back to", r->cfg.log.dir);
    const int written_by = r->state.world_size;
    r->state.world_size = r->launch.world;
    *trainer_scaler(r->trainer) = r->state.scaler;
    memcpy(r->rng.s, r->state.rng, sizeof r->rng.s);
    DatasetState ds = {r->state.data[0], r->state.data[1], r->state.data[2]};
    dataset_set_state(r->train, ds);
    guard_init(&r->guard, &r->cfg, r->state.guard_loss_mean);
    return written_by;
}

// Opens everything a run needs. All input is validated (data, tokenizer, model, a checkpoint to
// resume from) before anything is written into log.dir.
// With several ranks (r->launch) every rank runs this; each reads its slice of every batch, and
// only rank 0 writes into log.dir (and prints: the other ranks' stdout is closed).
static void open_run(Run *r, const char *device) {
    char err[ERR_LEN];
    Config *c = &r->cfg;
    const int B = c->train.batch_size, T = c->train.seq_len;
    const int rank = r->launch.rank, world = r->launch.world;
    // Context parallelism: the ranks of a group read the same sequences (their data-parallel
    // slice) and each runs its part of every one.
    if (cp_layout(c, rank, world, &r->cp, err, sizeof err) != 0) fatal(EXIT_USAGE, "%s", err);
    r->train = dataset_open(c, SPLIT_TRAIN, B, T, r->cp.dp_rank, r->cp.dp, err, sizeof err);
    if (!r->train) fatal(EXIT_USAGE, "%s", err);
    r->val = NULL;
    if (c->data.synthetic != SYNTH_NONE || c->data.val[0]) {
        r->val = dataset_open(c, SPLIT_VAL, B, T, r->cp.dp_rank, r->cp.dp, err, sizeof err);
        if (!r->val) fatal(EXIT_USAGE, "%s", err);
    } else {
        fprintf(stderr, "notice: data.val is empty: no evaluation\n");
    }
    r->tok = c->data.tokenizer[0] ? cli_load_tokenizer(c->data.tokenizer) : NULL;

    // Each rank binds the GPU of its local rank.
    r->be = cli_open_backend(device, c->precision.dtype, (AttnKernel)c->attention.kernel,
                             r->launch.local_rank);
    r->comm = cli_open_comm(&r->launch, r->be, c);
    // Every rank starts from the same weights (the same seed) and sees the same checkpoints.
    GPTConfig gc = gpt_config_from(c);
    r->model = gpt_create(&gc, r->be, B, cp_local_len(c), c);
    if (r->be->device == DEVICE_CUDA) probe_device(r->model, B, T);
    r->trainer = trainer_create_dist(r->model, c, r->comm, err, sizeof err);
    if (!r->trainer) fatal(EXIT_USAGE, "%s", err);
    memset(&r->state, 0, sizeof r->state);
    r->state.world_size = world;
    rng_seed(&r->rng, (uint64_t)c->train.seed ^ 0x5A4D504C45ull);

    char ckpt[4096];
    int resume = checkpoint_find_latest(c->log.dir, ckpt, sizeof ckpt);
    // The ranks must start from the same place: a log.dir that is not one shared directory
    // (different hosts, no shared filesystem) could let some resume and others not.
    double resuming = resume;
    r->comm->allreduce_host_f64(r->comm, &resuming, 1);
    if (resuming != 0 && resuming != world)
        fatal(EXIT_USAGE, "rank %d %s a checkpoint in log.dir '%s' but other ranks did%s: log.dir "
                          "must be one directory that every rank sees (a shared filesystem across "
                          "hosts)", rank, resume ? "found" : "found no", c->log.dir,
              resume ? " not" : "");
    if (resume) {
        const int written_by = go_back(r, ckpt, sizeof ckpt);
        if (written_by != world && rank == 0)
            fprintf(stderr, "notice: '%s' was written by %d ranks, this run has %d: the optimizer "
                            "shards are re-cut, and the data continues at the same window\n",
                    ckpt, written_by, world);
    } else {
        float *host = xmalloc(gpt_num_params(r->model) * sizeof(float));
        gpt_init_weights_host(r->model, host, (uint64_t)c->train.seed);
        trainer_set_weights_f32(r->trainer, host);
        free(host);
        guard_init(&r->guard, c, 0);
    }

    if (rank != 0) {
        // Rank 0 reports for all; the others keep stderr for their own errors.
        if (!freopen("/dev/null", "w", stdout))
            fatal(EXIT_RUNTIME, "rank %d: cannot close stdout", rank);
        return;
    }
    if (mkdir_p(c->log.dir, err, sizeof err) != 0) fatal(EXIT_USAGE, "log.dir: %s", err);
    checkpoint_remove_leftovers(c->log.dir);
    char path[CFG_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/config.json", c->log.dir);
    char *json = config_to_json(c);
    if (write_file_atomic(path, json, strlen(json), err, sizeof err) != 0) fatal(EXIT_USAGE, "log.dir: %s", err);
    free(json);
    if (metrics_open(&r->metrics, c->log.dir, err, sizeof err) != 0) fatal(EXIT_USAGE, "%s", err);
    if (resume) {
        printf("resuming from %s (step %lld)\n", ckpt, r->state.step);
        metrics_write(&r->metrics, "resume", r->state.step, "path", 's', ckpt, NULL);
    }
}

static void close_run(Run *r) {
    metrics_close(&r->metrics);
    if (r->tok) tokenizer_free(r->tok);
    if (r->val) dataset_close(r->val);
    dataset_close(r->train);
    trainer_free(r->trainer);
    gpt_free(r->model);
    comm_close(r->comm);   // before the backend: NCCL works on its stream
    r->be->destroy(r->be);
}

static void run_eval(Run *r, long long step) {
    const Config *c = &r->cfg;
    const int B = c->train.batch_size, T = c->train.seq_len;
    // Every group evaluates its slice of each global batch of B x DP sequences.
    const int dp = r->cp.dp;
    long long n_batches = eval_batches(r->val, B * dp, T, c->log.eval_tokens);
    double t0 = now_seconds();
    double loss = eval_loss(r->model, r->val, B, T, n_batches, r->comm,
                            trainer_context_parallel(r->trainer));
    double floor = dataset_loss_floor(r->val);
    if (floor >= 0) printf("eval step %lld | val loss %.4f (task floor %.4f) | %.1f s\n", step, loss, floor, now_seconds() - t0);
    else printf("eval step %lld | val loss %.4f | %.1f s\n", step, loss, now_seconds() - t0);
    metrics_write(&r->metrics, "eval", step, "val_loss", 'd', loss, "tokens", 'i',
                  (long long)(n_batches * B * dp * T), "tokens_seen", 'i', r->state.tokens_seen,
                  NULL);
}

static void run_sample(Run *r, long long step) {
    int start = cli_start_token(r->tok);
    char *text = cli_sample_text(r->model, r->tok, &start, 1, r->cfg.log.sample_tokens, 1.0f, 0, &r->rng);
    printf("---- sample at step %lld ----\n%s\n----\n", step, text);
    metrics_write(&r->metrics, "sample", step, "text", 's', text, NULL);
    free(text);
}

// What either half of a checkpoint says when it fails.
__attribute__((noreturn)) static void checkpoint_failed(const Run *r, const char *err) {
    fatal(EXIT_RUNTIME, "checkpoint at step %lld failed: %s (older checkpoints are intact)",
          r->state.step, err);
}

// A checkpoint in two halves (trainer/checkpoint.h): begin starts writing the files, end
// writes the state as it is then (the RNG after a sample run between the two) and moves the
// checkpoint into place.
static CkptWrite *checkpoint_begin(Run *r) {
    char err[ERR_LEN];
    CkptWrite *w = checkpoint_save_begin(r->cfg.log.dir, r->model, trainer_optim_state(r->trainer),
                                         r->state.step, &r->cfg, r->comm, err, sizeof err);
    if (!w) checkpoint_failed(r, err);
    return w;
}

static void checkpoint_end(Run *r, CkptWrite *w) {
    char err[ERR_LEN], path[4096];
    TrainState *st = &r->state;
    st->scaler = *trainer_scaler(r->trainer);
    memcpy(st->rng, r->rng.s, sizeof st->rng);
    DatasetState ds = dataset_get_state(r->train);
    st->data[0] = ds.a, st->data[1] = ds.b, st->data[2] = ds.c;
    st->guard_loss_mean = r->guard.mean;
    if (checkpoint_save_end(w, st, r->cfg.log.keep_checkpoints, path, sizeof path, err, sizeof err) != 0)
        checkpoint_failed(r, err);
    printf("checkpoint %s\n", path);
    metrics_write(&r->metrics, "checkpoint", st->step, "path", 's', path, NULL);
    r->went_back = 0;
}

static void run_checkpoint(Run *r) { checkpoint_end(r, checkpoint_begin(r)); }

static uint64_t data_position(const Run *r) { return dataset_get_state(r->train).a; }

// Before step `step` (1-based): the data window the guard skips (see Run.skip_to).
static void skip_bad_data(Run *r, long long step) {
    if (!r->skip_to || data_position(r) != r->skip_from) return;
    DatasetState ds = dataset_get_state(r->train);
    ds.a = r->skip_to;
    dataset_set_state(r->train, ds);
    printf("step %lld: skipping the data of the diverged steps (stream index %llu to %llu)\n",
           step, (unsigned long long)r->skip_from, (unsigned long long)r->skip_to);
    metrics_write(&r->metrics, "skip_data", step, "from", 'i', (long long)r->skip_from,
                  "to", 'i', (long long)r->skip_to, NULL);
    r->skip_to = 0;
}

// The guard saw train.divergence_steps bad steps in a row, the last one `step`: back to the
// newest checkpoint, and the data those steps read will be skipped when the run reaches it
// again. A second divergence before the next checkpoint is written means the data is not the
// cause (an lr that is too high, a bug): the run stops instead of looping.
static void diverged(Run *r, long long step) {
    const Guard g = r->guard;
    if (r->went_back)
        fatal(EXIT_RUNTIME, "training diverged again (steps %lld to %lld: non-finite or spiking "
                            "loss) before a new checkpoint since the last time it went back: the "
                            "data is not the cause; lower optim.lr (or raise optim.warmup_steps, "
                            "lower optim.grad_clip)", g.first_step, step);
    const uint64_t bad_end = data_position(r);
    char path[4096];
    go_back(r, path, sizeof path);
    r->went_back = 1;
    const uint64_t resumed = data_position(r);
    r->skip_from = g.first_data > resumed ? g.first_data : resumed;
    r->skip_to = bad_end;
    printf("step %lld: %d bad step%s in a row since step %lld (non-finite, or a loss above %g x "
           "the running mean %.4f): back to %s (step %lld); the data of step%s %lld-%lld will be "
           "skipped\n", step, g.streak, g.streak == 1 ? "" : "s", g.first_step, g.factor, g.mean,
           path, r->state.step, g.streak == 1 ? "" : "s", g.first_step, step);
    metrics_write(&r->metrics, "divergence", step, "first_step", 'i', g.first_step, "bad_steps", 'i',
                  (long long)g.streak, "loss_mean", 'd', g.mean, "checkpoint", 's', path,
                  "resume_step", 'i', r->state.step, "skip_from", 'i', (long long)r->skip_from,
                  "skip_to", 'i', (long long)r->skip_to, NULL);
}

static int every(int n, long long step, long long total) { return (n > 0 && step % n == 0) || step == total; }

static int cmd_train(int argc, char **argv) {
    Run r;
    memset(&r, 0, sizeof r);
    char err[ERR_LEN];
    const char *device = NULL;
    cli_parse_train_args(argc, argv, &r.cfg, &device);
    if (launch_detect(&r.launch, err, sizeof err) != 0) fatal(EXIT_USAGE, "%s", err);
    stop_signals_install();
    open_run(&r, device);
    trainer_set_stop_poll(r.trainer, stop_requested);
    // The guard goes back to a checkpoint: a fresh run writes its step-0 one first.
    char newest[4096];
    if (r.cfg.train.divergence_steps > 0 && !checkpoint_find_latest(r.cfg.log.dir, newest, sizeof newest))
        run_checkpoint(&r);
    const Config *c = &r.cfg;
    const int world = r.launch.world, dp = r.cp.dp;
    const long long total = c->train.steps;
    const long long tokens_per_step =
        (long long)c->train.batch_size * c->train.seq_len * c->train.grad_accum * dp;
    if (world > 1)
        printf("data parallel: %d ranks (%s, %s collectives), each %s reads batch %d of every "
               "step\n", world, launch_kind_name(r.launch.kind), r.comm->name,
               r.cp.cp > 1 ? "group" : "rank", c->train.batch_size);
    if (r.cp.cp > 1)
        printf("context parallel: %d groups of %d ranks, each rank holds %d of the %d tokens of "
               "every sequence (ring attention)\n", dp, r.cp.cp, cp_local_len(c), c->train.seq_len);
    printf("model: %d layers, %d heads (%d kv), width %d, vocab %d, %.2fM parameters\n", c->model.n_layer,
           c->model.n_head, c->model.n_kv_head, c->model.n_embd, c->model.vocab_size,
           gpt_num_params(r.model) / 1e6);
    printf("training: %lld steps of %lld tokens (batch %d x seq %d x accum %d x %s %d), log.dir "
           "%s\n", total, tokens_per_step, c->train.batch_size, c->train.seq_len, c->train.grad_accum,
           r.cp.cp > 1 ? "groups" : "ranks", dp, c->log.dir);

    const double flops_per_step =
        cli_flops_per_token(c, gpt_num_params(r.model)) * (double)tokens_per_step;
    const double peak_flops = cli_peak_flops(r.be);
    double window_time = 0, run_time = 0, peak_gib = cli_gpu_memory_gib(r.be);
    const double wall0 = now_seconds();
    long long window_steps = 0, run_steps = 0;
    // Steps are launched without waiting for them (trainer_launch) and their numbers collected
    // when something must be said or decided: a progress line, an evaluation, a sample, a
    // checkpoint, a stop request (any rank's: the step's all-reduce carries it), the guard (every
    // step while it is on), a full queue. The collected steps are then reported one by one
    // exactly as if each had been waited for; their time is the collected span's mean. Every
    // rank collects at the same steps.
    StepStats done[TRAINER_MAX_PENDING];
    uint64_t data_before[TRAINER_MAX_PENDING];   // data position before each pending step
    double span0 = now_seconds();
    while (r.state.step < total) {
        const int pending = trainer_pending(r.trainer);
        const long long launch = r.state.step + pending + 1;   // 1-based
        skip_bad_data(&r, launch);
        data_before[pending] = data_position(&r);
        trainer_launch(r.trainer, launch - 1, next_batch, r.train);
        if (!(every(c->log.every, launch, total) || launch == 1 || c->train.divergence_steps > 0 ||
              trainer_stop_asked(r.trainer) || every(c->log.eval_every, launch, total) ||
              every(c->log.sample_every, launch, total) ||
              every(c->log.checkpoint_every, launch, total) ||
              trainer_pending(r.trainer) == TRAINER_MAX_PENDING))
            continue;
        const int n = trainer_collect(r.trainer, done);
        const double span1 = now_seconds(), dt = (span1 - span0) / n;
        span0 = span1;
        for (int i = 0; i < n; i++) {
            const StepStats s = done[i];
            r.state.step++;
            r.state.tokens_seen += tokens_per_step;
            window_time += dt, run_time += dt, window_steps++, run_steps++;
            const long long step = r.state.step;
            metrics_write(&r.metrics, "train", step, "loss", 'd', (double)s.loss, "lr", 'd', (double)s.lr,
                          "grad_norm", 'd', (double)s.grad_norm, "tokens_seen", 'i', r.state.tokens_seen,
                          "ms", 'd', dt * 1e3, "tok_per_s", 'd', tokens_per_step / dt, "skipped", 'i',
                          (long long)s.skipped, "loss_scale", 'd', (double)s.loss_scale, NULL);
            // The scale after this step is the next one's (or, for the last collected, the scaler's).
            if (s.skipped) printf("step %lld: non-finite gradients, step skipped (loss scale now %g)\n", step,
                                  i + 1 < n ? done[i + 1].loss_scale : trainer_scaler(r.trainer)->scale);
            if (every(c->log.every, step, total) || step == 1) {
                char eta[32];
                format_eta((double)(total - step) * run_time / run_steps, eta, sizeof eta);
                printf("step %6lld/%lld | loss %.4f | lr %.2e | norm %.3f | %.0f tok/s | %.1f ms", step,
                       total, s.loss, s.lr, s.grad_norm, tokens_per_step * window_steps / window_time,
                       1e3 * window_time / window_steps);
                const double gib = cli_gpu_memory_gib(r.be);
                if (gib > peak_gib) peak_gib = gib;
                if (peak_flops > 0)
                    printf(" | MFU %.1f%%",
                           100.0 * flops_per_step * window_steps / window_time / (peak_flops * world));
                if (gib >= 0) printf(" | mem %.2f GiB", peak_gib);
                printf(" | ETA %s\n", eta);
                fflush(stdout);
                window_time = 0, window_steps = 0;
            }
            if (guard_observe(&r.guard, step, &s, trainer_scaler(r.trainer)->dynamic, data_before[i])) {
                diverged(&r, step);
                break;   // the guard collects every step: nothing else was pending
            }
            // A stop request skips evaluation and samples: a preempted job has a grace period.
            const int stopping = s.stop && step < total;
            if (!stopping && r.val && every(c->log.eval_every, step, total)) run_eval(&r, step);
            // A checkpoint's files are written while the sample of the same step runs.
            CkptWrite *ckpt = stopping || every(c->log.checkpoint_every, step, total)
                                  ? checkpoint_begin(&r) : NULL;
            if (!stopping && r.launch.rank == 0 && every(c->log.sample_every, step, total))
                run_sample(&r, step);
            if (ckpt) checkpoint_end(&r, ckpt);
            if (stopping) {
                printf("stopped by a signal after step %lld of %lld: the checkpoint above holds the "
                       "run; the same command resumes it\n", step, total);
                metrics_write(&r.metrics, "stop", step, NULL);
                close_run(&r);
                return EXIT_STOPPED;
            }
        }
        span0 = now_seconds();   // evaluation, samples and checkpoints are not training time
    }
    printf("done: %lld steps, %.1f s of training (%.0f tok/s), %.1f s wall with evaluation, "
           "samples and checkpoints\n", r.state.step, run_time,
           run_steps ? tokens_per_step * run_steps / run_time : 0.0, now_seconds() - wall0);
    if (peak_gib >= 0) printf("peak GPU memory: %.2f GiB (the CUDA context included)\n", peak_gib);
    close_run(&r);
    return EXIT_OK;
}

// ----------------------------------------------------------------------------------------------

int main(int argc, char **argv) {
    if (argc < 2) {
        usage_main(stderr);
        return EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (cli_is_help(cmd)) {
        usage_main(stdout);
        return EXIT_OK;
    }
    if (strcmp(cmd, "train") == 0) return cmd_train(argc - 1, argv + 1);
    if (strcmp(cmd, "eval") == 0) return cli_eval_main(argc - 1, argv + 1);
    if (strcmp(cmd, "sample") == 0) return cli_sample_main(argc - 1, argv + 1);
    if (strcmp(cmd, "prepare") == 0) return cli_prepare_main(argc - 1, argv + 1);
    if (strcmp(cmd, "bench") == 0) return cli_bench_main(argc - 1, argv + 1);
    if (strcmp(cmd, "export") == 0) return cli_export_main(argc - 1, argv + 1);
    if (strcmp(cmd, "import") == 0) return cli_import_main(argc - 1, argv + 1);
    fprintf(stderr, "error: unknown command '%s'\n", cmd);
    usage_main(stderr);
    return EXIT_USAGE;
}
