// config: the run configuration. ONE table (common/config.c) gives every key its type, default,
// range and help text; it drives JSON parsing, --set overrides, validation and --help.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/dtype.h"

#define CFG_PATH_MAX 512
#define CFG_NAME_MAX 32

// The keys with a fixed set of names hold the index of their name in the key's choices (the
// config table); config_choice_name turns a value back into its name.
typedef enum { POS_LEARNED = 0, POS_ROPE = 1, POS_ALIBI = 2 } PosEmbedding;        // model.pos_embedding
typedef enum { SYNTH_NONE = 0, SYNTH_COPY, SYNTH_MARKOV, SYNTH_RETRIEVAL,
               SYNTH_RETRIEVAL_SPREAD } SyntheticTask;                             // data.synthetic
typedef enum { RECOMPUTE_NONE = 0, RECOMPUTE_ATTN_GELU = 1, RECOMPUTE_BLOCK = 2 } Recompute;   // train.recompute
typedef enum { CUDA_GRAPH_AUTO = 0, CUDA_GRAPH_ON = 1, CUDA_GRAPH_OFF = 2 } CudaGraphMode;  // train.cuda_graph
typedef enum { SCHEDULE_COSINE = 0, SCHEDULE_LINEAR = 1, SCHEDULE_CONSTANT = 2 } Schedule;    // optim.schedule

typedef struct {
    struct {
        int n_layer, n_head, n_kv_head, n_embd, vocab_size, max_seq_len;
        PosEmbedding pos_embedding;
        float rope_theta;
        int rope_dims;                      // RoPE: rotated dimensions per head; 0 = all
        float dropout;                      // residual dropout (embeddings, attn/MLP outputs)
    } model;
    struct {
        char train[CFG_PATH_MAX], val[CFG_PATH_MAX], tokenizer[CFG_PATH_MAX];
        SyntheticTask synthetic;             // SYNTH_NONE = read shards
        int shuffle;
        int eot_token;                       // -1: none
    } data;
    struct {
        int batch_size, seq_len, grad_accum, steps;
        long long seed;
        Recompute recompute;
        int divergence_steps;                // bad steps in a row that send the run back; 0 = off
        float divergence_factor;             // a loss above this x the running mean is a spike
        CudaGraphMode cuda_graph;            // replay the step as one CUDA graph
        int classifier_chunk;                // tokens per chunk of the classifier; 0 = auto
    } train;
    struct {
        float lr, min_lr;
        int warmup_steps;
        Schedule schedule;
        float weight_decay, beta1, beta2, eps, grad_clip;
        int decay_embeddings;                // also decay the token/position embeddings
    } optim;
    struct {
        DType dtype;                         // DTYPE_BF16, DTYPE_F16 or DTYPE_F32
        char loss_scale[CFG_NAME_MAX];       // "dynamic" or a positive number
        float initial_loss_scale;
        int loss_scale_window;
    } precision;
    struct {
        int impl;                            // an AttnImpl (attention/attention.h): 0 flash, 1 naive
        int kernel;                          // an AttnKernel: 0 auto, 1 sm90, 2 sm80
        int window;                          // -1 = unbounded
        int window_every;                    // layer l uses the window iff l % window_every == 0
        int sparse;                          // an AttnSparsePattern: 0 none (dense)
        int sparse_band, sparse_global, sparse_stride;  // tokens, multiples of 128
        int sparse_random, sparse_seed;      // bigbird's random blocks per query block, their seed
        int sparse_every;                    // layer l is sparse iff l % sparse_every == 0
        int doc_mask;                        // packed documents split at data.eot_token
        float dropout;
        int deterministic;
    } attention;
    struct {
        float bucket_mb;                     // MiB of gradients per reduction bucket; 0 = none
        float timeout;                       // seconds a rank waits for the others
        int context_parallel;                // ranks per sequence (CP); world = DP x CP
    } dist;
    struct {
        char dir[CFG_PATH_MAX];
        int every, eval_every, eval_tokens, sample_every, sample_tokens, checkpoint_every,
            keep_checkpoints;
    } log;
} Config;

// Every API below returns 0 on success, or -1 after writing a message into err (errlen bytes)
// that names the key (and the file and line, where known) and what is expected.
void config_defaults(Config *c);
int config_load_file(Config *c, const char *path, char *err, size_t errlen);
int config_load_json(Config *c, const char *json, const char *origin, char *err, size_t errlen);
int config_set(Config *c, const char *key_eq_value, char *err, size_t errlen);  // "a.b=v"
// Cross-key rules; also resolves derived defaults (n_kv_head 0 -> n_head).
int config_validate(Config *c, char *err, size_t errlen);
// The model's own rules (positive sizes, heads dividing, RoPE's head size and rope_dims), the one
// place they are written: config_validate applies them to a config, gpt_create to a model
// description built without one. 0, or -1 with err naming the model.* keys.
typedef struct {
    int n_layer, n_head, n_kv_head, n_embd, vocab_size, max_seq_len;
    PosEmbedding pos;
    float rope_theta;
    int rope_dims;
} ModelShape;
int config_check_model(const ModelShape *m, char *err, size_t errlen);
// Returns 0 when a and b describe the same architecture (checkpoint compatibility), otherwise
// -1 with the first differing key named in err.
int config_same_model(const Config *a, const Config *b, char *err, size_t errlen);

char *config_to_json(const Config *c);   // malloc'ed, pretty-printed, every key
// A setting the environment may override: the number in variable `name` when it is set (it must
// lie in [lo, hi], else exit 2 with "environment variable NAME='...': expected <expected>"),
// otherwise `configured`.
double config_env_override(const char *name, double configured, double lo, double hi,
                           const char *expected);
void config_print_help(FILE *f);         // the table: key, type, default, range, help
// The name of value v of the enum-valued key (e.g. "model.pos_embedding", POS_ROPE -> "rope").
const char *config_choice_name(const char *key, int v);
