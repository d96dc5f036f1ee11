// cli/common: what the subcommands share: option parsing, the choice of backend, evaluation
// over a dataset, text decoding and prompt encoding, models rebuilt from checkpoints, FLOP and
// memory accounting for the progress lines.
#include "cli/cli.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/fileio.h"
#include "data/gpt2_bpe.h"
#include "trainer/checkpoint.h"
#include "model/generate.h"
#include "model/sparse_lists.h"

int cli_is_help(const char *a) { return strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0; }

int cli_has_help(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (cli_is_help(argv[i])) return 1;
    return 0;
}

// The value after option argv[*i]; exits with EXIT_USAGE when it is missing.
const char *cli_opt_value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) fatal(EXIT_USAGE, "option %s needs a value", argv[*i]);
    return argv[++*i];
}

long cli_parse_long(const char *opt, const char *v, long lo, long hi) {
    char *end;
    long x = strtol(v, &end, 10);
    if (*v == '\0' || *end != '\0' || x < lo || x > hi)
        fatal(EXIT_USAGE, "%s: expected an integer in [%ld, %ld], got '%s'", opt, lo, hi, v);
    return x;
}

double cli_parse_double(const char *opt, const char *v, double lo, double hi) {
    char *end;
    double x = strtod(v, &end);
    if (*v == '\0' || *end != '\0' || !(x >= lo && x <= hi))
        fatal(EXIT_USAGE, "%s: expected a number in [%g, %g], got '%s'", opt, lo, hi, v);
    return x;
}

// The value of --device, checked when it is parsed (before any data is opened).
const char *cli_device_arg(int argc, char **argv, int *i) {
    const char *v = cli_opt_value(argc, argv, i);
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

// Whether --device (NULL: not given) opens the CUDA backend: cuda, or no choice and a GPU found.
static int picks_cuda(const char *device) {
    if (device) return strcmp(device, "cuda") == 0;
#ifdef FLASHGPT_CUDA
    return backend_cuda_device_count() > 0;
#else
    return 0;
#endif
}

// --device cpu|cuda, or NULL for the default: cuda when this build has it and a GPU is present,
// else cpu with a notice. The cuda backend computes in `dtype` (precision.dtype) on the GPU of
// `local_rank` (the launch's rank on this host); the cpu backend is fp32 only and says so when
// another dtype was asked for.
Backend *cli_open_backend(const char *device, DType dtype, AttnKernel kernel, int local_rank) {
#ifdef FLASHGPT_CUDA
    if (picks_cuda(device))
        return backend_cuda_create(dtype, gpu_of(local_rank), kernel);  // no GPU: exit 2
    if (!device) fprintf(stderr, "notice: no CUDA GPU found: running on the CPU backend (fp32)\n");
#else
    if (picks_cuda(device))
        fatal(EXIT_USAGE, "--device cuda: this build has no CUDA backend (nvcc was not found when "
                          "it was built): rebuild with the CUDA toolkit, or use --device cpu");
    if (!device) fprintf(stderr, "notice: built without CUDA: running on the CPU backend (fp32)\n");
#endif
    if (dtype != DTYPE_F32)
        fprintf(stderr, "notice: the CPU backend computes in fp32: precision.dtype = %s is "
                        "ignored\n", dtype_name(dtype));
    return backend_cpu_create();
}


// The communicator of launch li for the backend's memory: NCCL on the CUDA backend's stream, MPI
// (or the single process) on the CPU. A launch this build cannot serve exits 2 with the reason.
Comm *cli_open_comm(const LaunchInfo *li, Backend *be, const Config *cfg) {
    char err[ERR_LEN];
    Comm *c = comm_open(li, be->device, be->stream, comm_timeout(cfg->dist.timeout), err,
                        sizeof err);
    if (!c) fatal(EXIT_USAGE, "%s", err);
    return c;
}

// Decodes ids into text (malloc'ed); ids print as <id> when there is no tokenizer.
char *cli_decode_text(const Tokenizer *tok, const int *ids, int n) {
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
int cli_start_token(const Tokenizer *tok) {
    if (!tok) return 0;
    if (tokenizer_eot(tok) >= 0) return tokenizer_eot(tok);
    int nl;
    return tokenizer_encode_simple(tok, "\n", &nl, 1) == 1 ? nl : 0;
}

char *cli_sample_text(GPT *m, const Tokenizer *tok, const int *prompt, int n_prompt, int n_new,
                         float temperature, int top_k, Rng *rng) {
    // A cache of the positions this sample feeds, not max_seq_len's (which a long-context
    // run could not hold beside its training state); later samples of the same length reuse it.
    const long want = (long)n_prompt + n_new;
    const int maxT = gpt_cfg(m)->maxT, positions = want < maxT ? (int)want : maxT;
    char err[ERR_LEN];
    if (gpt_decode_reserve(m, 1, positions, err, sizeof err) != 0) fatal(EXIT_USAGE, "sample: %s", err);
    int *out = xmalloc((size_t)(n_new > 0 ? n_new : 1) * sizeof(int));
    int n = gpt_generate(m, prompt, n_prompt, n_new, temperature, top_k, rng, out);
    char *text = cli_decode_text(tok, out, n);
    free(out);
    return text;
}

// Encodes a prompt with the model's tokenizer: GPT-2 BPE for a GPT-2 vocabulary (50257 tokens,
// end-of-text 50256), else one token per character or byte. Exits with EXIT_USAGE on failure.
int *cli_encode_prompt(const Tokenizer *tok, const char *prompt, int *n_out) {
    size_t len = strlen(prompt);
    if (tokenizer_vocab_size(tok) == 50257 && tokenizer_eot(tok) == GPT2_EOT) {
        char err[2048];
        Gpt2Bpe *bpe = gpt2_bpe_load_default(NULL, NULL, err, sizeof err);
        if (!bpe) fatal(EXIT_USAGE, "sample: the prompt needs GPT-2's BPE files: %s", err);
        int *ids = NULL;
        size_t n = 0, cap = 0;
        const int rc = gpt2_bpe_encode(bpe, prompt, len, &ids, &n, &cap, err, sizeof err);
        gpt2_bpe_free(bpe);
        if (rc != 0) fatal(EXIT_USAGE, "sample: the prompt: %s", err);
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

Tokenizer *cli_load_tokenizer(const char *path) {
    char err[ERR_LEN];
    Tokenizer *t = tokenizer_load(path, err, sizeof err);
    if (!t) fatal(EXIT_USAGE, "%s", err);
    return t;
}

Tokenizer *cli_checkpoint_tokenizer(const char *dir, const Config *c) {
    char path[4096], err[ERR_LEN];
    snprintf(path, sizeof path, "%s/tokenizer.bin", dir);
    if (path_exists(path) && checkpoint_verify_file(dir, "tokenizer.bin", err, sizeof err) != 0)
        fatal(EXIT_USAGE, "%s", err);
    return path_exists(path) ? cli_load_tokenizer(path) : c->data.tokenizer[0] ? cli_load_tokenizer(c->data.tokenizer)
                                                                               : NULL;
}

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

void cli_parse_train_args(int argc, char **argv, Config *c, const char **device) {
    char err[ERR_LEN];
    const char *config_path = NULL;
    config_defaults(c);
    if (cli_has_help(argc, argv)) usage_train(stdout), exit(EXIT_OK);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-c") == 0 || strcmp(argv[i], "--config") == 0) config_path = cli_opt_value(argc, argv, &i);
        else if (strcmp(argv[i], "--set") == 0) cli_opt_value(argc, argv, &i);
        else if (strcmp(argv[i], "--device") == 0) *device = cli_device_arg(argc, argv, &i);
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
    // fp32 on the GPU runs the naive attention, whose backward has no sum over key chunks.
    if (c->dist.context_parallel > 1 && c->precision.dtype == DTYPE_F32 && picks_cuda(*device))
        fatal(EXIT_USAGE, "%s: dist.context_parallel = %d on the GPU needs precision.dtype = bf16 or "
                          "fp16: fp32 runs the naive attention there, which has no ring backward; "
                          "use --device cpu for an fp32 ring", config_path, c->dist.context_parallel);
}

// The share of the causal square's blocks that the attention of the layers reads, averaged over
// the layers: 1 when dense; with attention.sparse, its layers (attention.sparse_every) read the
// present blocks of the causal block lists out of the n (n + 1) / 2 of the causal square.
static double attention_share(const Config *c) {
    if (c->attention.sparse == ATTN_SPARSE_NONE) return 1.0;
    const AttnSparseSpec spec = sparse_lists_spec(c);
    AttnBlockMask m;
    char err[ERR_LEN];
    const int T = c->train.seq_len;
    if (attn_block_mask_build(&m, &spec, T, T, 1, err, sizeof err) != 0) return 1.0;  // config_validate checked it
    const double square = (double)m.n_qb * (m.n_qb + 1) / 2.0, share = m.nnz / square;
    attn_block_mask_free(&m);
    const int L = c->model.n_layer, every = c->attention.sparse_every > 0 ? c->attention.sparse_every : 1;
    const int sparse_layers = (L + every - 1) / every;  // layers l with l % every == 0
    return ((L - sparse_layers) + sparse_layers * share) / L;
}

// Model FLOPs per training token (forward + backward = 3x forward, recomputation not counted):
// 6 per parameter (one multiply-add each, forward; the embedding tables counted as llm.c and
// nanoGPT do), plus attention scores and the weighted sum, 2 * 2 * T * C per token and layer over
// the full square, halved by the causal mask: 6 * L * T * C, times the share of it a block-sparse
// attention reads (attention_share).
double cli_flops_per_token(const Config *c, size_t n_params) {
    const double attn = 6.0 * c->model.n_layer * (double)c->train.seq_len * c->model.n_embd;
    return 6.0 * (double)n_params + attn * attention_share(c);
}

// GPU memory in use (GiB; the CUDA context included), or -1 on the CPU. The model, optimizer and
// workspaces are allocated up front and kept, so after the first step this is the peak.
double cli_gpu_memory_gib(Backend *be) {
    size_t free_b, used_b;
    return be->memory(be, &free_b, &used_b) ? used_b / 1073741824.0 : -1.0;
}

// Reads the run config of checkpoint `dir` into c and opens the backend in its precision.dtype.
Backend *cli_open_checkpoint(const char *dir, Config *c, const char *device) {
    char err[ERR_LEN];
    if (!is_dir(dir)) fatal(EXIT_USAGE, "--checkpoint '%s' is not a directory", dir);
    if (checkpoint_read_config(dir, c, err, sizeof err) != 0) fatal(EXIT_USAGE, "%s", err);
    return cli_open_backend(device, c->precision.dtype, (AttnKernel)c->attention.kernel, 0);
}

// The model of checkpoint `dir` (config c from cli_open_checkpoint) on be, for batches up to B x T.
GPT *cli_load_checkpoint_model(const char *dir, const Config *c, Backend *be, int B, int T) {
    char err[ERR_LEN];
    GPTConfig gc = gpt_config_from(c);
    GPT *m = gpt_create(&gc, be, B, T, c);
    if (checkpoint_load(dir, m, NULL, NULL, err, sizeof err) != 0) fatal(EXIT_USAGE, "%s", err);
    return m;
}
