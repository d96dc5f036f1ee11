// convert_hf: Hugging Face transformers' GPT-2 (GPT2LMHeadModel) <-> flashgpt checkpoints.
//
// A Hugging Face directory holds config.json and model.safetensors. GPT-2's linear layers are
// Conv1D modules whose weights are stored (in, out), the transpose of our PyTorch-Linear (out, in)
// layout; c_attn fuses q | k | v along `out` exactly like our qkv. The output head is tied to the
// token embedding (lm_head.weight is usually absent), which has V rows: our padded rows [V, Vp)
// are dropped on export and zero-filled on import. Names (export adds the "transformer." prefix
// that GPT2LMHeadModel.save_pretrained writes; import accepts names with or without it):
//   wte -> wte.weight (V, C)        wpe -> wpe.weight (maxT, C)    lnf -> ln_f.{weight,bias}
//   h.{l}.ln1 -> h.{l}.ln_1         h.{l}.attn.qkv -> h.{l}.attn.c_attn (transposed weight)
//   h.{l}.attn.proj -> h.{l}.attn.c_proj (T)  h.{l}.ln2 -> h.{l}.ln_2
//   h.{l}.mlp.fc -> h.{l}.mlp.c_fc (T)        h.{l}.mlp.proj -> h.{l}.mlp.c_proj (T)
// The arithmetic matches transformers' GPT-2 with activation_function gelu_new (tanh GELU, as
// our EPI_GELU), layer_norm_epsilon 1e-5 (ops_cpu's LayerNorm), attention scaled by 1/sqrt(HS).
#include "convert/convert.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/fileio.h"
#include "trainer/checkpoint.h"

#define HF_PREFIX "transformer."
#define HF_LN_EPS 1e-5   // the epsilon of our LayerNorm (model/cpu/ops_cpu_layers.c)

typedef struct {
    const char *ours, *hf;
    int transpose;   // a Conv1D weight: stored (in, out)
} NameMap;

static const NameMap GLOBAL_MAP[] = {
    {"wte", "wte.weight", 0}, {"wpe", "wpe.weight", 0},
    {"lnf.weight", "ln_f.weight", 0}, {"lnf.bias", "ln_f.bias", 0}};
static const NameMap LAYER_MAP[] = {
    {"ln1.weight", "ln_1.weight", 0},           {"ln1.bias", "ln_1.bias", 0},
    {"attn.qkv.weight", "attn.c_attn.weight", 1}, {"attn.qkv.bias", "attn.c_attn.bias", 0},
    {"attn.proj.weight", "attn.c_proj.weight", 1}, {"attn.proj.bias", "attn.c_proj.bias", 0},
    {"ln2.weight", "ln_2.weight", 0},           {"ln2.bias", "ln_2.bias", 0},
    {"mlp.fc.weight", "mlp.c_fc.weight", 1},    {"mlp.fc.bias", "mlp.c_fc.bias", 0},
    {"mlp.proj.weight", "mlp.c_proj.weight", 1}, {"mlp.proj.bias", "mlp.c_proj.bias", 0}};
#define N_GLOBAL ((int)(sizeof GLOBAL_MAP / sizeof GLOBAL_MAP[0]))
#define N_LAYER ((int)(sizeof LAYER_MAP / sizeof LAYER_MAP[0]))
// Buffers of transformers' attention that some files carry; they hold no weights.
static const char *const IGNORED_LAYER[] = {"attn.bias", "attn.masked_bias"};

// The Hugging Face name (without prefix) and layout of our parameter `ours`.
static void hf_name(const char *ours, char *hf, size_t n, int *transpose) {
    for (int i = 0; i < N_GLOBAL; i++)
        if (strcmp(ours, GLOBAL_MAP[i].ours) == 0) {
            snprintf(hf, n, "%s", GLOBAL_MAP[i].hf);
            *transpose = 0;
            return;
        }
    int l, used = 0;
    if (sscanf(ours, "h.%d.%n", &l, &used) == 1 && used > 0)
        for (int i = 0; i < N_LAYER; i++)
            if (strcmp(ours + used, LAYER_MAP[i].ours) == 0) {
                snprintf(hf, n, "h.%d.%s", l, LAYER_MAP[i].hf);
                *transpose = LAYER_MAP[i].transpose;
                return;
            }
    fatal(EXIT_RUNTIME, "convert_hf: no Hugging Face name for parameter '%s'", ours);
}

// The shape Hugging Face stores for our tensor t (V rows for wte).
static int hf_shape(const ParamTensor *t, int V, int transpose, int64_t shape[2]) {
    shape[0] = t->shape[0];
    shape[1] = t->shape[1];
    if (strcmp(t->name, "wte") == 0) shape[0] = V;
    if (transpose) {
        shape[0] = t->shape[1];
        shape[1] = t->shape[0];
    }
    return t->ndim;
}

// dst (cols, rows) = src (rows, cols) transposed.
static void transpose(float *dst, const float *src, int rows, int cols) {
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) dst[(size_t)j * rows + i] = src[(size_t)i * cols + j];
}

// ----------------------------------------------------------------------------------------------
// export

// GPT-2 computes exactly our model only without the options it lacks.
static int check_exportable(const Config *c, const char *dir, char *err, size_t errlen) {
    if (c->model.pos_embedding != POS_LEARNED)
        return set_error(err, errlen, "%s: model.pos_embedding = %s: Hugging Face GPT-2 has learned absolute "
                                      "positions only, so no GPT2LMHeadModel computes this model; export "
                                      "needs pos_embedding = learned", dir,
                         config_choice_name("model.pos_embedding", c->model.pos_embedding));
    if (c->model.n_kv_head != c->model.n_head)
        return set_error(err, errlen, "%s: model.n_kv_head = %d < model.n_head = %d (grouped-query "
                                      "attention): GPT-2's c_attn has one key/value head per query head; "
                                      "export needs n_kv_head = n_head", dir, c->model.n_kv_head,
                         c->model.n_head);
    if (c->attention.window >= 0)
        return set_error(err, errlen, "%s: attention.window = %d (sliding window): GPT-2 attends to every "
                                      "earlier position, so its logits would differ; export needs "
                                      "window = -1", dir, c->attention.window);
    return 0;
}

static char *hf_config_json(const Config *c) {
    const int V = c->model.vocab_size;
    // End-of-text doubles as BOS/EOS in GPT-2; a vocabulary without one gets null ids.
    const int eot = c->data.eot_token >= 0 ? c->data.eot_token : V == 50257 ? 50256 : -1;
    cJSON *o = cJSON_CreateObject();
    cJSON *arch = cJSON_AddArrayToObject(o, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString("GPT2LMHeadModel"));
    cJSON_AddStringToObject(o, "model_type", "gpt2");
    cJSON_AddNumberToObject(o, "vocab_size", V);
    cJSON_AddNumberToObject(o, "n_positions", c->model.max_seq_len);
    cJSON_AddNumberToObject(o, "n_ctx", c->model.max_seq_len);
    cJSON_AddNumberToObject(o, "n_embd", c->model.n_embd);
    cJSON_AddNumberToObject(o, "n_layer", c->model.n_layer);
    cJSON_AddNumberToObject(o, "n_head", c->model.n_head);
    cJSON_AddNullToObject(o, "n_inner");
    cJSON_AddStringToObject(o, "activation_function", "gelu_new");
    cJSON_AddNumberToObject(o, "layer_norm_epsilon", HF_LN_EPS);
    // Dropout rates as GPT-2 names them: attention probabilities, and the residual/embedding sites.
    cJSON_AddNumberToObject(o, "attn_pdrop", c->attention.dropout);
    cJSON_AddNumberToObject(o, "resid_pdrop", c->model.dropout);
    cJSON_AddNumberToObject(o, "embd_pdrop", c->model.dropout);
    cJSON_AddNumberToObject(o, "summary_first_dropout", 0.0);
    cJSON_AddNumberToObject(o, "initializer_range", 0.02);
    cJSON_AddBoolToObject(o, "scale_attn_weights", 1);
    cJSON_AddBoolToObject(o, "scale_attn_by_inverse_layer_idx", 0);
    cJSON_AddBoolToObject(o, "reorder_and_upcast_attn", 0);
    cJSON_AddBoolToObject(o, "tie_word_embeddings", 1);
    cJSON_AddBoolToObject(o, "use_cache", 1);
    if (eot >= 0) {
        cJSON_AddNumberToObject(o, "bos_token_id", eot);
        cJSON_AddNumberToObject(o, "eos_token_id", eot);
    } else {
        cJSON_AddNullToObject(o, "bos_token_id");
        cJSON_AddNullToObject(o, "eos_token_id");
    }
    cJSON_AddStringToObject(o, "torch_dtype", "float32");
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    return text;
}

// Writes model.safetensors and config.json of hm into the existing directory dir.
static int write_hf(HostModel *hm, const char *dir, char *err, size_t errlen) {
    GPT *m = hm->model;
    const int V = hm->cfg.model.vocab_size, n = gpt_num_tensors(m);
    float **bufs = xcalloc((size_t)n, sizeof(float *));   // transposed copies, freed at the end
    StFile f;
    st_init(&f);
    for (int i = 0; i < n; i++) {
        const ParamTensor *t = gpt_tensor(m, i);
        char name[128], hf[96];
        int tr;
        int64_t shape[2];
        hf_name(t->name, hf, sizeof hf, &tr);
        snprintf(name, sizeof name, HF_PREFIX "%s", hf);
        int ndim = hf_shape(t, V, tr, shape);
        const float *src = hm->params + t->offset;
        if (tr) {
            bufs[i] = xmalloc(t->numel * sizeof(float));
            transpose(bufs[i], src, t->shape[0], t->shape[1]);
            src = bufs[i];
        }
        st_add(&f, name, DTYPE_F32, ndim, shape, src);
    }
    // transformers refuses a safetensors file whose metadata lacks format "pt".
    st_set_meta(&f, "format", "pt");
    char path[4096 + 32];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    int rc = st_write(&f, path, err, errlen);
    st_free(&f);
    for (int i = 0; i < n; i++) free(bufs[i]);
    free(bufs);
    if (rc != 0) return -1;
    char *json = hf_config_json(&hm->cfg);
    snprintf(path, sizeof path, "%s/config.json", dir);
    rc = write_file_atomic(path, json, strlen(json), err, errlen);
    cJSON_free(json);
    return rc;
}

int convert_export_hf(const char *ckpt, const char *out, Config *c, char *err, size_t errlen) {
    if (convert_check_out(out, err, errlen) != 0) return EXIT_USAGE;
    if (!is_dir(ckpt)) return set_error(err, errlen, "--checkpoint '%s' is not a directory", ckpt), EXIT_USAGE;
    if (checkpoint_read_config(ckpt, c, err, errlen) != 0) return EXIT_USAGE;
    if (check_exportable(c, ckpt, err, errlen) != 0) return EXIT_USAGE;
    HostModel hm;
    if (convert_model_load(&hm, ckpt, err, errlen) != 0) return EXIT_USAGE;
    char tmp[4096], why[ERR_LEN];
    int rc = EXIT_OK;
    if (convert_make_tmp(out, "export", tmp, sizeof tmp, why, sizeof why) != 0 ||
        write_hf(&hm, tmp, why, sizeof why) != 0 || convert_publish(tmp, out, why, sizeof why) != 0) {
        remove_tree(tmp);
        set_error(err, errlen, "writing '%s' failed: %s (no partial output was kept)", out, why);
        rc = EXIT_RUNTIME;
    }
    convert_model_free(&hm);
    return rc;
}

// ----------------------------------------------------------------------------------------------
// import

static const cJSON *json_get(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

// An integer field of config.json into *x. Returns 0, or -1 with err naming the key.
static int json_int(const cJSON *o, const char *key, int *x, const char *path, char *err, size_t errlen) {
    const cJSON *v = json_get(o, key);
    if (!v) return set_error(err, errlen, "%s: key '%s' is missing", path, key);
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 1 ||
        v->valuedouble > 2147483647.0)
        return set_error(err, errlen, "%s: '%s' must be a positive integer", path, key);
    *x = (int)v->valuedouble;
    return 0;
}

// A boolean field that must have `want` (absent means transformers' default `def`).
static int json_bool_is(const cJSON *o, const char *key, int def, int want, const char *why,
                        const char *path, char *err, size_t errlen) {
    const cJSON *v = json_get(o, key);
    if (v && !cJSON_IsBool(v)) return set_error(err, errlen, "%s: '%s' must be true or false", path, key);
    int have = v ? cJSON_IsTrue(v) : def;
    if (have != want)
        return set_error(err, errlen, "%s: %s = %s is not supported: %s", path, key,
                         have ? "true" : "false", why);
    return 0;
}

// Reads the architecture from config.json and checks it is the GPT-2 flashgpt computes.
static int read_hf_config(const char *path, GPTConfig *g, char *err, size_t errlen) {
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return set_error(err, errlen, "'%s' is missing: a Hugging Face model directory holds config.json "
                                      "and model.safetensors", path);
    fclose(fp);
    char *text = read_file_or_die(path, NULL);
    cJSON *o = cJSON_Parse(text);
    free(text);
    if (!o || !cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return set_error(err, errlen, "%s: not a valid JSON object", path);
    }
    memset(g, 0, sizeof *g);
    int rc = 0;
    const cJSON *mt = json_get(o, "model_type"), *act = json_get(o, "activation_function");
    const cJSON *eps = json_get(o, "layer_norm_epsilon"), *inner = json_get(o, "n_inner");
    if (mt && (!cJSON_IsString(mt) || strcmp(mt->valuestring, "gpt2") != 0))
        rc = set_error(err, errlen, "%s: model_type '%s' is not supported: only gpt2 models import", path,
                       cJSON_IsString(mt) ? mt->valuestring : "?");
    if (rc == 0) rc = json_int(o, "n_embd", &g->C, path, err, errlen);
    if (rc == 0) rc = json_int(o, "n_layer", &g->L, path, err, errlen);
    if (rc == 0) rc = json_int(o, "n_head", &g->NH, path, err, errlen);
    if (rc == 0) rc = json_int(o, "vocab_size", &g->V, path, err, errlen);
    const char *positions = json_get(o, "n_positions") ? "n_positions" : "n_ctx";
    if (rc == 0) rc = json_int(o, positions, &g->maxT, path, err, errlen);
    // transformers' GPT2Config defaults: gelu_new, 1e-5, n_inner 4 * n_embd.
    if (rc == 0 && act && (!cJSON_IsString(act) || (strcmp(act->valuestring, "gelu_new") != 0 &&
                                                    strcmp(act->valuestring, "gelu_pytorch_tanh") != 0)))
        rc = set_error(err, errlen, "%s: activation_function '%s' is not supported: flashgpt's MLP uses the "
                                    "tanh GELU (gelu_new)", path,
                        cJSON_IsString(act) ? act->valuestring : "?");
    // 1e-5 stored as a float32 and printed back differs from 1e-5 in the 9th digit at most.
    if (rc == 0 && eps && (!cJSON_IsNumber(eps) || fabs(eps->valuedouble - HF_LN_EPS) > 1e-9))
        rc = set_error(err, errlen, "%s: layer_norm_epsilon %g is not supported: flashgpt's LayerNorm uses "
                                    "1e-5", path, cJSON_IsNumber(eps) ? eps->valuedouble : NAN);
    if (rc == 0 && inner && (!cJSON_IsNumber(inner) || inner->valuedouble != 4.0 * g->C))
        rc = set_error(err, errlen, "%s: n_inner must be null or 4 * n_embd (%d): flashgpt's MLP is 4C wide",
                       path, 4 * g->C);
    if (rc == 0)
        rc = json_bool_is(o, "scale_attn_weights", 1, 1, "flashgpt scales attention by 1/sqrt(head size)",
                          path, err, errlen);
    if (rc == 0)
        rc = json_bool_is(o, "scale_attn_by_inverse_layer_idx", 0, 0, "flashgpt does not scale attention "
                          "by layer", path, err, errlen);
    if (rc == 0)
        rc = json_bool_is(o, "tie_word_embeddings", 1, 1, "flashgpt ties the output head to wte", path,
                          err, errlen);
    if (rc == 0)
        rc = json_bool_is(o, "add_cross_attention", 0, 0, "flashgpt is decoder-only", path, err, errlen);
    cJSON_Delete(o);
    if (rc == 0 && g->C % g->NH != 0)
        rc = set_error(err, errlen, "%s: n_embd %d is not divisible by n_head %d", path, g->C, g->NH);
    return rc;
}

// The tensor named hf in f, with or without the "transformer." prefix.
static const StTensor *find_hf(const StFile *f, const char *hf) {
    char name[160];
    snprintf(name, sizeof name, HF_PREFIX "%s", hf);
    const StTensor *t = st_find(f, name);
    return t ? t : st_find(f, hf);
}

// Every tensor of the file must be a weight of this GPT-2, or an attention buffer, or lm_head.
static int check_no_strangers(const StFile *f, int L, const char *path, char *err, size_t errlen) {
    for (int i = 0; i < f->n; i++) {
        const char *name = f->tensors[i].name;
        if (strncmp(name, HF_PREFIX, strlen(HF_PREFIX)) == 0) name += strlen(HF_PREFIX);
        int known = strcmp(name, "lm_head.weight") == 0;
        for (int k = 0; k < N_GLOBAL && !known; k++) known = strcmp(name, GLOBAL_MAP[k].hf) == 0;
        int l, used = 0;
        if (!known && sscanf(name, "h.%d.%n", &l, &used) == 1 && used > 0 && l >= 0 && l < L) {
            for (int k = 0; k < N_LAYER && !known; k++) known = strcmp(name + used, LAYER_MAP[k].hf) == 0;
            for (int k = 0; k < 2 && !known; k++) known = strcmp(name + used, IGNORED_LAYER[k]) == 0;
        }
        if (!known)
            return set_error(err, errlen, "%s: unexpected tensor '%s': not a weight of a GPT-2 with "
                                          "n_layer = %d", path, f->tensors[i].name, L);
    }
    return 0;
}

static int check_tensor(const StTensor *s, const char *hf, int ndim, const int64_t *shape,
                        const char *path, char *err, size_t errlen) {
    char want[64], have[64];
    if (!s) return set_error(err, errlen, "%s: tensor '%s' (or '" HF_PREFIX "%s') is missing", path, hf, hf);
    if (s->dtype != DTYPE_F32 && s->dtype != DTYPE_BF16 && s->dtype != DTYPE_F16)
        return set_error(err, errlen, "%s: tensor '%s' has an integer dtype: expected F32, BF16 or F16", path,
                         s->name);
    int same = s->ndim == ndim;
    for (int d = 0; d < ndim && same; d++) same = s->shape[d] == shape[d];
    if (same) return 0;
    if (ndim == 2) snprintf(want, sizeof want, "(%lld, %lld)", (long long)shape[0], (long long)shape[1]);
    else snprintf(want, sizeof want, "(%lld)", (long long)shape[0]);
    int n = snprintf(have, sizeof have, "(");
    for (int d = 0; d < s->ndim && n < (int)sizeof have; d++)
        n += snprintf(have + n, sizeof have - (size_t)n, d ? ", %lld" : "%lld", (long long)s->shape[d]);
    if (n < (int)sizeof have) snprintf(have + n, sizeof have - (size_t)n, ")");
    return set_error(err, errlen, "%s: tensor '%s' has shape %s, expected %s from config.json", path, s->name,
                     have, want);
}

// Before the model is built: the tensors that fix its size must be in the file with the shapes
// config.json gives, so a wrong config cannot make us allocate a model the file does not hold.
static int check_size_tensors(const StFile *f, const GPTConfig *g, const char *path, char *err,
                              size_t errlen) {
    char last[64];
    snprintf(last, sizeof last, "h.%d.mlp.c_proj.weight", g->L - 1);
    const int64_t wte[2] = {g->V, g->C}, wpe[2] = {g->maxT, g->C}, proj[2] = {4LL * g->C, g->C};
    if (check_tensor(find_hf(f, "wte.weight"), "wte.weight", 2, wte, path, err, errlen) != 0 ||
        check_tensor(find_hf(f, "wpe.weight"), "wpe.weight", 2, wpe, path, err, errlen) != 0 ||
        check_tensor(find_hf(f, last), last, 2, proj, path, err, errlen) != 0)
        return -1;
    return 0;
}

// Validates every tensor against hm's model, then fills hm->params.
static int fill_from_hf(HostModel *hm, const StFile *f, const char *path, char *err, size_t errlen) {
    GPT *m = hm->model;
    const GPTConfig *g = gpt_cfg(m);
    const int n = gpt_num_tensors(m);
    if (check_no_strangers(f, g->L, path, err, errlen) != 0) return -1;
    for (int i = 0; i < n; i++) {
        const ParamTensor *t = gpt_tensor(m, i);
        char hf[96];
        int tr;
        int64_t shape[2];
        hf_name(t->name, hf, sizeof hf, &tr);
        int ndim = hf_shape(t, g->V, tr, shape);
        if (check_tensor(find_hf(f, hf), hf, ndim, shape, path, err, errlen) != 0) return -1;
    }
    float *tmp = NULL;
    size_t tmp_cap = 0;
    for (int i = 0; i < n; i++) {
        const ParamTensor *t = gpt_tensor(m, i);
        char hf[96];
        int tr;
        hf_name(t->name, hf, sizeof hf, &tr);
        const StTensor *s = find_hf(f, hf);
        size_t numel = s->nbytes / dtype_size(s->dtype);   // V rows of wte: fewer than t->numel
        float *dst = hm->params + t->offset;
        if (!tr) {
            convert_to_f32(dst, s->data, s->dtype, numel);
            continue;
        }
        if (numel > tmp_cap) tmp = xrealloc(tmp, (tmp_cap = numel) * sizeof(float));
        convert_to_f32(tmp, s->data, s->dtype, numel);
        transpose(dst, tmp, t->shape[1], t->shape[0]);   // (in, out) -> (out, in)
    }
    free(tmp);
    // An lm_head.weight that differs from wte would be an untied head we cannot represent.
    const StTensor *head = st_find(f, "lm_head.weight");
    if (!head) return 0;
    const size_t n_wte = (size_t)g->V * g->C;
    int64_t wte_shape[2] = {g->V, g->C};
    if (check_tensor(head, "lm_head.weight", 2, wte_shape, path, err, errlen) != 0) return -1;
    float *h = xmalloc(n_wte * sizeof(float));
    convert_to_f32(h, head->data, head->dtype, n_wte);
    int same = memcmp(h, convert_param(hm, "wte", NULL), n_wte * sizeof(float)) == 0;
    free(h);
    if (!same)
        return set_error(err, errlen, "%s: lm_head.weight differs from wte.weight: flashgpt ties the output "
                                      "head to the token embedding and cannot hold an untied head", path);
    return 0;
}

int convert_read_hf(const char *dir, HostModel *hm, char *err, size_t errlen) {
    if (!is_dir(dir)) return set_error(err, errlen, "--from hf '%s' is not a directory", dir);
    char cfg_path[4096], st_path[4096], other[4096];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", dir);
    snprintf(st_path, sizeof st_path, "%s/model.safetensors", dir);
    GPTConfig g;
    if (read_hf_config(cfg_path, &g, err, errlen) != 0) return -1;
    if (!path_exists(st_path)) {
        snprintf(other, sizeof other, "%s/model.safetensors.index.json", dir);
        if (path_exists(other))
            return set_error(err, errlen, "'%s': sharded safetensors are not supported: save the model as "
                                          "one model.safetensors (save_pretrained(..., "
                                          "max_shard_size=\"100GB\"))", dir);
        return set_error(err, errlen, "'%s' is missing (only safetensors weights are read: save with "
                                      "save_pretrained(..., safe_serialization=True))", st_path);
    }
    Config c;
    if (convert_import_config(&c, &g, cfg_path, err, errlen) != 0) return -1;
    StFile f;
    if (st_read(&f, st_path, err, errlen) != 0) return -1;
    if (check_size_tensors(&f, &g, st_path, err, errlen) != 0) {
        st_free(&f);
        return -1;
    }
    convert_model_create(hm, &c);
    int rc = fill_from_hf(hm, &f, st_path, err, errlen);
    st_free(&f);
    if (rc != 0) convert_model_free(hm);
    return rc;
}
