// convert_hf: Hugging Face transformers <-> flashgpt checkpoints, for the architectures of
// convert/hf_arch.h. A Hugging Face directory holds config.json and model.safetensors.
//
// Export picks the closest architecture that computes exactly our model, or refuses with the
// reason: learned positions -> gpt2; RoPE over the whole head (with GQA and/or one window on
// every layer) -> starcoder2; partial RoPE (model.rope_dims) -> gpt_neox. The output head is
// tied to the token embedding, which has V rows: our padded rows [V, Vp) are dropped on export
// and zero-filled on import. Import reads config.json's model_type, checks every option it
// declares against what flashgpt computes, then every tensor's presence, dtype and shape before
// the model is built; names are accepted with or without the architecture's prefix
// ("transformer.", "model.", "gpt_neox.").
#include "convert/convert.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/fileio.h"
#include "convert/hf_arch.h"
#include "trainer/checkpoint.h"

// ----------------------------------------------------------------------------------------------
// plans

HfTensor *hf_plan_add(HfPlan *p, const char *hf, const char *ours, int ndim, int rows, int width,
                      int row0, int transpose) {
    if (p->n == p->cap) p->t = xrealloc(p->t, (size_t)(p->cap = p->cap ? 2 * p->cap : 64) * sizeof *p->t);
    HfTensor *t = &p->t[p->n++];
    *t = (HfTensor){.rows = rows, .width = width, .row0 = row0, .transpose = transpose, .ndim = ndim};
    snprintf(t->hf, sizeof t->hf, "%s", hf);
    snprintf(t->ours, sizeof t->ours, "%s", ours);
    return t;
}

int *hf_plan_map(HfPlan *p, int n) {
    if (p->maps) fatal(EXIT_RUNTIME, "convert_hf: a plan holds one row map");
    p->maps = xmalloc((size_t)n * sizeof(int));
    p->n_maps = n;
    return p->maps;
}

void hf_plan_free(HfPlan *p) {
    free(p->t);
    free(p->maps);
    memset(p, 0, sizeof *p);
}

// The shape of our per-layer tensor `suffix` ("attn.qkv.weight") in a model of shape g.
static void layer_shape(const GPTConfig *g, const char *suffix, int *ndim, int *rows, int *width) {
    const int C = g->C, QKV = (g->NH + 2 * g->NKV) * (g->C / g->NH);
    const int is_w = strstr(suffix, ".weight") != NULL && strncmp(suffix, "ln", 2) != 0;
    *rows = strncmp(suffix, "attn.qkv", 8) == 0 ? QKV : strncmp(suffix, "mlp.fc", 6) == 0 ? 4 * C : C;
    *width = !is_w ? 1 : strncmp(suffix, "mlp.proj", 8) == 0 ? 4 * C : C;
    *ndim = is_w ? 2 : 1;
}

void hf_plan_layer_pairs(HfPlan *p, const GPTConfig *g, const char *fmt, int l, const HfPair *pairs,
                         int n) {
    char pre[32], hf[96], ours[64];
    snprintf(pre, sizeof pre, fmt, l);
    for (int i = 0; i < n; i++) {
        int ndim, rows, width;
        layer_shape(g, pairs[i].ours, &ndim, &rows, &width);
        snprintf(hf, sizeof hf, "%s%s", pre, pairs[i].hf);
        snprintf(ours, sizeof ours, "h.%d.%s", l, pairs[i].ours);
        hf_plan_add(p, hf, ours, ndim, rows, width, 0, pairs[i].transpose);
    }
}

// The shape Hugging Face stores for t.
static int stored_shape(const HfTensor *t, int64_t shape[2]) {
    shape[0] = t->transpose ? t->width : t->rows;
    shape[1] = t->transpose ? t->rows : t->width;
    return t->ndim;
}

static int our_row(const HfTensor *t, int r) { return t->row_map ? t->row_map[r] : t->row0 + r; }

// ----------------------------------------------------------------------------------------------
// export

// The architecture that computes exactly the model of c, or -1 with the reason in err.
static int choose_arch(const Config *c, const char *dir, const HfArch **arch, char *err, size_t errlen) {
    const int HS = c->model.n_embd / c->model.n_head;
    const int partial = c->model.rope_dims > 0 && c->model.rope_dims < HS;
    const int gqa = c->model.n_kv_head != c->model.n_head, window = c->attention.window >= 0;
    if (c->model.pos_embedding == POS_ALIBI)
        return set_error(err, errlen, "%s: model.pos_embedding = alibi: no Hugging Face architecture "
                                      "computes this block with ALiBi (BLOOM adds a LayerNorm after the "
                                      "embedding, MPT uses the exact erf GELU); export needs learned or "
                                      "rope positions", dir);
    if (c->model.pos_embedding == POS_LEARNED && (gqa || window)) {
        char what[128];
        if (gqa) snprintf(what, sizeof what, "model.n_kv_head = %d < model.n_head = %d (grouped-query "
                          "attention)", c->model.n_kv_head, c->model.n_head);
        else snprintf(what, sizeof what, "attention.window = %d (sliding window)", c->attention.window);
        return set_error(err, errlen, "%s: %s with learned positions: Hugging Face GPT-2 has one key/value "
                                      "head per query head and attends to every earlier position; export "
                                      "needs n_kv_head = n_head and attention.window = -1, or "
                                      "pos_embedding = rope (Starcoder2)", dir, what);
    }
    if (c->attention.sparse != 0)
        return set_error(err, errlen, "%s: attention.sparse = %s (block-sparse attention): no Hugging Face "
                                      "architecture computes these blocks; export needs attention.sparse = none",
                         dir, config_choice_name("attention.sparse", c->attention.sparse));
    if (window && c->attention.window_every > 1)
        return set_error(err, errlen, "%s: attention.window_every = %d (windowed and global layers "
                                      "alternate): Starcoder2's sliding_window applies to every layer; "
                                      "export needs window_every = 1", dir, c->attention.window_every);
    if (partial && (gqa || window))
        return set_error(err, errlen, "%s: model.rope_dims = %d < head size %d with %s: partial RoPE "
                                      "exports as GPT-NeoX, which has one key/value head per query head "
                                      "and no sliding window, and Starcoder2 rotates the whole head",
                         dir, c->model.rope_dims, HS, gqa ? "grouped-query attention" : "a sliding window");
    *arch = c->model.pos_embedding == POS_LEARNED ? &HF_GPT2 : partial ? &HF_NEOX : &HF_STARCODER2;
    return 0;
}

// Writes model.safetensors and config.json of hm as architecture a into the existing dir.
static int write_hf(HostModel *hm, const HfArch *a, const char *dir, char *err, size_t errlen) {
    GPTConfig g = gpt_config_from(&hm->cfg);
    HfPlan p = {0};
    a->plan(&g, &p);
    float **bufs = xcalloc((size_t)p.n, sizeof(float *));   // gathered copies, freed at the end
    StFile f;
    st_init(&f);
    for (int i = 0; i < p.n; i++) {
        const HfTensor *t = &p.t[i];
        const ParamTensor *pt;
        const float *src = convert_param(hm, t->ours, &pt);
        const size_t W = (size_t)t->width;
        if (t->row_map || t->transpose) {
            float *b = bufs[i] = xmalloc((size_t)t->rows * W * sizeof(float));
            for (int r = 0; r < t->rows; r++)
                for (size_t j = 0; j < W; j++) {
                    const float x = src[(size_t)our_row(t, r) * W + j];
                    if (t->transpose) b[j * t->rows + r] = x;
                    else b[r * W + j] = x;
                }
            src = b;
        } else {
            src += (size_t)t->row0 * W;
        }
        char name[160];
        int64_t shape[2];
        snprintf(name, sizeof name, "%s%s", a->prefix, t->hf);
        st_add(&f, name, DTYPE_F32, stored_shape(t, shape), shape, src);
    }
    // transformers refuses a safetensors file whose metadata lacks format "pt".
    st_set_meta(&f, "format", "pt");
    char path[4096 + 32];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    int rc = st_write(&f, path, err, errlen);
    st_free(&f);
    for (int i = 0; i < p.n; i++) free(bufs[i]);
    free(bufs);
    hf_plan_free(&p);
    if (rc != 0) return -1;
    cJSON *o = a->config_json(&hm->cfg);
    char *json = cJSON_Print(o);
    cJSON_Delete(o);
    snprintf(path, sizeof path, "%s/config.json", dir);
    rc = write_file_atomic(path, json, strlen(json), err, errlen);
    cJSON_free(json);
    return rc;
}

int convert_export_hf(const char *ckpt, const char *out, Config *c, const char **arch_name, char *err,
                      size_t errlen) {
    if (convert_check_out(out, err, errlen) != 0) return EXIT_USAGE;
    if (!is_dir(ckpt)) return set_error(err, errlen, "--checkpoint '%s' is not a directory", ckpt), EXIT_USAGE;
    if (checkpoint_read_config(ckpt, c, err, errlen) != 0) return EXIT_USAGE;
    const HfArch *a = NULL;
    if (choose_arch(c, ckpt, &a, err, errlen) != 0) return EXIT_USAGE;
    *arch_name = a->class_name;
    HostModel hm;
    if (convert_model_load(&hm, ckpt, err, errlen) != 0) return EXIT_USAGE;
    char tmp[4096], why[ERR_LEN];
    int rc = EXIT_OK;
    if (convert_make_tmp(out, "export", tmp, sizeof tmp, why, sizeof why) != 0 ||
        write_hf(&hm, a, tmp, why, sizeof why) != 0 || convert_publish(tmp, out, why, sizeof why) != 0) {
        remove_tree(tmp);
        set_error(err, errlen, "writing '%s' failed: %s (no partial output was kept)", out, why);
        rc = EXIT_RUNTIME;
    }
    convert_model_free(&hm);
    return rc;
}

// ----------------------------------------------------------------------------------------------
// import: config.json

static const HfArch *const ARCHS[] = {&HF_GPT2, &HF_STARCODER2, &HF_NEOX};
#define N_ARCHS ((int)(sizeof ARCHS / sizeof ARCHS[0]))

// The architecture, shape, window and tie of config.json's text (len bytes; path names it).
static int parse_config(const char *text, size_t len, const char *path, const HfArch **arch,
                        GPTConfig *g, int *window, int *tied, char *err, size_t errlen) {
    cJSON *o = cJSON_ParseWithLength(text, len);
    if (!o || !cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return set_error(err, errlen, "%s: not a valid JSON object", path);
    }
    memset(g, 0, sizeof *g);
    const cJSON *mt = hf_json_get(o, "model_type");
    *arch = mt ? NULL : &HF_GPT2;   // the oldest GPT-2 configs name no model_type
    for (int i = 0; i < N_ARCHS && mt && cJSON_IsString(mt); i++)
        if (strcmp(mt->valuestring, ARCHS[i]->model_type) == 0) *arch = ARCHS[i];
    int rc = 0;
    if (!*arch)
        rc = set_error(err, errlen, "%s: model_type '%s' is not supported: flashgpt imports gpt2, "
                                    "starcoder2 and gpt_neox", path, cJSON_IsString(mt) ? mt->valuestring : "?");
    if (rc == 0) rc = (*arch)->parse(o, path, g, window, tied, err, errlen);
    if (rc == 0 && hf_json_get(o, "add_cross_attention"))
        rc = hf_json_bool_is(o, "add_cross_attention", 0, 0, "flashgpt is decoder-only", path, err, errlen);
    cJSON_Delete(o);
    if (rc == 0 && g->C % g->NH != 0)
        rc = set_error(err, errlen, "%s: the width %d is not divisible by the %d heads", path, g->C, g->NH);
    if (rc == 0 && g->NH % g->NKV != 0)
        rc = set_error(err, errlen, "%s: the %d query heads are not divisible by the %d key/value heads", path,
                       g->NH, g->NKV);
    return rc;
}

int convert_hf_parse_config(const char *text, size_t len, const char *path, GPTConfig *g, int *window,
                            char *err, size_t errlen) {
    const HfArch *a;
    int tied;
    return parse_config(text, len, path, &a, g, window, &tied, err, errlen);
}

// ----------------------------------------------------------------------------------------------
// import: tensors

// The tensor named hf in f, with or without the architecture's prefix.
static const StTensor *find_hf(const StFile *f, const HfArch *a, const char *hf) {
    char name[200];
    snprintf(name, sizeof name, "%s%s", a->prefix, hf);
    const StTensor *t = st_find(f, name);
    return t ? t : st_find(f, hf);
}

static int check_tensor(const StTensor *s, const char *hf, const char *prefix, int ndim, const int64_t *shape,
                        const char *path, char *err, size_t errlen) {
    char want[64], have[64];
    if (!s) return set_error(err, errlen, "%s: tensor '%s' (or '%s%s') is missing", path, hf, prefix, hf);
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

static int ends_with(const char *s, const char *suffix) {
    const size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

// Every tensor of the file must be in the plan, the head, or a buffer that holds no weights.
static int check_no_strangers(const StFile *f, const HfArch *a, const HfPlan *p, int L, const char *path,
                              char *err, size_t errlen) {
    const size_t np = strlen(a->prefix);
    for (int i = 0; i < f->n; i++) {
        const char *name = f->tensors[i].name;
        if (strncmp(name, a->prefix, np) == 0) name += np;
        int known = strcmp(f->tensors[i].name, a->head) == 0;
        for (int k = 0; a->ignored[k] && !known; k++) known = ends_with(name, a->ignored[k]);
        for (int k = 0; k < p->n && !known; k++) known = strcmp(name, p->t[k].hf) == 0;
        if (!known)
            return set_error(err, errlen, "%s: unexpected tensor '%s': not a weight of a %s with "
                                          "%d layers", path, f->tensors[i].name, a->model_type, L);
    }
    return 0;
}

// Before the model is built: every tensor of the plan must be in the file with the shape
// config.json gives, so a wrong config cannot make us allocate a model the file does not hold.
// The matrices of the last layers go first, where a wrong layer count or width shows.
static int check_plan(const StFile *f, const HfArch *a, const HfPlan *p, const GPTConfig *g, int tied,
                      const char *path, char *err, size_t errlen) {
    for (int pass = 2; pass >= 1; pass--)
        for (int i = p->n - 1; i >= 0; i--) {
            int64_t shape[2];
            const int ndim = stored_shape(&p->t[i], shape);
            if (ndim == pass && check_tensor(find_hf(f, a, p->t[i].hf), p->t[i].hf, a->prefix, ndim, shape,
                                             path, err, errlen) != 0)
                return -1;
        }
    if (check_no_strangers(f, a, p, g->L, path, err, errlen) != 0) return -1;
    const StTensor *head = st_find(f, a->head);
    if (!head && !tied)
        return set_error(err, errlen, "%s: tie_word_embeddings is false but '%s' is missing", path, a->head);
    const int64_t embed[2] = {g->V, g->C};
    return head ? check_tensor(head, a->head, "", 2, embed, path, err, errlen) : 0;
}

// Fills hm->params from the validated file. The head, where the file holds one, must equal the
// embedding: flashgpt cannot hold an untied head.
static int fill_params(HostModel *hm, const StFile *f, const HfArch *a, const HfPlan *p, const char *path,
                       char *err, size_t errlen) {
    float *tmp = NULL, *rows = NULL;
    size_t cap = 0;
    for (int i = 0; i < p->n; i++) {
        const HfTensor *t = &p->t[i];
        const StTensor *s = find_hf(f, a, t->hf);
        const size_t W = (size_t)t->width, numel = (size_t)t->rows * W;
        float *dst = convert_param(hm, t->ours, NULL);
        if (numel > cap) {
            tmp = xrealloc(tmp, (cap = numel) * sizeof(float));
            rows = xrealloc(rows, cap * sizeof(float));
        }
        convert_to_f32(tmp, s->data, s->dtype, numel);
        const float *src = tmp;
        if (t->transpose) {   // stored (width, rows)
            for (int r = 0; r < t->rows; r++)
                for (size_t j = 0; j < W; j++) rows[r * W + j] = tmp[j * t->rows + r];
            src = rows;
        }
        for (int r = 0; r < t->rows; r++)
            memcpy(dst + (size_t)our_row(t, r) * W, src + r * W, W * sizeof(float));
    }
    free(tmp);
    free(rows);
    const StTensor *head = st_find(f, a->head);
    if (!head) return 0;
    const GPTConfig *g = gpt_cfg(hm->model);
    const size_t n_wte = (size_t)g->V * g->C;
    float *h = xmalloc(n_wte * sizeof(float));
    convert_to_f32(h, head->data, head->dtype, n_wte);
    const int same = memcmp(h, convert_param(hm, "wte", NULL), n_wte * sizeof(float)) == 0;
    free(h);
    if (!same)
        return set_error(err, errlen, "%s: %s differs from %s: flashgpt ties the output head to the token "
                                      "embedding and cannot hold an untied head", path, a->head, a->embed);
    return 0;
}

int convert_read_hf(const char *dir, HostModel *hm, char *err, size_t errlen) {
    if (!is_dir(dir)) return set_error(err, errlen, "--from hf '%s' is not a directory", dir);
    char cfg_path[4096], st_path[4096], other[4096], why[ERR_LEN];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", dir);
    snprintf(st_path, sizeof st_path, "%s/model.safetensors", dir);
    size_t len;
    char *text = read_file(cfg_path, &len, why, sizeof why);
    if (!text)
        return set_error(err, errlen, "'%s' is missing or unreadable (%s): a Hugging Face model "
                                      "directory holds config.json and model.safetensors", cfg_path, why);
    const HfArch *a = NULL;
    GPTConfig g;
    int window, tied;
    const int rc_cfg = parse_config(text, len, cfg_path, &a, &g, &window, &tied, err, errlen);
    free(text);
    if (rc_cfg != 0) return -1;
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
    if (convert_import_config(&c, &g, window, cfg_path, err, errlen) != 0) return -1;
    StFile f;
    if (st_read(&f, st_path, err, errlen) != 0) return -1;
    HfPlan p = {0};
    a->plan(&g, &p);
    int rc = check_plan(&f, a, &p, &g, tied, st_path, err, errlen);
    if (rc == 0) {
        convert_model_create(hm, &c);
        rc = fill_params(hm, &f, a, &p, st_path, err, errlen);
        if (rc != 0) convert_model_free(hm);
    }
    hf_plan_free(&p);
    st_free(&f);
    return rc;
}
