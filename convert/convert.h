// interop: models that move between flashgpt, llm.c and Hugging Face.
//
//   train_gpt export --checkpoint DIR --format hf --out DIR     (convert/hf.c)
//   train_gpt import --from hf DIR --out DIR                    (convert/hf.c)
//   train_gpt import --from llmc FILE.bin --out DIR             (convert/llmc.c)
//
// The entries parse their own options and return the exit code (0, 1 runtime failure, 2 bad
// usage or bad input). An import writes a complete checkpoint directory (trainer/checkpoint.h:
// step 0, zero AdamW moments), an export a Hugging Face model directory; both are
// written under a temporary name and renamed into place only when complete, and every input is
// validated before anything is written. convert/hf_arch.h lists the Hugging Face architectures.
//
// The rest of this header is shared by the three interop files (convert/common.c holds it).
#pragma once
#include <stddef.h>
#include <stdio.h>

#include "common/config.h"
#include "common/safetensors.h"
#include "model/gpt.h"

// Exports checkpoint directory ckpt as a Hugging Face model directory out (which must not
// exist), in the architecture that computes it exactly (its transformers class into *arch);
// *c receives the checkpoint's config. Returns EXIT_OK, EXIT_USAGE (bad input or a model no
// architecture computes, nothing written) or EXIT_RUNTIME (a write failed, no partial output
// kept), with err set.
int convert_export_hf(const char *ckpt, const char *out, Config *c, const char **arch, char *err,
                      size_t errlen);
// Imports src (from "llmc": llm.c's model file; "hf": a Hugging Face model directory) into the new
// checkpoint directory out, with the llm.c tokenizer file `tokenizer` (may be NULL) stored in
// its config; *c and *n_params describe the model. Returns as convert_export_hf.
int convert_import(const char *from, const char *src, const char *out, const char *tokenizer,
                   Config *c, double *n_params, char *err, size_t errlen);

// A model held on the CPU backend with a host fp32 copy of its flat parameter vector.
typedef struct {
    Config cfg;
    Backend *be;
    GPT *model;
    float *params;   // (gpt_num_params) host fp32, the layout of model/gpt.c; padded wte rows 0
} HostModel;

// The run config of a model imported from `source` (named in messages) with the architecture
// of g (V, maxT, L, NH, NKV, C, positions, RoPE base and dims) and the sliding window `window`
// (-1: none) on every layer: range-checked through the config table, defaults elsewhere, batch 1
// and seq_len min(1024, maxT) so `eval` and `sample` work on the checkpoint alone.
int convert_import_config(Config *c, const GPTConfig *g, int window, const char *source, char *err,
                          size_t errlen);
// Builds the model of a validated config with all parameters 0.
void convert_model_create(HostModel *hm, const Config *c);
// Loads a checkpoint directory (its config and weights). Returns 0 or -1 with err set.
int convert_model_load(HostModel *hm, const char *ckpt_dir, char *err, size_t errlen);
// Host slice of the parameter tensor `name` (e.g. "h.0.attn.qkv.weight"); its description in *t.
float *convert_param(HostModel *hm, const char *name, const ParamTensor **t);
void convert_model_free(HostModel *hm);

// The readers behind import_main: validate the source completely, then fill hm (created here;
// nothing to free on failure). Return 0, or -1 with err naming the file and the problem.
int convert_read_llmc(const char *path, HostModel *hm, char *err, size_t errlen);   // convert_llmc.c
// convert_read_llmc of an open stream of size bytes (path names it in messages).
int convert_read_llmc_stream(FILE *f, long long size, const char *path, HostModel *hm, char *err,
                             size_t errlen);
int convert_read_hf(const char *dir, HostModel *hm, char *err, size_t errlen);      // convert_hf.c
// The architecture in the text of a Hugging Face config.json (len bytes; path names it in
// messages; its model_type one of convert/hf_arch.h), checked to be a model flashgpt computes,
// and its sliding window in *window (-1: none). Returns 0, or -1 with err set.
int convert_hf_parse_config(const char *text, size_t len, const char *path, GPTConfig *g, int *window,
                            char *err, size_t errlen);

// Converts n elements of dtype dt (F32, BF16 or F16) to fp32. Returns 0, -1 for other dtypes.
int convert_to_f32(float *dst, const void *src, DType dt, size_t n);

// An output directory must not exist yet (checked before any work). Returns 0 or -1 with err set.
int convert_check_out(const char *out, char *err, size_t errlen);
// Creates out's parent and a fresh hidden temporary directory beside out, named after `what`,
// out and the pid, into tmp. Returns 0 or -1 with err set.
int convert_make_tmp(const char *out, const char *what, char *tmp, size_t tmp_len, char *err,
                     size_t errlen);
// Renames the complete directory tmp to out (and removes tmp on failure). Returns 0 or -1.
int convert_publish(const char *tmp, const char *out, char *err, size_t errlen);
