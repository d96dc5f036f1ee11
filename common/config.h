// config: the run configuration. ONE table (common/config.c) gives every key its type, default,
// range and help text; it drives JSON parsing, --set overrides, validation and --help.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define CFG_PATH_MAX 512
#define CFG_NAME_MAX 32

typedef struct {
    struct {
        int n_layer, n_head, n_kv_head, n_embd, vocab_size, max_seq_len;
        char pos_embedding[CFG_NAME_MAX];   // learned | rope | alibi
        float rope_theta;
        int rope_dims;                      // RoPE: rotated dimensions per head; 0 = all
        float dropout;                      // residual dropout (embeddings, attn/MLP outputs)
    } model;
    struct {
        char train[CFG_PATH_MAX], val[CFG_PATH_MAX], tokenizer[CFG_PATH_MAX];
        char synthetic[CFG_NAME_MAX];        // "" = read shards; else a built-in task name
        int shuffle;
        int eot_token;                       // -1: none
    } data;
    struct {
        int batch_size, seq_len, grad_accum, steps;
        long long seed;
        char recompute[CFG_NAME_MAX];        // none | attn_gelu | block
    } train;
    struct {
        float lr, min_lr;
        int warmup_steps;
        char schedule[CFG_NAME_MAX];         // cosine | linear | constant
        float weight_decay, beta1, beta2, eps, grad_clip;
        int decay_embeddings;                // also decay the token/position embeddings
    } optim;
    struct {
        char dtype[CFG_NAME_MAX];            // bf16 | fp16 | fp32
        char loss_scale[CFG_NAME_MAX];       // "dynamic" or a positive number
        float initial_loss_scale;
        int loss_scale_window;
    } precision;
    struct {
        char impl[CFG_NAME_MAX];             // flash | naive
        int window;                          // -1 = unbounded
        int window_every;                    // layer l uses the window iff l % window_every == 0
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
