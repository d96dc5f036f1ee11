// cli: the subcommands other than `train` (eval, sample, bench, export, import) and what every
// subcommand shares: option parsing, the choice of backend, text decoding and prompt encoding,
// models rebuilt from checkpoints, the MFU denominator. train_gpt.c dispatches to the entry points and runs `train`.
// Everything here may exit with EXIT_USAGE and a message on bad input.
#pragma once
#include <stddef.h>
#include <stdio.h>

#include "common/config.h"
#include "common/rng.h"
#include "data/dataset.h"
#include "data/tokenizer.h"
#include "dist/comm.h"
#include "model/backend.h"
#include "model/gpt.h"


// ---- subcommand entry points (argv[0] is the subcommand; return the exit code) ----
int cli_eval_main(int argc, char **argv);
int cli_sample_main(int argc, char **argv);
int cli_bench_main(int argc, char **argv);
int cli_export_main(int argc, char **argv);   // cli/convert.c
int cli_import_main(int argc, char **argv);
// `bench --attention` (cli/bench_attention.c): times one layer's attention forward and backward
// through be for steps calls each; prints one line when print is set. dense 0 (attention.sparse
// set) times the block-sparse call alone.
void cli_bench_attention(const Config *c, Backend *be, long steps, int dense, int print);

// ---- options ----
int cli_is_help(const char *a);
// Whether any argument asks for help: it wins over every other argument, even a bad one.
int cli_has_help(int argc, char **argv);
const char *cli_opt_value(int argc, char **argv, int *i);   // the value after argv[*i]
long cli_parse_long(const char *opt, const char *v, long lo, long hi);
double cli_parse_double(const char *opt, const char *v, double lo, double hi);
const char *cli_device_arg(int argc, char **argv, int *i);  // --device cpu|cuda, checked
// -c CONFIG [--set key=value ...] [--device ...] into a validated config (exits on --help).
void cli_parse_train_args(int argc, char **argv, Config *c, const char **device);
Backend *cli_open_backend(const char *device, DType dtype, AttnKernel kernel, int local_rank);
// The launch's communicator with the config's dist.timeout; exits 2 when li cannot be served.
Comm *cli_open_comm(const LaunchInfo *li, Backend *be, const Config *c);

// ---- text ----
char *cli_decode_text(const Tokenizer *tok, const int *ids, int n);   // malloc'ed
int cli_start_token(const Tokenizer *tok);
char *cli_sample_text(GPT *m, const Tokenizer *tok, const int *prompt, int n_prompt, int n_new,
                      float temperature, int top_k, Rng *rng);       // malloc'ed
int *cli_encode_prompt(const Tokenizer *tok, const char *prompt, int *n_out);  // malloc'ed ids
Tokenizer *cli_load_tokenizer(const char *path);
// The tokenizer of checkpoint dir (its tokenizer.bin, checksum verified, else its run's
// data.tokenizer), or NULL when it has none.
Tokenizer *cli_checkpoint_tokenizer(const char *dir, const Config *c);

// ---- checkpoints and accounting ----
Backend *cli_open_checkpoint(const char *dir, Config *c, const char *device);
GPT *cli_load_checkpoint_model(const char *dir, const Config *c, Backend *be, int B, int T);
double cli_flops_per_token(const Config *c, size_t n_params);
double cli_gpu_memory_gib(Backend *be);   // -1 on the CPU
// The MFU denominator: the dense bf16/fp16 tensor-core peak (FLOP/s, no sparsity) of the
// backend's GPU, from a table by name, else by compute capability; 0 when unknown (the CPU, a
// GPU the table lacks), and then no MFU is printed. cli/peak_flops.c.
double cli_peak_flops(const Backend *be);
