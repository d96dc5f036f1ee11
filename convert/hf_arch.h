// hf_arch: the Hugging Face architectures flashgpt exports to and imports from, described to the
// one export/import engine (convert/hf.c) as a tensor plan and a config.json dialect.
//
//   gpt2        (GPT2LMHeadModel, convert/hf_gpt2.c)        learned positions
//   starcoder2  (Starcoder2ForCausalLM, convert/hf_starcoder2.c)  RoPE over the whole head, GQA,
//               one sliding window on every layer
//   gpt_neox    (GPTNeoXForCausalLM, convert/hf_neox.c)     partial RoPE (model.rope_dims)
//
// A plan lists every Hugging Face tensor of a model as a copy of rows of one of our parameter
// tensors (optionally through a row permutation, optionally stored transposed), so the export
// gathers, the import scatters, and a round trip is bitwise.
#pragma once
#include <cjson/cJSON.h>
#include <stddef.h>

#include "common/config.h"
#include "model/gpt.h"

// One Hugging Face tensor: rows [row0, row0 + rows) of our tensor `ours` (or, with row_map,
// HF row r <- our row row_map[r]), each of our row width; stored (width, rows) when transposed.
typedef struct {
    char hf[96];         // name without the architecture's optional prefix
    char ours[64];       // gpt_tensor name
    int rows, width;     // width 1 for a 1-D tensor
    int row0;
    const int *row_map;  // (rows) or NULL; points into HfPlan.maps
    int transpose;       // stored (width, rows): GPT-2's Conv1D
    int ndim;
} HfTensor;

typedef struct {
    HfTensor *t;
    int n, cap;
    int *maps;           // row maps of the tensors, owned
    int n_maps;
} HfPlan;

typedef struct {
    const char *model_type;   // config.json's model_type
    const char *class_name;   // the transformers class of `architectures`
    const char *prefix;       // written on export, optional on import ("transformer.")
    const char *head;         // the output head's name, tied to the embedding ("lm_head.weight")
    const char *embed;        // the token embedding's name without prefix
    const char *const *ignored;   // name suffixes of buffers that hold no weights (NULL-ended)
    // config.json of the run config c (an exportable model).
    cJSON *(*config_json)(const Config *c);
    // Reads config.json's object o (path names it in messages) into *g and *window (-1: none);
    // *tied says whether the head is declared tied. Returns 0, or -1 with err naming the key.
    int (*parse)(const cJSON *o, const char *path, GPTConfig *g, int *window, int *tied, char *err,
                 size_t errlen);
    // The tensors of a model of shape g.
    void (*plan)(const GPTConfig *g, HfPlan *p);
} HfArch;

extern const HfArch HF_GPT2, HF_STARCODER2, HF_NEOX;

// Plan building: a tensor taking rows [row0, row0 + rows) of `ours` (width columns; ndim 1 or 2).
HfTensor *hf_plan_add(HfPlan *p, const char *hf, const char *ours, int ndim, int rows, int width,
                      int row0, int transpose);
// A row map of n entries owned by the plan.
int *hf_plan_map(HfPlan *p, int n);
void hf_plan_free(HfPlan *p);
// The per-layer tensors whose names map one to one (the LayerNorms, MLP, attention output):
// HF names fmt-formatted with the layer ("h.%d."), each pair {hf suffix, our suffix, transpose}.
typedef struct {
    const char *hf, *ours;
    int transpose;
} HfPair;
void hf_plan_layer_pairs(HfPlan *p, const GPTConfig *g, const char *fmt, int l, const HfPair *pairs,
                         int n);

// The config.json keys every architecture writes: architectures, model_type, torch_dtype,
// tie_word_embeddings, use_cache, initializer_range and, from the run config, bos/eos (end of
// text, null without).
cJSON *hf_json_common(const Config *c, const HfArch *a);
// hf_json_common and what Starcoder2's and GPT-NeoX's config.json share: the sizes under the
// names hf_json_dims reads, intermediate_size 4 C, hidden_act gelu_pytorch_tanh, rope_scaling
// null, attention_dropout.
cJSON *hf_json_common_rotary(const Config *c, const HfArch *a);
// Reading config.json: absent or null keys read as missing.
const cJSON *hf_json_get(const cJSON *o, const char *key);
// A positive integer field (required). Returns 0, or -1 with err naming the key.
int hf_json_int(const cJSON *o, const char *key, int *x, const char *path, char *err, size_t errlen);
// The sizes under the names Starcoder2 and GPT-NeoX share (hidden_size, num_hidden_layers,
// num_attention_heads, vocab_size, max_position_embeddings) into g; NKV = NH.
int hf_json_dims(const cJSON *o, GPTConfig *g, const char *path, char *err, size_t errlen);
// A boolean that must equal `want` (absent: transformers' default `def`); `why` explains.
int hf_json_bool_is(const cJSON *o, const char *key, int def, int want, const char *why,
                    const char *path, char *err, size_t errlen);
// A boolean into *x (absent: def). Returns 0 or -1.
int hf_json_bool(const cJSON *o, const char *key, int def, int *x, const char *path, char *err,
                 size_t errlen);
// An activation that must be the tanh GELU (gelu_new or gelu_pytorch_tanh); absent: def_ok.
int hf_json_tanh_gelu(const cJSON *o, const char *key, int def_ok, const char *path, char *err,
                      size_t errlen);
// A LayerNorm epsilon that must be flashgpt's 1e-5 (absent: transformers' default, 1e-5).
int hf_json_ln_eps(const cJSON *o, const char *key, const char *path, char *err, size_t errlen);
// An MLP width that must be 4 * C (key required unless null_ok and null/absent).
int hf_json_mlp_width(const cJSON *o, const char *key, int C, int null_ok, const char *path, char *err,
                      size_t errlen);
// The RoPE base of a rotary model: `key` (absent: 10000) or rope_parameters.rope_theta; any
// rope_scaling or a rope_type other than default is refused. Returns 0 or -1.
int hf_json_rope_theta(const cJSON *o, const char *key, float *theta, const char *path, char *err,
                       size_t errlen);
