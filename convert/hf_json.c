// hf_json: the config.json pieces the Hugging Face architectures share (convert/hf_arch.h):
// the keys every export writes, and the readers of the keys every import checks.
#include "convert/hf_arch.h"

#include <math.h>
#include <string.h>

#include "common/check.h"

#define HF_LN_EPS 1e-5   // the epsilon of our LayerNorm (model/cpu/ops_cpu_layers.c)

cJSON *hf_json_common(const Config *c, const HfArch *a) {
    const int V = c->model.vocab_size;
    // End-of-text doubles as BOS/EOS in GPT-2; a vocabulary without one gets null ids.
    const int eot = c->data.eot_token >= 0 ? c->data.eot_token : V == 50257 ? 50256 : -1;
    cJSON *o = cJSON_CreateObject();
    cJSON *arch = cJSON_AddArrayToObject(o, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString(a->class_name));
    cJSON_AddStringToObject(o, "model_type", a->model_type);
    cJSON_AddNumberToObject(o, "vocab_size", V);
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
    cJSON_AddNumberToObject(o, "initializer_range", 0.02);
    return o;
}

cJSON *hf_json_common_rotary(const Config *c, const HfArch *a) {
    cJSON *o = hf_json_common(c, a);
    cJSON_AddNumberToObject(o, "hidden_size", c->model.n_embd);
    cJSON_AddNumberToObject(o, "intermediate_size", 4.0 * c->model.n_embd);
    cJSON_AddNumberToObject(o, "num_hidden_layers", c->model.n_layer);
    cJSON_AddNumberToObject(o, "num_attention_heads", c->model.n_head);
    cJSON_AddNumberToObject(o, "max_position_embeddings", c->model.max_seq_len);
    cJSON_AddStringToObject(o, "hidden_act", "gelu_pytorch_tanh");
    cJSON_AddNullToObject(o, "rope_scaling");
    cJSON_AddNumberToObject(o, "attention_dropout", c->attention.dropout);
    return o;
}

const cJSON *hf_json_get(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

int hf_json_int(const cJSON *o, const char *key, int *x, const char *path, char *err, size_t errlen) {
    const cJSON *v = hf_json_get(o, key);
    if (!v) return set_error(err, errlen, "%s: key '%s' is missing", path, key);
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 1 ||
        v->valuedouble > 2147483647.0)
        return set_error(err, errlen, "%s: '%s' must be a positive integer", path, key);
    *x = (int)v->valuedouble;
    return 0;
}

int hf_json_dims(const cJSON *o, GPTConfig *g, const char *path, char *err, size_t errlen) {
    if (hf_json_int(o, "hidden_size", &g->C, path, err, errlen) != 0 ||
        hf_json_int(o, "num_hidden_layers", &g->L, path, err, errlen) != 0 ||
        hf_json_int(o, "num_attention_heads", &g->NH, path, err, errlen) != 0 ||
        hf_json_int(o, "vocab_size", &g->V, path, err, errlen) != 0 ||
        hf_json_int(o, "max_position_embeddings", &g->maxT, path, err, errlen) != 0)
        return -1;
    g->NKV = g->NH;
    return 0;
}

int hf_json_bool(const cJSON *o, const char *key, int def, int *x, const char *path, char *err,
                 size_t errlen) {
    const cJSON *v = hf_json_get(o, key);
    if (v && !cJSON_IsBool(v)) return set_error(err, errlen, "%s: '%s' must be true or false", path, key);
    *x = v ? cJSON_IsTrue(v) : def;
    return 0;
}

int hf_json_bool_is(const cJSON *o, const char *key, int def, int want, const char *why,
                    const char *path, char *err, size_t errlen) {
    int have;
    if (hf_json_bool(o, key, def, &have, path, err, errlen) != 0) return -1;
    if (have != want)
        return set_error(err, errlen, "%s: %s = %s is not supported: %s", path, key,
                         have ? "true" : "false", why);
    return 0;
}

int hf_json_tanh_gelu(const cJSON *o, const char *key, int def_ok, const char *path, char *err,
                      size_t errlen) {
    const cJSON *act = hf_json_get(o, key);
    const int ok = act ? cJSON_IsString(act) && (strcmp(act->valuestring, "gelu_new") == 0 ||
                                                 strcmp(act->valuestring, "gelu_pytorch_tanh") == 0)
                       : def_ok;
    if (ok) return 0;
    return set_error(err, errlen, "%s: %s '%s' is not supported: flashgpt's MLP uses the tanh GELU "
                                  "(gelu_new or gelu_pytorch_tanh)", path, key,
                     act && cJSON_IsString(act) ? act->valuestring : act ? "?" : "(the default)");
}

int hf_json_ln_eps(const cJSON *o, const char *key, const char *path, char *err, size_t errlen) {
    const cJSON *eps = hf_json_get(o, key);
    // 1e-5 stored as a float32 and printed back differs from 1e-5 in the 9th digit at most.
    if (eps && (!cJSON_IsNumber(eps) || fabs(eps->valuedouble - HF_LN_EPS) > 1e-9))
        return set_error(err, errlen, "%s: %s %g is not supported: flashgpt's LayerNorm uses 1e-5", path,
                         key, cJSON_IsNumber(eps) ? eps->valuedouble : NAN);
    return 0;
}

int hf_json_mlp_width(const cJSON *o, const char *key, int C, int null_ok, const char *path, char *err,
                      size_t errlen) {
    const cJSON *inner = hf_json_get(o, key);
    if (!inner && null_ok) return 0;
    if (!inner) return set_error(err, errlen, "%s: key '%s' is missing", path, key);
    if (!cJSON_IsNumber(inner) || inner->valuedouble != 4.0 * C)
        return set_error(err, errlen, "%s: %s must be %s4 * hidden width (%lld): flashgpt's MLP is 4C wide",
                         path, key, null_ok ? "null or " : "", 4LL * C);   // C: any positive int here
    return 0;
}

int hf_json_rope_theta(const cJSON *o, const char *key, float *theta, const char *path, char *err,
                       size_t errlen) {
    const cJSON *scaling = hf_json_get(o, "rope_scaling"), *params = hf_json_get(o, "rope_parameters");
    const cJSON *v = hf_json_get(o, key);
    if (scaling)
        return set_error(err, errlen, "%s: rope_scaling is not supported: flashgpt's RoPE has no "
                                      "scaling (set it to null)", path);
    if (params) {
        const cJSON *type = hf_json_get(params, "rope_type");
        if (type && (!cJSON_IsString(type) || strcmp(type->valuestring, "default") != 0))
            return set_error(err, errlen, "%s: rope_parameters.rope_type '%s' is not supported: flashgpt's "
                                          "RoPE is the default type", path,
                             cJSON_IsString(type) ? type->valuestring : "?");
        if (!v) v = hf_json_get(params, "rope_theta");
    }
    if (v && (!cJSON_IsNumber(v) || !(v->valuedouble >= 1.0 && v->valuedouble <= 1e9)))
        return set_error(err, errlen, "%s: the RoPE base %s must be a number in [1, 1e9]", path, key);
    *theta = v ? (float)v->valuedouble : 10000.0f;
    return 0;
}
