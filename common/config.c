// The configuration table and everything it drives: defaults, JSON files, --set overrides,
// validation, help text and serialisation.
#include "common/config.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"

typedef enum { CFG_INT, CFG_FLOAT, CFG_BOOL, CFG_STR, CFG_ENUM, CFG_SCALE } CfgType;

typedef struct {
    const char *key;      // "section.name"
    CfgType type;
    size_t offset;        // into Config
    const char *def;      // default, written as it would be given to --set
    double min, max;      // inclusive range for CFG_INT / CFG_FLOAT
    const char *const *names;   // CFG_ENUM: the names, NULL-terminated; the field holds the index
    const char *help;
} CfgKey;

#define OFF(field) offsetof(Config, field)

// The names of the enum-valued keys, in the order of their enums (common/config.h, DType,
// AttnImpl).
// (AttnImpl, AttnKernel and AttnSparsePattern, attention/attention.h, which common may not
// include, have the values of IMPL_NAMES, KERNEL_NAMES and SPARSE_NAMES; model/backend.c checks
// that at compile time.)
static const char *const POS_NAMES[] = {"learned", "rope", "alibi", NULL};
static const char *const SYNTH_NAMES[] = {"none", "copy", "markov", "retrieval", "retrieval_spread", NULL};
static const char *const RECOMPUTE_NAMES[] = {"none", "attn_gelu", "block", NULL};
static const char *const CUDA_GRAPH_NAMES[] = {"auto", "on", "off", NULL};
static const char *const SCHEDULE_NAMES[] = {"cosine", "linear", "constant", NULL};
static const char *const DTYPE_NAMES[] = {"fp32", "bf16", "fp16", NULL};
static const char *const IMPL_NAMES[] = {"flash", "naive", NULL};
static const char *const KERNEL_NAMES[] = {"auto", "sm90", "sm80", NULL};
static const char *const SPARSE_NAMES[] = {"none", "local_global", "strided", "bigbird", NULL};
_Static_assert(DTYPE_F32 == 0 && DTYPE_BF16 == 1 && DTYPE_F16 == 2, "DTYPE_NAMES follows DType");
_Static_assert(sizeof(PosEmbedding) == sizeof(int) && sizeof(DType) == sizeof(int),
               "enum-valued fields are stored as int");
#define BIG 2147483647.0

static const CfgKey KEYS[] = {
    {"model.n_layer", CFG_INT, OFF(model.n_layer), "12", 1, 1024, NULL, "number of transformer blocks"},
    {"model.n_head", CFG_INT, OFF(model.n_head), "12", 1, 1024, NULL, "query heads per attention layer"},
    {"model.n_kv_head", CFG_INT, OFF(model.n_kv_head), "0", 0, 1024, NULL,
     "key/value heads (GQA when < n_head); 0 = same as n_head"},
    {"model.n_embd", CFG_INT, OFF(model.n_embd), "768", 1, 65536, NULL, "model width C"},
    {"model.vocab_size", CFG_INT, OFF(model.vocab_size), "50257", 2, BIG, NULL,
     "tokens in the vocabulary (padded to a multiple of 128 inside the model)"},
    {"model.max_seq_len", CFG_INT, OFF(model.max_seq_len), "1024", 1, 1 << 22, NULL,
     "longest sequence the model supports (size of the learned position table)"},
    {"model.pos_embedding", CFG_ENUM, OFF(model.pos_embedding), "learned", 0, 0, POS_NAMES,
     "position encoding"},
    {"model.rope_theta", CFG_FLOAT, OFF(model.rope_theta), "10000", 1, 1e9, NULL, "RoPE base frequency"},
    {"model.rope_dims", CFG_INT, OFF(model.rope_dims), "0", 0, 65536, NULL,
     "RoPE: dimensions rotated per head (even, at most the head size; 0 = all); the others "
     "carry no position (GPT-NeoX's rotary_pct)"},
    {"model.dropout", CFG_FLOAT, OFF(model.dropout), "0", 0, 0.99, NULL,
     "dropout on embeddings and on the attention and MLP outputs before the residual add "
     "(nanoGPT's dropout), applied to the nearest 1/256"},

    {"data.train", CFG_STR, OFF(data.train), "", 0, 0, NULL, "glob pattern of training token shards"},
    {"data.val", CFG_STR, OFF(data.val), "", 0, 0, NULL, "glob pattern of validation token shards"},
    {"data.tokenizer", CFG_STR, OFF(data.tokenizer), "", 0, 0, NULL,
     "tokenizer file (llm.c format) used to print samples; empty = no text samples"},
    {"data.synthetic", CFG_ENUM, OFF(data.synthetic), "none", 0, 0, SYNTH_NAMES,
     "built-in task instead of shards: copy (second half repeats the first), markov (known "
     "entropy), retrieval (key/value pairs recalled about seq_len tokens later), "
     "retrieval_spread (the same at any distance up to seq_len)"},
    {"data.shuffle", CFG_BOOL, OFF(data.shuffle), "false", 0, 0, NULL,
     "visit training windows in a seeded random order, each shifted by a random offset"},
    {"data.eot_token", CFG_INT, OFF(data.eot_token), "-1", -1, BIG, NULL,
     "end-of-text token that separates documents; -1 = none"},

    {"train.batch_size", CFG_INT, OFF(train.batch_size), "8", 1, 1 << 20, NULL,
     "sequences per GPU (or process) per micro-step"},
    {"train.seq_len", CFG_INT, OFF(train.seq_len), "1024", 1, 1 << 22, NULL, "tokens per sequence"},
    {"train.grad_accum", CFG_INT, OFF(train.grad_accum), "1", 1, 1 << 20, NULL,
     "micro-steps accumulated into one optimizer step"},
    {"train.steps", CFG_INT, OFF(train.steps), "1000", 0, BIG, NULL, "optimizer steps"},
    {"train.seed", CFG_INT, OFF(train.seed), "1337", 0, BIG, NULL, "seed of initialisation, data order and sampling"},
    {"train.recompute", CFG_ENUM, OFF(train.recompute), "none", 0, 0, RECOMPUTE_NAMES,
     "activation recomputation in backward"},
    {"train.divergence_steps", CFG_INT, OFF(train.divergence_steps), "0", 0, 1000000, NULL,
     "divergence guard: after this many consecutive bad steps (a non-finite loss, a non-finite "
     "gradient outside fp16's dynamic loss scaling, or a loss spike: train.divergence_factor) "
     "reload the newest checkpoint and skip the data those steps read; 0 = off"},
    {"train.divergence_factor", CFG_FLOAT, OFF(train.divergence_factor), "3", 1, 1e6, NULL,
     "divergence guard: a step whose loss exceeds this multiple of the running mean loss of the "
     "good steps before it is a spike"},
    {"train.cuda_graph", CFG_ENUM, OFF(train.cuda_graph), "auto", 0, 0, CUDA_GRAPH_NAMES,
     "capture the optimizer step once as a CUDA graph and replay it: auto = where the run "
     "allows it (one process on the cuda backend, no attention.doc_mask), on = "
     "required (exit 2 where it is not possible), off = launch every kernel each step"},
    {"train.classifier_chunk", CFG_INT, OFF(train.classifier_chunk), "0", 0, 1 << 30, NULL,
     "tokens per chunk of the classifier (head matmul and cross-entropy): only one chunk's "
     "logits exist at a time, and backward recomputes every chunk's but the last; 0 = auto "
     "(chunks of at most 2 GiB of logits)"},

    {"optim.lr", CFG_FLOAT, OFF(optim.lr), "6e-4", 0, 10, NULL, "peak learning rate"},
    {"optim.min_lr", CFG_FLOAT, OFF(optim.min_lr), "6e-5", 0, 10, NULL, "learning rate at the end of the decay"},
    {"optim.warmup_steps", CFG_INT, OFF(optim.warmup_steps), "0", 0, BIG, NULL, "linear warmup steps"},
    {"optim.schedule", CFG_ENUM, OFF(optim.schedule), "cosine", 0, 0, SCHEDULE_NAMES,
     "decay from lr to min_lr after warmup"},
    {"optim.weight_decay", CFG_FLOAT, OFF(optim.weight_decay), "0.1", 0, 10, NULL,
     "decoupled weight decay of 2-D weights"},
    {"optim.beta1", CFG_FLOAT, OFF(optim.beta1), "0.9", 0, 0.999999, NULL, "AdamW beta1"},
    {"optim.beta2", CFG_FLOAT, OFF(optim.beta2), "0.95", 0, 0.999999, NULL, "AdamW beta2"},
    {"optim.eps", CFG_FLOAT, OFF(optim.eps), "1e-8", 0, 1, NULL, "AdamW epsilon"},
    {"optim.grad_clip", CFG_FLOAT, OFF(optim.grad_clip), "1.0", 0, 1e9, NULL,
     "clip the global gradient norm to this; 0 = off"},
    {"optim.decay_embeddings", CFG_BOOL, OFF(optim.decay_embeddings), "false", 0, 0, NULL,
     "also apply weight decay to the position embedding table"},

    {"precision.dtype", CFG_ENUM, OFF(precision.dtype), "bf16", 0, 0, DTYPE_NAMES,
     "compute dtype on CUDA (the CPU backend always computes in fp32)"},
    {"precision.loss_scale", CFG_SCALE, OFF(precision.loss_scale), "dynamic", 0, 0, NULL,
     "\"dynamic\" or a fixed positive loss scale"},
    {"precision.initial_loss_scale", CFG_FLOAT, OFF(precision.initial_loss_scale), "65536", 1, 1e30,
     NULL, "first scale of dynamic loss scaling"},
    {"precision.loss_scale_window", CFG_INT, OFF(precision.loss_scale_window), "1000", 1, BIG, NULL,
     "clean steps before the dynamic scale doubles"},

    {"attention.impl", CFG_ENUM, OFF(attention.impl), "flash", 0, 0, IMPL_NAMES,
     "flash (tiled, memory linear in T) or naive (materialised scores)"},
    {"attention.kernel", CFG_ENUM, OFF(attention.kernel), "auto", 0, 0, KERNEL_NAMES,
     "CUDA flash kernel family: auto (the Hopper family where the GPU and the problem allow, "
     "else sm80), sm90 (refused on a GPU without it, and for the backward at head size 256, which "
     "auto runs on sm80), sm80 (everywhere, for comparisons)"},
    {"attention.window", CFG_INT, OFF(attention.window), "-1", -1, BIG, NULL,
     "sliding window: keys at most this far back; -1 = unbounded"},
    {"attention.window_every", CFG_INT, OFF(attention.window_every), "1", 1, 1024, NULL,
     "layer l uses attention.window iff l % window_every == 0 (1 = every layer, 2 = local/global "
     "alternating from layer 0); the other layers attend globally"},
    {"attention.sparse", CFG_ENUM, OFF(attention.sparse), "none", 0, 0, SPARSE_NAMES,
     "block-sparse attention over 128 x 128 blocks: none, local_global (a local band and global "
     "tokens), strided (a local band and every sparse_stride-th block), bigbird (local_global and "
     "random blocks)"},
    {"attention.sparse_band", CFG_INT, OFF(attention.sparse_band), "1024", 128, BIG, NULL,
     "sparse: the local band, tokens (a multiple of 128): a query's block reads the key blocks "
     "less than sparse_band / 128 blocks from its own (128 = its own block alone)"},
    {"attention.sparse_global", CFG_INT, OFF(attention.sparse_global), "128", 0, BIG, NULL,
     "sparse local_global / bigbird: the first sparse_global tokens (a multiple of 128) read every "
     "key and every query reads them"},
    {"attention.sparse_stride", CFG_INT, OFF(attention.sparse_stride), "1024", 128, BIG, NULL,
     "sparse strided: every query also reads the last block of each sparse_stride tokens (a "
     "multiple of 128)"},
    {"attention.sparse_random", CFG_INT, OFF(attention.sparse_random), "2", 0, 4096, NULL,
     "sparse bigbird: random key blocks per query block"},
    {"attention.sparse_seed", CFG_INT, OFF(attention.sparse_seed), "0", 0, BIG, NULL,
     "sparse bigbird: the seed of the random blocks (the same in every layer and step)"},
    {"attention.sparse_every", CFG_INT, OFF(attention.sparse_every), "1", 1, 1024, NULL,
     "layer l uses attention.sparse iff l % sparse_every == 0 (1 = every layer, 2 = sparse and "
     "dense alternating from layer 0)"},
    {"attention.doc_mask", CFG_BOOL, OFF(attention.doc_mask), "false", 0, 0, NULL,
     "packed documents: a document starts after each data.eot_token and at each row start; "
     "tokens attend only within their document and positions restart at 0 in each"},
    {"attention.dropout", CFG_FLOAT, OFF(attention.dropout), "0", 0, 0.99, NULL,
     "dropout on attention probabilities, applied to the nearest 1/256 (0.1 runs as 26/256)"},
    {"attention.deterministic", CFG_BOOL, OFF(attention.deterministic), "false", 0, 0, NULL,
     "bitwise reproducible attention backward"},

    {"dist.bucket_mb", CFG_FLOAT, OFF(dist.bucket_mb), "25", 0, 1e6, NULL,
     "MiB of gradients per reduction bucket, reduced while backward still runs; 0 = one "
     "reduce-scatter after backward (the environment variable FLASHGPT_BUCKET_MB overrides)"},
    {"dist.timeout", CFG_FLOAT, OFF(dist.timeout), "300", 1, 1e6, NULL,
     "seconds a rank waits for the others before it ends the job with a message naming the "
     "operation (the environment variable FLASHGPT_DIST_TIMEOUT overrides)"},

    {"dist.context_parallel", CFG_INT, OFF(dist.context_parallel), "1", 1, 4096, NULL,
     "context parallelism: ranks that share each sequence (ring attention, zigzag split of "
     "train.seq_len into 2 x CP chunks); groups are consecutive ranks, world size = data-"
     "parallel size x this; 1 = off"},

    {"log.dir", CFG_STR, OFF(log.dir), "runs/default", 0, 0, NULL,
     "run directory: metrics.jsonl, config.json and checkpoints"},
    {"log.every", CFG_INT, OFF(log.every), "10", 1, BIG, NULL, "print a progress line every N steps"},
    {"log.eval_every", CFG_INT, OFF(log.eval_every), "0", 0, BIG, NULL,
     "evaluate val loss every N steps (and at the end); 0 = only at the end"},
    {"log.eval_tokens", CFG_INT, OFF(log.eval_tokens), "65536", 0, BIG, NULL,
     "tokens of validation data per evaluation"},
    {"log.sample_every", CFG_INT, OFF(log.sample_every), "0", 0, BIG, NULL,
     "print a text sample every N steps (and at the end); 0 = only at the end"},
    {"log.sample_tokens", CFG_INT, OFF(log.sample_tokens), "200", 0, BIG, NULL, "tokens per sample"},
    {"log.checkpoint_every", CFG_INT, OFF(log.checkpoint_every), "0", 0, BIG, NULL,
     "write a checkpoint every N steps (and at the end); 0 = only at the end"},
    {"log.keep_checkpoints", CFG_INT, OFF(log.keep_checkpoints), "2", 1, BIG, NULL,
     "newest checkpoints kept in log.dir"},
};
#define N_KEYS ((int)(sizeof(KEYS) / sizeof(KEYS[0])))

static const CfgKey *find_key(const char *key) {
    for (int i = 0; i < N_KEYS; i++)
        if (strcmp(KEYS[i].key, key) == 0) return &KEYS[i];
    return NULL;
}

// Index of v among the key's names, or -1.
static int choice_index(const CfgKey *k, const char *v) {
    for (int i = 0; k->names[i]; i++)
        if (strcmp(k->names[i], v) == 0) return i;
    return -1;
}

static int n_choices(const CfgKey *k) {
    int n = 0;
    while (k->names[n]) n++;
    return n;
}

// "a|b|c", for messages and --help.
static const char *choices_text(const CfgKey *k, char *buf, size_t n) {
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; k->names[i] && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, "%s%s", i ? "|" : "", k->names[i]);
    return buf;
}

// buf (at least 128 bytes) holds the text of an enum's choices.
static const char *type_name(const CfgKey *k, char *buf, size_t n) {
    switch (k->type) {
    case CFG_INT: return "integer";
    case CFG_FLOAT: return "number";
    case CFG_BOOL: return "true|false";
    case CFG_STR: return "string";
    case CFG_ENUM: return choices_text(k, buf, n);
    case CFG_SCALE: return "\"dynamic\" or number";
    }
    return "?";
}

static void range_text(const CfgKey *k, char *buf, size_t n) {
    if (k->type == CFG_INT) snprintf(buf, n, "[%.0f, %.0f]", k->min, k->max);
    else if (k->type == CFG_FLOAT) snprintf(buf, n, "[%g, %g]", k->min, k->max);
    else snprintf(buf, n, "-");
}

// Stores a value given as text (defaults, --set, JSON strings) into the field of `k`.
static int set_from_text(Config *c, const CfgKey *k, const char *v, char *err, size_t errlen) {
    char *field = (char *)c + k->offset;
    char range[64];
    range_text(k, range, sizeof range);
    switch (k->type) {
    case CFG_INT: {
        char *end;
        errno = 0;
        long long x = strtoll(v, &end, 10);
        if (*v == '\0' || *end != '\0' || errno)
            return set_error(err, errlen, "%s: expected an integer, got '%s'", k->key, v);
        if (x < k->min || x > k->max)
            return set_error(err, errlen, "%s: %lld is out of range %s", k->key, x, range);
        if (k->offset == OFF(train.seed)) *(long long *)field = x;
        else *(int *)field = (int)x;
        return 0;
    }
    case CFG_FLOAT: {
        char *end;
        errno = 0;
        double x = strtod(v, &end);
        if (*v == '\0' || *end != '\0' || errno || !isfinite(x))
            return set_error(err, errlen, "%s: expected a number, got '%s'", k->key, v);
        // The range is checked on the float that is stored, against bounds rounded to float:
        // a bound such as 0.99 has no float, and the float nearest it (0.99000001) must read back
        // from the config.json and state.json it is written to.
        if (!(fabs(x) <= FLT_MAX) || (float)x < (float)k->min || (float)x > (float)k->max)
            return set_error(err, errlen, "%s: %g is out of range %s", k->key, x, range);
        *(float *)field = (float)x;
        return 0;
    }
    case CFG_BOOL:
        if (strcmp(v, "true") == 0 || strcmp(v, "1") == 0) *(int *)field = 1;
        else if (strcmp(v, "false") == 0 || strcmp(v, "0") == 0) *(int *)field = 0;
        else return set_error(err, errlen, "%s: expected true or false, got '%s'", k->key, v);
        return 0;
    case CFG_ENUM: {
        const int i = choice_index(k, v);
        char names[128];
        if (i < 0)
            return set_error(err, errlen, "%s: '%s' is not one of %s", k->key, v,
                             choices_text(k, names, sizeof names));
        *(int *)field = i;
        return 0;
    }
    case CFG_STR:
        if (strlen(v) >= CFG_PATH_MAX) return set_error(err, errlen, "%s: value is too long", k->key);
        strcpy(field, v);
        return 0;
    case CFG_SCALE: {
        char *end;
        double x = strtod(v, &end);
        int is_num = *v != '\0' && *end == '\0' && isfinite(x);
        if (strcmp(v, "dynamic") != 0 && !(is_num && x > 0))
            return set_error(err, errlen, "%s: expected \"dynamic\" or a positive number, got '%s'",
                          k->key, v);
        snprintf(field, CFG_NAME_MAX, "%s", v);
        return 0;
    }
    }
    return -1;
}

void config_defaults(Config *c) {
    char err[256];
    memset(c, 0, sizeof *c);
    for (int i = 0; i < N_KEYS; i++)
        if (set_from_text(c, &KEYS[i], KEYS[i].def, err, sizeof err) != 0)
            fatal(EXIT_RUNTIME, "bad default in config table: %s", err);
}

int config_set(Config *c, const char *kv, char *err, size_t errlen) {
    const char *eq = strchr(kv, '=');
    if (!eq) return set_error(err, errlen, "--set '%s': expected key=value, e.g. --set train.steps=100", kv);
    char key[128];
    size_t n = (size_t)(eq - kv);
    if (n >= sizeof key) n = sizeof key - 1;
    memcpy(key, kv, n);
    key[n] = '\0';
    const CfgKey *k = find_key(key);
    if (!k) return set_error(err, errlen, "--set: unknown key '%s' (train_gpt train --help lists every key)", key);
    return set_from_text(c, k, eq + 1, err, errlen);
}

// 1-based line of the first occurrence of "name" (quoted) in the JSON text, 0 if absent.
static int line_of(const char *json, const char *name) {
    char pat[160];
    snprintf(pat, sizeof pat, "\"%s\"", name);
    const char *hit = strstr(json, pat);
    if (!hit) return 0;
    int line = 1;
    for (const char *s = json; s < hit; s++) line += *s == '\n';
    return line;
}

static int set_from_json(Config *c, const CfgKey *k, const cJSON *item, const char *where,
                         char *err, size_t errlen) {
    char text[64], tn[128];
    const char *v = NULL;
    switch (k->type) {
    case CFG_INT:
    case CFG_FLOAT:
        if (!cJSON_IsNumber(item))
            return set_error(err, errlen, "%s: %s must be a %s", where, k->key, type_name(k, tn, sizeof tn));
        if (k->type == CFG_INT && item->valuedouble != floor(item->valuedouble))
            return set_error(err, errlen, "%s: %s must be an integer, got %g", where, k->key, item->valuedouble);
        snprintf(text, sizeof text, k->type == CFG_INT ? "%.0f" : "%.9g", item->valuedouble);
        v = text;
        break;
    case CFG_BOOL:
        if (!cJSON_IsBool(item)) return set_error(err, errlen, "%s: %s must be true or false", where, k->key);
        v = cJSON_IsTrue(item) ? "true" : "false";
        break;
    case CFG_STR:
    case CFG_ENUM:
        if (!cJSON_IsString(item))
            return set_error(err, errlen, "%s: %s must be a string (%s)", where, k->key, type_name(k, tn, sizeof tn));
        v = item->valuestring;
        break;
    case CFG_SCALE:
        if (cJSON_IsNumber(item)) {
            snprintf(text, sizeof text, "%.9g", item->valuedouble);
            v = text;
        } else if (cJSON_IsString(item)) {
            v = item->valuestring;
        } else {
            return set_error(err, errlen, "%s: %s must be \"dynamic\" or a number", where, k->key);
        }
        break;
    }
    char inner[384];
    if (set_from_text(c, k, v, inner, sizeof inner) != 0)
        return set_error(err, errlen, "%s: %s", where, inner);
    return 0;
}

// Whether KEYS[i] is the first key of its section ("section." up to and with the dot).
static int first_of_section(int i, size_t len) {
    for (int j = 0; j < i; j++)
        if (strncmp(KEYS[j].key, KEYS[i].key, len + 1) == 0) return 0;
    return 1;
}

// "model, data, ...": the sections of KEYS in table order, for messages.
static const char *section_names(char *buf, size_t n) {
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < N_KEYS && used < n; i++) {
        const size_t len = strcspn(KEYS[i].key, ".");
        if (!first_of_section(i, len)) continue;
        used += (size_t)snprintf(buf + used, n - used, "%s%.*s", used ? ", " : "", (int)len,
                                 KEYS[i].key);
    }
    return buf;
}

int config_load_json(Config *c, const char *json, const char *origin, char *err, size_t errlen) {
    cJSON *root = cJSON_Parse(json);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        int line = 1;
        if (at)
            for (const char *s = json; s < at && *s; s++) line += *s == '\n';
        return set_error(err, errlen, "%s:%d: malformed JSON near '%.20s'", origin, line, at ? at : "");
    }
    int rc = 0;
    if (!cJSON_IsObject(root)) {
        rc = set_error(err, errlen, "%s: the config must be a JSON object of sections", origin);
        goto done;
    }
    for (const cJSON *sec = root->child; sec && rc == 0; sec = sec->next) {
        int known = 0;
        size_t sl = strlen(sec->string);
        for (int i = 0; i < N_KEYS; i++)
            known |= strncmp(KEYS[i].key, sec->string, sl) == 0 && KEYS[i].key[sl] == '.';
        if (!known) {
            char names[256];
            rc = set_error(err, errlen, "%s:%d: unknown section '%s' (expected %s)", origin,
                           line_of(json, sec->string), sec->string,
                           section_names(names, sizeof names));
            break;
        }
        if (!cJSON_IsObject(sec)) {
            rc = set_error(err, errlen, "%s:%d: section '%s' must be an object", origin,
                        line_of(json, sec->string), sec->string);
            break;
        }
        for (const cJSON *item = sec->child; item; item = item->next) {
            char key[160], where[CFG_PATH_MAX + 32];
            snprintf(key, sizeof key, "%s.%s", sec->string, item->string);
            snprintf(where, sizeof where, "%s:%d", origin, line_of(json, item->string));
            const CfgKey *k = find_key(key);
            if (!k) {
                rc = set_error(err, errlen, "%s: unknown key '%s' (train_gpt train --help lists every key)",
                            where, key);
                break;
            }
            if ((rc = set_from_json(c, k, item, where, err, errlen)) != 0) break;
        }
    }
done:
    cJSON_Delete(root);
    return rc;
}

int config_load_file(Config *c, const char *path, char *err, size_t errlen) {
    char why[ERR_LEN];
    char *text = read_file(path, NULL, why, sizeof why);
    if (!text) return set_error(err, errlen, "config: %s", why);
    int rc = config_load_json(c, text, path, err, errlen);
    free(text);
    return rc;
}

// attention.sparse's parameters against the sequence and the implementation.
static int validate_sparse(const Config *c, char *err, size_t errlen) {
    const int pattern = c->attention.sparse, T = c->train.seq_len;
    if (pattern == 0)
        return c->attention.sparse_every > 1
                   ? set_error(err, errlen, "attention.sparse_every = %d needs a pattern: set "
                                            "attention.sparse", c->attention.sparse_every)
                   : 0;
    const char *name = SPARSE_NAMES[pattern];
    if (c->attention.impl == choice_index(find_key("attention.impl"), "naive"))
        return set_error(err, errlen, "attention.sparse = %s needs attention.impl = flash (naive "
                                      "materialises every score)", name);
    if (c->dist.context_parallel > 1)
        return set_error(err, errlen, "attention.sparse = %s does not support dist.context_parallel "
                                      "= %d yet: set attention.sparse = none or dist.context_parallel = 1",
                         name, c->dist.context_parallel);
    const struct {
        const char *key;
        int value, used;
    } lengths[] = {
        {"attention.sparse_band", c->attention.sparse_band, 1},
        {"attention.sparse_global", c->attention.sparse_global, pattern != 2},
        {"attention.sparse_stride", c->attention.sparse_stride, pattern == 2},
    };
    for (int i = 0; i < 3; i++) {
        if (!lengths[i].used) continue;
        if (lengths[i].value % 128 != 0)
            return set_error(err, errlen, "%s (%d) must be a multiple of the 128-token block of "
                                          "attention.sparse = %s", lengths[i].key, lengths[i].value, name);
        if (lengths[i].value > T)
            return set_error(err, errlen, "%s (%d tokens) does not fit train.seq_len (%d): use at most "
                                          "%d", lengths[i].key, lengths[i].value, T, T / 128 * 128);
    }
    if (pattern == 3 && c->attention.sparse_random > (T + 127) / 128)
        return set_error(err, errlen, "attention.sparse_random (%d blocks) is more than the %d blocks "
                                      "of train.seq_len (%d)", c->attention.sparse_random, (T + 127) / 128, T);
    return 0;
}

// dist.context_parallel against the keys it cannot serve (the world size is checked at launch).
static int validate_context_parallel(const Config *c, char *err, size_t errlen) {
    const int cp = c->dist.context_parallel;
    if (cp == 1) return 0;
    if (c->train.seq_len % (2 * cp) != 0)
        return set_error(err, errlen, "dist.context_parallel = %d cuts train.seq_len into 2 x %d "
                                      "equal chunks: train.seq_len (%d) must be a multiple of %d",
                         cp, cp, c->train.seq_len, 2 * cp);
    if (c->attention.impl == choice_index(find_key("attention.impl"), "naive"))
        return set_error(err, errlen, "dist.context_parallel = %d needs attention.impl = flash "
                                      "(naive materialises the whole score matrix)", cp);
    if (c->attention.doc_mask)
        return set_error(err, errlen, "dist.context_parallel = %d does not support "
                                      "attention.doc_mask yet: set attention.doc_mask = false or "
                                      "dist.context_parallel = 1", cp);
    if (c->attention.dropout > 0.0f)
        return set_error(err, errlen, "dist.context_parallel = %d does not support "
                                      "attention.dropout yet: set attention.dropout = 0 or "
                                      "dist.context_parallel = 1", cp);
    return 0;
}

int config_check_model(const ModelShape *m, char *err, size_t errlen) {
    const int C = m->n_embd, NH = m->n_head, NKV = m->n_kv_head;
    if (m->n_layer < 1 || NH < 1 || NKV < 1 || C < 1 || m->vocab_size < 2 || m->max_seq_len < 1)
        return set_error(err, errlen, "model: n_layer, n_head, n_kv_head, n_embd and max_seq_len must be "
                                      "positive and vocab_size at least 2");
    if (C % NH != 0)
        return set_error(err, errlen, "model.n_embd (%d) must be divisible by model.n_head (%d)", C, NH);
    if (NH % NKV != 0)
        return set_error(err, errlen, "model.n_head (%d) must be divisible by model.n_kv_head (%d)", NH, NKV);
    if (m->pos == POS_ROPE && ((C / NH) % 2 != 0 || !(m->rope_theta > 0.0f)))
        return set_error(err, errlen, "model.pos_embedding = rope needs an even head size (got %d) and "
                                      "model.rope_theta > 0 (got %g)", C / NH, (double)m->rope_theta);
    if (m->rope_dims != 0 && m->pos != POS_ROPE)
        return set_error(err, errlen, "model.rope_dims = %d needs model.pos_embedding = rope (got %s): "
                                   "set model.rope_dims to 0", m->rope_dims, POS_NAMES[m->pos]);
    if (m->rope_dims < 0 || m->rope_dims % 2 != 0 || m->rope_dims > C / NH)
        return set_error(err, errlen, "model.rope_dims (%d) must be even and at most the head size "
                                   "n_embd / n_head (%d); 0 rotates all", m->rope_dims, C / NH);
    return 0;
}

int config_validate(Config *c, char *err, size_t errlen) {
    if (c->model.n_kv_head == 0) c->model.n_kv_head = c->model.n_head;
    const ModelShape shape = {c->model.n_layer, c->model.n_head, c->model.n_kv_head, c->model.n_embd,
                              c->model.vocab_size, c->model.max_seq_len, c->model.pos_embedding,
                              c->model.rope_theta, c->model.rope_dims};
    if (config_check_model(&shape, err, errlen) != 0) return -1;
    if (c->train.seq_len > c->model.max_seq_len)
        return set_error(err, errlen, "train.seq_len (%d) must not exceed model.max_seq_len (%d)",
                      c->train.seq_len, c->model.max_seq_len);
    if (c->optim.min_lr > c->optim.lr)
        return set_error(err, errlen, "optim.min_lr (%g) must not exceed optim.lr (%g)", c->optim.min_lr,
                      c->optim.lr);
    if (c->data.synthetic == SYNTH_NONE && c->data.train[0] == '\0')
        return set_error(err, errlen, "data.train is empty: give a shard pattern (see train_gpt prepare) "
                                   "or a built-in task with data.synthetic");
    if (c->attention.doc_mask && c->data.eot_token < 0)
        return set_error(err, errlen, "attention.doc_mask = true needs data.eot_token (the token that "
                                   "ends each document), but it is -1");
    if (c->attention.window_every > 1 && c->attention.window < 0)
        return set_error(err, errlen, "attention.window_every = %d needs a sliding window: set "
                                   "attention.window >= 0", c->attention.window_every);
    // dropout draws one byte per element (attention/philox.h): the rate runs to the nearest 1/256
    const struct { const char *key; float p; } rates[] = {{"attention.dropout", c->attention.dropout},
                                                          {"model.dropout", c->model.dropout}};
    for (int i = 0; i < 2; i++)
        if (rates[i].p > 0.0f && (double)rates[i].p * 256.0 < 0.5)
            return set_error(err, errlen, "%s = %g rounds to 0 (dropout works in steps of 1/256): set 0 or at "
                                       "least 0.002", rates[i].key, rates[i].p);
    if (validate_sparse(c, err, errlen) != 0) return -1;
    if (validate_context_parallel(c, err, errlen) != 0) return -1;
    if (c->data.eot_token >= c->model.vocab_size)
        return set_error(err, errlen, "data.eot_token (%d) must be below model.vocab_size (%d)",
                      c->data.eot_token, c->model.vocab_size);
    return 0;
}

static const char *MODEL_KEYS[] = {"model.n_layer", "model.n_head", "model.n_kv_head", "model.n_embd",
                                   "model.vocab_size", "model.max_seq_len", "model.pos_embedding",
                                   "model.rope_theta", "model.rope_dims"};

int config_same_model(const Config *a, const Config *b, char *err, size_t errlen) {
    for (size_t i = 0; i < sizeof MODEL_KEYS / sizeof MODEL_KEYS[0]; i++) {
        const CfgKey *k = find_key(MODEL_KEYS[i]);
        const size_t sz = k->type == CFG_FLOAT ? sizeof(float) : sizeof(int);
        if (memcmp((const char *)a + k->offset, (const char *)b + k->offset, sz) != 0)
            return set_error(err, errlen, "%s differs from the checkpoint's", k->key);
    }
    return 0;
}

char *config_to_json(const Config *c) {
    cJSON *root = cJSON_CreateObject();
    for (int i = 0; i < N_KEYS; i++) {
        const CfgKey *k = &KEYS[i];
        char sec[32];
        const char *dot = strchr(k->key, '.');
        snprintf(sec, sizeof sec, "%.*s", (int)(dot - k->key), k->key);
        cJSON *s = cJSON_GetObjectItemCaseSensitive(root, sec);
        if (!s) s = cJSON_AddObjectToObject(root, sec);
        const char *field = (const char *)c + k->offset;
        switch (k->type) {
        case CFG_INT:
            cJSON_AddNumberToObject(s, dot + 1, k->offset == OFF(train.seed) ? (double)*(const long long *)field
                                                                             : (double)*(const int *)field);
            break;
        case CFG_FLOAT: cJSON_AddNumberToObject(s, dot + 1, *(const float *)field); break;
        case CFG_BOOL: cJSON_AddBoolToObject(s, dot + 1, *(const int *)field); break;
        case CFG_STR: cJSON_AddStringToObject(s, dot + 1, field); break;
        case CFG_ENUM: cJSON_AddStringToObject(s, dot + 1, k->names[*(const int *)field]); break;
        case CFG_SCALE:
            if (strcmp(field, "dynamic") == 0) cJSON_AddStringToObject(s, dot + 1, field);
            else cJSON_AddNumberToObject(s, dot + 1, strtod(field, NULL));
            break;
        }
    }
    char *out = cJSON_Print(root);
    cJSON_Delete(root);
    return out;
}

void config_print_help(FILE *f) {
    fprintf(f, "Config keys (JSON sections, or --set section.key=value):\n");
    for (int i = 0; i < N_KEYS; i++) {
        char range[64], tn[128];
        range_text(&KEYS[i], range, sizeof range);
        fprintf(f, "  %-30s %-22s default %-10s range %-16s %s\n", KEYS[i].key, type_name(&KEYS[i], tn, sizeof tn),
                KEYS[i].def[0] ? KEYS[i].def : "\"\"", range, KEYS[i].help);
    }
}

const char *config_choice_name(const char *key, int v) {
    const CfgKey *k = find_key(key);
    CHECK(k && k->type == CFG_ENUM && v >= 0 && v < n_choices(k));
    return k->names[v];
}

double config_env_override(const char *name, double configured, double lo, double hi,
                           const char *expected) {
    const char *v = getenv(name);
    if (!v) return configured;
    char *end;
    const double x = strtod(v, &end);
    if (*v == '\0' || *end != '\0' || !(x >= lo && x <= hi))
        fatal(EXIT_USAGE, "environment variable %s='%s': expected %s", name, v, expected);
    return x;
}
