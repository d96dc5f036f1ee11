// train_gpt: subcommand dispatch and the training loop. It composes the modules below and
// holds no kernel or model code of its own.
#include "common/check.h"       // defines: fatal, exit codes, checked host I/O
#include "common/config.h"      // defines: Config and the one table of config keys
#include "common/fileio.h"      // defines: atomic writes, mkdir_p
#include "common/metrics.h"     // defines: metrics.jsonl writer
#include "common/rng.h"         // defines: serialisable RNG
#include "common/timer.h"       // defines: now_seconds
#include "data/dataset.h"       // defines: shards and synthetic tasks behind one batch interface
#include "data/gpt2_bpe.h"      // defines: GPT-2 byte-level BPE (prompts of GPT-2-tokenized models)
#include "data/prepare.h"       // defines: the prepare subcommand
#include "data/tokenizer.h"     // defines: llm.c tokenizer files (decode samples)
#include "dist/comm.h"          // defines: collectives (single, MPI, NCCL) for data parallelism
#include "dist/launch.h"        // defines: torchrun / mpirun / srun detection
#include "model/backend.h"      // defines: the op set, cpu (and cuda) backends
#include "model/checkpoint.h"   // defines: checkpoint directories, resume
#include "model/generate.h"     // defines: sampling with the KV cache
#include "model/gpt.h"          // defines: the GPT-2 model over a backend
#include "model/interop.h"      // defines: export to Hugging Face, import from llm.c and Hugging Face
#include "model/train_step.h"   // defines: one optimizer step (accumulation, clipping, AdamW)

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define ERR_LEN 1024

// ----------------------------------------------------------------------------------------------
// shared helpers of the subcommands

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

static int is_help(const char *a) { return strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0; }

// The value after option argv[*i]; exits with EXIT_USAGE when it is missing.
static const char *opt_value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) fatal(EXIT_USAGE, "option %s needs a value", argv[*i]);
    return argv[++*i];
}

static long parse_long(const char *opt, const char *v, long lo, long hi) {
    char *end;
    long x = strtol(v, &end, 10);
    if (*v == '\0' || *end != '\0' || x < lo || x > hi)
        fatal(EXIT_USAGE, "%s: expected an integer in [%ld, %ld], got '%s'", opt, lo, hi, v);
    return x;
}

static double parse_double(const char *opt, const char *v, double lo, double hi) {
    char *end;
    double x = strtod(v, &end);
    if (*v == '\0' || *end != '\0' || !(x >= lo && x <= hi))
        fatal(EXIT_USAGE, "%s: expected a number in [%g, %g], got '%s'", opt, lo, hi, v);
    return x;
}

#ifdef FLASHGPT_CUDA
// precision.dtype (validated by the config table) as the backend's element type.
static DType dtype_of(const char *name) {
    if (strcmp(name, "fp32") == 0) return DTYPE_F32;
    if (strcmp(name, "fp16") == 0) return DTYPE_F16;
    return DTYPE_BF16;
}
#endif

// The value of --device, checked when it is parsed (before any data is opened).
static const char *device_arg(int argc, char **argv, int *i) {
    const char *v = opt_value(argc, argv, i);
    if (strcmp(v, "cpu") != 0 && strcmp(v, "cuda") != 0)
        fatal(EXIT_USAGE, "--device: expected cpu or cuda, got '%s'", v);
    return v;
}

#ifdef FLASHGPT_CUDA
// The GPU of a process with this local rank: the one GPU it sees when the launcher bound one per
// process (CUDA_VISIBLE_DEVICES, srun --gpus-per-task), else GPU local_rank of the host.
static int gpu_of(int local_rank) {
    const int n = backend_cuda_device_count();
    if (n <= 1 || local_rank == 0) return 0;
    if (local_rank >= n)
        fatal(EXIT_USAGE, "local rank %d has no GPU of its own: this host shows %d GPUs; launch at "
                          "most %d ranks per host", local_rank, n, n);
    return local_rank;
}
#endif

// --device cpu|cuda, or NULL for the default: cuda when this build has it and a GPU is present,
// else cpu with a notice. The cuda backend computes in `dtype` (precision.dtype) on the GPU of
// `local_rank` (the launch's rank on this host); the cpu backend is fp32 only and says so when
// another dtype was asked for.
static Backend *open_backend(const char *device, const char *dtype, int local_rank) {
    const int want_cuda = device && strcmp(device, "cuda") == 0;
#ifdef FLASHGPT_CUDA
    if (want_cuda || (!device && backend_cuda_device_count() > 0))
        return backend_cuda_create(dtype_of(dtype), gpu_of(local_rank));  // no GPU: exit 2
    if (!device) fprintf(stderr, "notice: no CUDA GPU found: running on the CPU backend (fp32)\n");
#else
    if (want_cuda)
        fatal(EXIT_USAGE, "--device cuda: this build has no CUDA backend (nvcc was not found when "
                          "it was built): rebuild with the CUDA toolkit, or use --device cpu");
    if (!device) fprintf(stderr, "notice: built without CUDA: running on the CPU backend (fp32)\n");
#endif
    if (strcmp(dtype, "fp32") != 0)
        fprintf(stderr, "notice: the CPU backend computes in fp32: precision.dtype = %s is "
                        "ignored\n", dtype);
    return backend_cpu_create();
}

static void next_batch(void *ctx, int *inputs, int *targets) { dataset_next(ctx, inputs, targets); }

// Batches of B x T that cover at most `tokens` tokens of d without reading a window twice
// (at least 1); synthetic data (0 tokens) is unbounded.
static long long eval_batches(const Dataset *d, int B, int T, long long tokens) {
    long long n = tokens / ((long long)B * T);
    long long avail = (long long)dataset_num_tokens(d);
    if (avail > 0 && n > (avail - 1) / T / B) n = (avail - 1) / T / B;
    return n < 1 ? 1 : n;
}

// Mean loss over the non-ignored targets of n_batches batches from the start of d, over every
// rank of comm (NULL: this process alone; each rank reads its slice of every batch).
static double eval_loss(GPT *m, Dataset *d, int B, int T, long long n_batches, Comm *comm) {
    int *in = xmalloc((size_t)B * T * sizeof(int)), *tg = xmalloc((size_t)B * T * sizeof(int));
    float *losses = xmalloc((size_t)B * T * sizeof(float));  // (B*T)
    double sum = 0;
    long long count = 0;
    dataset_rewind(d);
    gpt_set_training(m, 0);
    for (long long b = 0; b < n_batches; b++) {
        dataset_next(d, in, tg);
        gpt_forward(m, in, tg, B, T);
        gpt_losses_f32(m, losses);
        for (int i = 0; i < B * T; i++)
            if (tg[i] >= 0) sum += losses[i], count++;
    }
    gpt_set_training(m, 1);
    free(in);
    free(tg);
    free(losses);
    double sums[2] = {sum, (double)count};
    if (comm) comm->allreduce_host_f64(comm, sums, 2);
    return sums[1] > 0 ? sums[0] / sums[1] : NAN;
}

// Decodes ids into text (malloc'ed); ids print as <id> when there is no tokenizer.
static char *decode_text(const Tokenizer *tok, const int *ids, int n) {
    size_t cap = 256, len = 0;
    char *s = xmalloc(cap);
    for (int i = 0; i < n; i++) {
        char idbuf[24];
        const unsigned char *bytes = NULL;
        int blen = 0;
        if (tok) bytes = tokenizer_decode(tok, ids[i], &blen);
        if (!bytes) {
            blen = snprintf(idbuf, sizeof idbuf, "<%d>", ids[i]);
            bytes = (const unsigned char *)idbuf;
        }
        if (len + (size_t)blen + 1 > cap) s = xrealloc(s, cap = 2 * (len + (size_t)blen + 1));
        memcpy(s + len, bytes, (size_t)blen);
        len += (size_t)blen;
    }
    s[len] = '\0';
    return s;
}

// The first token of an unprompted sample: end-of-text, else newline, else 0.
static int start_token(const Tokenizer *tok) {
    if (!tok) return 0;
    if (tokenizer_eot(tok) >= 0) return tokenizer_eot(tok);
    int nl;
    return tokenizer_encode_simple(tok, "\n", &nl, 1) == 1 ? nl : 0;
}

static char *sample_text(GPT *m, const Tokenizer *tok, const int *prompt, int n_prompt, int n_new,
                         float temperature, int top_k, Rng *rng) {
    int *out = xmalloc((size_t)(n_new > 0 ? n_new : 1) * sizeof(int));
    int n = gpt_generate(m, prompt, n_prompt, n_new, temperature, top_k, rng, out);
    char *text = decode_text(tok, out, n);
    free(out);
    return text;
}

// Encodes a prompt with the model's tokenizer: GPT-2 BPE for a GPT-2 vocabulary (50257 tokens,
// end-of-text 50256), else one token per character or byte. Exits with EXIT_USAGE on failure.
static int *encode_prompt(const Tokenizer *tok, const char *prompt, int *n_out) {
    size_t len = strlen(prompt);
    if (tokenizer_vocab_size(tok) == 50257 && tokenizer_eot(tok) == GPT2_EOT) {
        char err[2048];
        Gpt2Bpe *bpe = gpt2_bpe_load_default(NULL, NULL, err, sizeof err);
        if (!bpe) fatal(EXIT_USAGE, "sample: the prompt needs GPT-2's BPE files: %s", err);
        int *ids = NULL;
        size_t n = 0, cap = 0;
        gpt2_bpe_encode(bpe, prompt, len, &ids, &n, &cap);
        gpt2_bpe_free(bpe);
        if (n == 0) fatal(EXIT_USAGE, "sample: the prompt encodes to no tokens");
        *n_out = (int)n;
        return ids;
    }
    int *ids = xmalloc((len + 1) * sizeof(int));
    long n = tokenizer_encode_simple(tok, prompt, ids, (long)len);
    if (n <= 0) fatal(EXIT_USAGE, "sample: the prompt has characters outside the model's vocabulary");
    *n_out = (int)n;
    return ids;
}

static Tokenizer *load_tokenizer_or_die(const char *path) {
    char err[ERR_LEN];
    Tokenizer *t = tokenizer_load(path, err, sizeof err);
    if (!t) fatal(EXIT_USAGE, "%s", err);
    return t;
}

static void format_eta(double seconds, char *buf, size_t n) {
    long s = (long)(seconds + 0.5);
    if (s >= 3600) snprintf(buf, n, "%ldh%02ldm", s / 3600, (s % 3600) / 60);
    else snprintf(buf, n, "%ldm%02lds", s / 60, s % 60);
}

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
} Run;

static void usage_train(FILE *f) {
    fprintf(f,
            "usage: train_gpt train -c CONFIG.json [--set key=value ...] [--device cpu|cuda]\n"
            "Trains a GPT. Resumes automatically from the newest complete checkpoint in log.dir.\n");
#ifdef FLASHGPT_CUDA
    const char *cuda = "available";
#else
    const char *cuda = "not available in this build";
#endif
    fprintf(f, "cpu backend: available; cuda backend: %s\n\n", cuda);
    config_print_help(f);
}

static void parse_train_args(int argc, char **argv, Config *c, const char **device) {
    char err[ERR_LEN];
    const char *config_path = NULL;
    config_defaults(c);
    for (int i = 1; i < argc; i++)
        if (is_help(argv[i])) usage_train(stdout), exit(EXIT_OK);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-c") == 0 || strcmp(argv[i], "--config") == 0) config_path = opt_value(argc, argv, &i);
        else if (strcmp(argv[i], "--set") == 0) opt_value(argc, argv, &i);
        else if (strcmp(argv[i], "--device") == 0) *device = device_arg(argc, argv, &i);
        else fatal(EXIT_USAGE, "train: unknown argument '%s' (train_gpt train --help)", argv[i]);
    }
    if (!config_path) fatal(EXIT_USAGE, "train: -c CONFIG.json is required (see configs/)");
    if (config_load_file(c, config_path, err, sizeof err) != 0) fatal(EXIT_USAGE, "%s", err);
    // --set overrides apply after the file, in order (values were checked for presence above).
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--set") == 0) {
            if (config_set(c, argv[++i], err, sizeof err) != 0) fatal(EXIT_USAGE, "%s", err);
        } else if (strcmp(argv[i], "-c") == 0 || strcmp(argv[i], "--config") == 0 ||
                   strcmp(argv[i], "--device") == 0) {
            i++;
        }
    }
    if (config_validate(c, err, sizeof err) != 0) fatal(EXIT_USAGE, "%s: %s", config_path, err);
}

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

// Opens everything a run needs. All input is validated (data, tokenizer, model, a checkpoint to
// resume from) before anything is written into log.dir.
// With several ranks (r->launch) every rank runs this; each reads its slice of every batch, and
// only rank 0 writes into log.dir (and prints: the other ranks' stdout is closed).
static void open_run(Run *r, const char *device) {
    char err[ERR_LEN];
    Config *c = &r->cfg;
    const int B = c->train.batch_size, T = c->train.seq_len;
    const int rank = r->launch.rank, world = r->launch.world;
    r->train = dataset_open(c, SPLIT_TRAIN, B, T, rank, world, err, sizeof err);
    if (!r->train) fatal(EXIT_USAGE, "%s", err);
    r->val = NULL;
    if (strcmp(c->data.synthetic, "none") != 0 || c->data.val[0]) {
        r->val = dataset_open(c, SPLIT_VAL, B, T, rank, world, err, sizeof err);
        if (!r->val) fatal(EXIT_USAGE, "%s", err);
    } else {
        fprintf(stderr, "notice: data.val is empty: no evaluation\n");
    }
    r->tok = c->data.tokenizer[0] ? load_tokenizer_or_die(c->data.tokenizer) : NULL;

    // Each rank binds the GPU of its local rank.
    r->be = open_backend(device, c->precision.dtype, r->launch.local_rank);
    const int on_gpu = strcmp(r->be->name, "cuda") == 0;
    void *stream = NULL;
#ifdef FLASHGPT_CUDA
    if (on_gpu) stream = backend_cuda_stream(r->be);
#endif
    r->comm = comm_open(&r->launch, on_gpu ? COMM_DEVICE : COMM_HOST, stream, err, sizeof err);
    if (!r->comm) fatal(EXIT_USAGE, "%s", err);
    // Every rank starts from the same weights (the same seed) and sees the same checkpoints.
    GPTConfig gc = gpt_config_from(c);
    r->model = gpt_create(&gc, r->be, B, T, c);
    if (on_gpu) probe_device(r->model, B, T);
    r->trainer = trainer_create_dist(r->model, c, r->comm);
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
        Config saved;
        if (checkpoint_read_config(ckpt, &saved, err, sizeof err) != 0) fatal(EXIT_USAGE, "%s", err);
        if (config_same_model(c, &saved, err, sizeof err) != 0)
            fatal(EXIT_USAGE, "cannot resume from '%s': %s; use another log.dir or the same model", ckpt, err);
        if (checkpoint_load(ckpt, r->model, trainer_optim_state(r->trainer), &r->state, err,
                            sizeof err) != 0)
            fatal(EXIT_USAGE, "%s", err);
        trainer_optim_state_commit(r->trainer);
        if (r->state.world_size != world && rank == 0)
            fprintf(stderr, "notice: '%s' was written by %d ranks, this run has %d: the optimizer "
                            "shards are re-cut, and the data continues at the same window\n",
                    ckpt, r->state.world_size, world);
        r->state.world_size = world;
        *trainer_scaler(r->trainer) = r->state.scaler;
        memcpy(r->rng.s, r->state.rng, sizeof r->rng.s);
        DatasetState ds = {r->state.data[0], r->state.data[1], r->state.data[2]};
        dataset_set_state(r->train, ds);
    } else {
        float *host = xmalloc(gpt_num_params(r->model) * sizeof(float));
        gpt_init_weights_host(r->model, host, (uint64_t)c->train.seed);
        trainer_set_weights_f32(r->trainer, host);
        free(host);
    }

    if (rank != 0) {
        // Rank 0 reports for all; the others keep stderr for their own errors.
        if (!freopen("/dev/null", "w", stdout))
            fatal(EXIT_RUNTIME, "rank %d: cannot close stdout", rank);
        return;
    }
    if (mkdir_p(c->log.dir, err, sizeof err) != 0) fatal(EXIT_USAGE, "log.dir: %s", err);
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
    // Every rank evaluates its slice of each global batch of B x world sequences.
    const int world = r->launch.world;
    long long n_batches = eval_batches(r->val, B * world, T, c->log.eval_tokens);
    double t0 = now_seconds();
    double loss = eval_loss(r->model, r->val, B, T, n_batches, r->comm);
    double floor = dataset_loss_floor(r->val);
    if (floor >= 0) printf("eval step %lld | val loss %.4f (task floor %.4f) | %.1f s\n", step, loss, floor, now_seconds() - t0);
    else printf("eval step %lld | val loss %.4f | %.1f s\n", step, loss, now_seconds() - t0);
    metrics_write(&r->metrics, "eval", step, "val_loss", 'd', loss, "tokens", 'i',
                  (long long)(n_batches * B * world * T), "tokens_seen", 'i', r->state.tokens_seen,
                  NULL);
}

static void run_sample(Run *r, long long step) {
    int start = start_token(r->tok);
    char *text = sample_text(r->model, r->tok, &start, 1, r->cfg.log.sample_tokens, 1.0f, 0, &r->rng);
    printf("---- sample at step %lld ----\n%s\n----\n", step, text);
    metrics_write(&r->metrics, "sample", step, "text", 's', text, NULL);
    free(text);
}

static void run_checkpoint(Run *r) {
    char err[ERR_LEN], path[4096];
    TrainState *st = &r->state;
    st->scaler = *trainer_scaler(r->trainer);
    memcpy(st->rng, r->rng.s, sizeof st->rng);
    DatasetState ds = dataset_get_state(r->train);
    st->data[0] = ds.a, st->data[1] = ds.b, st->data[2] = ds.c;
    if (checkpoint_save_dist(r->cfg.log.dir, r->model, trainer_optim_state(r->trainer), st,
                             &r->cfg, r->cfg.log.keep_checkpoints, r->comm, path, sizeof path, err,
                             sizeof err) != 0)
        fatal(EXIT_RUNTIME, "checkpoint at step %lld failed: %s (older checkpoints are intact)", st->step, err);
    printf("checkpoint %s\n", path);
    metrics_write(&r->metrics, "checkpoint", st->step, "path", 's', path, NULL);
}

// Dense bf16 peak of one H200 (NVIDIA's datasheet, without sparsity): the MFU denominator.
#define PEAK_FLOPS 989e12

// Model FLOPs per training token (forward + backward = 3x forward, recomputation not counted):
// 6 per parameter (one multiply-add each, forward; the embedding tables counted as llm.c and
// nanoGPT do), plus attention scores and the weighted sum, 2 * 2 * T * C per token and layer over
// the full square, halved by the causal mask: 6 * L * T * C.
static double flops_per_token(const Config *c, size_t n_params) {
    const double attn = 6.0 * c->model.n_layer * (double)c->train.seq_len * c->model.n_embd;
    return 6.0 * (double)n_params + attn;
}

// GPU memory in use (GiB; the CUDA context included), or -1 on the CPU. The model, optimizer and
// workspaces are allocated up front and kept, so after the first step this is the peak.
static double gpu_memory_gib(Backend *be) {
#ifdef FLASHGPT_CUDA
    if (strcmp(be->name, "cuda") == 0) {
        size_t free_b, used_b;
        backend_cuda_memory(be, &free_b, &used_b);
        return used_b / 1073741824.0;
    }
#endif
    return -1.0;
}

static int every(int n, long long step, long long total) { return (n > 0 && step % n == 0) || step == total; }

static int cmd_train(int argc, char **argv) {
    Run r;
    memset(&r, 0, sizeof r);
    char err[ERR_LEN];
    const char *device = NULL;
    parse_train_args(argc, argv, &r.cfg, &device);
    if (launch_detect(&r.launch, err, sizeof err) != 0) fatal(EXIT_USAGE, "%s", err);
    open_run(&r, device);
    const Config *c = &r.cfg;
    const int world = r.launch.world;
    const long long total = c->train.steps;
    const long long tokens_per_step =
        (long long)c->train.batch_size * c->train.seq_len * c->train.grad_accum * world;
    if (world > 1)
        printf("data parallel: %d ranks (%s, %s collectives), each reads batch %d of every step\n",
               world, launch_kind_name(r.launch.kind), r.comm->name, c->train.batch_size);
    printf("model: %d layers, %d heads (%d kv), width %d, vocab %d, %.2fM parameters\n", c->model.n_layer,
           c->model.n_head, c->model.n_kv_head, c->model.n_embd, c->model.vocab_size,
           gpt_num_params(r.model) / 1e6);
    printf("training: %lld steps of %lld tokens (batch %d x seq %d x accum %d x ranks %d), log.dir "
           "%s\n", total, tokens_per_step, c->train.batch_size, c->train.seq_len, c->train.grad_accum,
           world, c->log.dir);

    const double flops_per_step =
        flops_per_token(c, gpt_num_params(r.model)) * (double)tokens_per_step;
    double window_time = 0, run_time = 0, peak_gib = gpu_memory_gib(r.be);
    const double wall0 = now_seconds();
    long long window_steps = 0, run_steps = 0;
    while (r.state.step < total) {
        double t0 = now_seconds();
        StepStats s = trainer_step(r.trainer, r.state.step, next_batch, r.train);
        double dt = now_seconds() - t0;
        r.state.step++;
        r.state.tokens_seen += tokens_per_step;
        window_time += dt, run_time += dt, window_steps++, run_steps++;
        const long long step = r.state.step;
        metrics_write(&r.metrics, "train", step, "loss", 'd', (double)s.loss, "lr", 'd', (double)s.lr,
                      "grad_norm", 'd', (double)s.grad_norm, "tokens_seen", 'i', r.state.tokens_seen,
                      "ms", 'd', dt * 1e3, "tok_per_s", 'd', tokens_per_step / dt, "skipped", 'i',
                      (long long)s.skipped, "loss_scale", 'd', (double)s.loss_scale, NULL);
        if (s.skipped) printf("step %lld: non-finite gradients, step skipped (loss scale now %g)\n", step,
                              trainer_scaler(r.trainer)->scale);
        if (every(c->log.every, step, total) || step == 1) {
            char eta[32];
            format_eta((double)(total - step) * run_time / run_steps, eta, sizeof eta);
            printf("step %6lld/%lld | loss %.4f | lr %.2e | norm %.3f | %.0f tok/s | %.1f ms", step,
                   total, s.loss, s.lr, s.grad_norm, tokens_per_step * window_steps / window_time,
                   1e3 * window_time / window_steps);
            const double gib = gpu_memory_gib(r.be);
            if (gib > peak_gib) peak_gib = gib;
            if (gib >= 0)
                printf(" | MFU %.1f%% | mem %.2f GiB",
                       100.0 * flops_per_step * window_steps / window_time / (PEAK_FLOPS * world),
                       peak_gib);
            printf(" | ETA %s\n", eta);
            fflush(stdout);
            window_time = 0, window_steps = 0;
        }
        if (r.val && every(c->log.eval_every, step, total)) run_eval(&r, step);
        if (r.launch.rank == 0 && every(c->log.sample_every, step, total)) run_sample(&r, step);
        if (every(c->log.checkpoint_every, step, total)) run_checkpoint(&r);
    }
    printf("done: %lld steps, %.1f s of training (%.0f tok/s), %.1f s wall with evaluation, "
           "samples and checkpoints\n", r.state.step, run_time,
           run_steps ? tokens_per_step * run_steps / run_time : 0.0, now_seconds() - wall0);
    if (peak_gib >= 0) printf("peak GPU memory: %.2f GiB (the CUDA context included)\n", peak_gib);
    close_run(&r);
    return EXIT_OK;
}

// ----------------------------------------------------------------------------------------------
// eval and sample: a model rebuilt from a checkpoint alone

// Reads the run config of checkpoint `dir` into c and opens the backend in its precision.dtype.
static Backend *open_checkpoint(const char *dir, Config *c, const char *device) {
    char err[ERR_LEN];
    if (!is_dir(dir)) fatal(EXIT_USAGE, "--checkpoint '%s' is not a directory", dir);
    if (checkpoint_read_config(dir, c, err, sizeof err) != 0) fatal(EXIT_USAGE, "%s", err);
    return open_backend(device, c->precision.dtype, 0);
}

// The model of checkpoint `dir` (config c from open_checkpoint) on be, for batches up to B x T.
static GPT *load_checkpoint_model(const char *dir, const Config *c, Backend *be, int B, int T) {
    char err[ERR_LEN];
    GPTConfig gc = gpt_config_from(c);
    GPT *m = gpt_create(&gc, be, B, T, c);
    if (checkpoint_load(dir, m, NULL, NULL, err, sizeof err) != 0) fatal(EXIT_USAGE, "%s", err);
    return m;
}

static int cmd_eval(int argc, char **argv) {
    const char *ckpt = NULL, *data = NULL, *device = NULL;
    long long tokens = 0;
    for (int i = 1; i < argc; i++) {
        if (is_help(argv[i])) {
            printf("usage: train_gpt eval --checkpoint DIR --data SHARD_PATTERN [--tokens N] [--device cpu|cuda]\n"
                   "Prints val_loss: the mean token cross-entropy over the whole data (or its first N tokens),\n"
                   "read as windows of the checkpoint's train.seq_len (a tail shorter than a window is skipped).\n");
            return EXIT_OK;
        }
        if (strcmp(argv[i], "--checkpoint") == 0) ckpt = opt_value(argc, argv, &i);
        else if (strcmp(argv[i], "--data") == 0) data = opt_value(argc, argv, &i);
        else if (strcmp(argv[i], "--tokens") == 0) tokens = parse_long("--tokens", opt_value(argc, argv, &i), 1, 1L << 62);
        else if (strcmp(argv[i], "--device") == 0) device = device_arg(argc, argv, &i);
        else fatal(EXIT_USAGE, "eval: unknown argument '%s' (train_gpt eval --help)", argv[i]);
    }
    if (!ckpt || !data) fatal(EXIT_USAGE, "eval: --checkpoint DIR and --data SHARD_PATTERN are required");
    Config c;
    char err[ERR_LEN];
    Backend *be = open_checkpoint(ckpt, &c, device);
    const int B = c.train.batch_size, T = c.train.seq_len;
    GPT *m = load_checkpoint_model(ckpt, &c, be, B, T);
    snprintf(c.data.val, sizeof c.data.val, "%s", data);
    snprintf(c.data.synthetic, sizeof c.data.synthetic, "none");
    Dataset *d = dataset_open(&c, SPLIT_VAL, B, T, 0, 1, err, sizeof err);
    if (!d) fatal(EXIT_USAGE, "%s", err);
    long long n_batches = eval_batches(d, B, T, tokens > 0 ? tokens : (long long)dataset_num_tokens(d));
    printf("val_loss: %.6f\n", eval_loss(m, d, B, T, n_batches, NULL));
    dataset_close(d);
    gpt_free(m);
    be->destroy(be);
    return EXIT_OK;
}

static int cmd_sample(int argc, char **argv) {
    const char *ckpt = NULL, *prompt = NULL, *device = NULL;
    long n_new = 256, top_k = 0, seed = 1337;
    double temperature = 1.0;
    for (int i = 1; i < argc; i++) {
        if (is_help(argv[i])) {
            printf("usage: train_gpt sample --checkpoint DIR [--prompt TEXT] [--tokens N] [--temperature T]\n"
                   "                        [--top-k K] [--seed S] [--device cpu|cuda]\n"
                   "Generates text with a KV cache (each new token costs one position). Defaults: 256 tokens,\n"
                   "temperature 1.0 (0 = greedy), top-k off, seed 1337.\n");
            return EXIT_OK;
        }
        if (strcmp(argv[i], "--checkpoint") == 0) ckpt = opt_value(argc, argv, &i);
        else if (strcmp(argv[i], "--prompt") == 0) prompt = opt_value(argc, argv, &i);
        else if (strcmp(argv[i], "--tokens") == 0) n_new = parse_long("--tokens", opt_value(argc, argv, &i), 0, 1L << 30);
        else if (strcmp(argv[i], "--temperature") == 0) temperature = parse_double("--temperature", opt_value(argc, argv, &i), 0, 100);
        else if (strcmp(argv[i], "--top-k") == 0) top_k = parse_long("--top-k", opt_value(argc, argv, &i), 0, 1L << 30);
        else if (strcmp(argv[i], "--seed") == 0) seed = parse_long("--seed", opt_value(argc, argv, &i), 0, 1L << 62);
        else if (strcmp(argv[i], "--device") == 0) device = device_arg(argc, argv, &i);
        else fatal(EXIT_USAGE, "sample: unknown argument '%s' (train_gpt sample --help)", argv[i]);
    }
    if (!ckpt) fatal(EXIT_USAGE, "sample: --checkpoint DIR is required");
    Config c;
    Backend *be = open_checkpoint(ckpt, &c, device);
    GPT *m = load_checkpoint_model(ckpt, &c, be, 1, 1);
    char tok_path[4096];
    snprintf(tok_path, sizeof tok_path, "%s/tokenizer.bin", ckpt);
    Tokenizer *tok = path_exists(tok_path) ? load_tokenizer_or_die(tok_path)
                     : c.data.tokenizer[0] ? load_tokenizer_or_die(c.data.tokenizer) : NULL;
    int n_prompt = 1;
    int *ids = xmalloc(sizeof(int));
    ids[0] = start_token(tok);
    if (prompt && *prompt) {
        if (!tok) fatal(EXIT_USAGE, "sample: --prompt needs a tokenizer, and the checkpoint has none");
        free(ids);
        ids = encode_prompt(tok, prompt, &n_prompt);
    }
    Rng rng;
    rng_seed(&rng, (uint64_t)seed);
    char *head = decode_text(tok, ids, n_prompt);
    char *text = sample_text(m, tok, ids, n_prompt, (int)n_new, (float)temperature, (int)top_k, &rng);
    printf("%s%s\n", prompt ? head : "", text);
    free(head);
    free(text);
    free(ids);
    if (tok) tokenizer_free(tok);
    gpt_free(m);
    be->destroy(be);
    return EXIT_OK;
}

// ----------------------------------------------------------------------------------------------
// bench: training-step throughput of a config on random tokens

static void random_batch(void *ctx, int *inputs, int *targets) {
    const int *dims = ctx;  // {B, T, V, seed}
    Rng r;
    rng_seed(&r, (uint64_t)dims[3]);
    for (int i = 0; i < dims[0] * dims[1]; i++) inputs[i] = (int)rng_below(&r, (uint64_t)dims[2]);
    for (int i = 0; i < dims[0] * dims[1]; i++) targets[i] = (int)rng_below(&r, (uint64_t)dims[2]);
}

static int cmd_bench(int argc, char **argv) {
    Config c;
    const char *device = NULL;
    long steps = 5;
    int n = 0;
    char **rest = xmalloc((size_t)(argc + 1) * sizeof(char *));
    rest[n++] = argv[0];
    for (int i = 1; i < argc; i++) {
        if (is_help(argv[i])) {
            printf("usage: train_gpt bench -c CONFIG.json [--set key=value ...] [--steps N] [--device cpu|cuda]\n"
                   "Times N training steps (after one warm-up step) of the config's model on random tokens\n"
                   "and prints ms/step and tokens/s. No data, logs or checkpoints are touched.\n");
            return EXIT_OK;
        }
        if (strcmp(argv[i], "--steps") == 0) steps = parse_long("--steps", opt_value(argc, argv, &i), 1, 1000000);
        else rest[n++] = argv[i];
    }
    parse_train_args(n, rest, &c, &device);
    free(rest);
    Backend *be = open_backend(device, c.precision.dtype, 0);
    GPTConfig gc = gpt_config_from(&c);
    const int B = c.train.batch_size, T = c.train.seq_len;
    GPT *m = gpt_create(&gc, be, B, T, &c);
    Trainer *t = trainer_create(m, &c);
    float *host = xmalloc(gpt_num_params(m) * sizeof(float));
    gpt_init_weights_host(m, host, (uint64_t)c.train.seed);
    trainer_set_weights_f32(t, host);
    free(host);
    int dims[4] = {B, T, c.model.vocab_size, (int)c.train.seed};
    trainer_step(t, 0, random_batch, dims);
    be->synchronize(be);
    double t0 = now_seconds();
    for (long s = 0; s < steps; s++) trainer_step(t, s + 1, random_batch, dims);
    be->synchronize(be);
    double dt = (now_seconds() - t0) / (double)steps;
    double tokens = (double)B * T * c.train.grad_accum;
    printf("bench: %s backend (%s), %.2fM parameters, batch %d x seq %d x accum %d: %.1f ms/step, "
           "%.0f tokens/s", be->name, dtype_name(be->dtype), gpt_num_params(m) / 1e6, B, T,
           c.train.grad_accum, dt * 1e3, tokens / dt);
    const double gib = gpu_memory_gib(be);
    if (gib >= 0)
        printf(", MFU %.1f%%, GPU memory %.2f GiB",
               100.0 * flops_per_token(&c, gpt_num_params(m)) * tokens / dt / PEAK_FLOPS, gib);
    printf("\n");
    trainer_free(t);
    gpt_free(m);
    be->destroy(be);
    return EXIT_OK;
}

// ----------------------------------------------------------------------------------------------

int main(int argc, char **argv) {
    if (argc < 2) {
        usage_main(stderr);
        return EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (is_help(cmd)) {
        usage_main(stdout);
        return EXIT_OK;
    }
    if (strcmp(cmd, "train") == 0) return cmd_train(argc - 1, argv + 1);
    if (strcmp(cmd, "eval") == 0) return cmd_eval(argc - 1, argv + 1);
    if (strcmp(cmd, "sample") == 0) return cmd_sample(argc - 1, argv + 1);
    if (strcmp(cmd, "prepare") == 0) return prepare_main(argc - 1, argv + 1);
    if (strcmp(cmd, "bench") == 0) return cmd_bench(argc - 1, argv + 1);
    if (strcmp(cmd, "export") == 0) return export_main(argc - 1, argv + 1);
    if (strcmp(cmd, "import") == 0) return import_main(argc - 1, argv + 1);
    fprintf(stderr, "error: unknown command '%s'\n", cmd);
    usage_main(stderr);
    return EXIT_USAGE;
}
