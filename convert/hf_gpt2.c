// hf_gpt2: Hugging Face GPT-2 (GPT2LMHeadModel), the target of models with learned positions.
//
// GPT-2's linear layers are Conv1D modules whose weights are stored (in, out), the transpose of
// our PyTorch-Linear (out, in) layout; c_attn fuses q | k | v along `out` exactly like our qkv.
// Names (export adds the "transformer." prefix that GPT2LMHeadModel.save_pretrained writes):
//   wte -> wte.weight (V, C)        wpe -> wpe.weight (maxT, C)    lnf -> ln_f.{weight,bias}
//   h.{l}.ln1 -> h.{l}.ln_1         h.{l}.attn.qkv -> h.{l}.attn.c_attn (transposed weight)
//   h.{l}.attn.proj -> h.{l}.attn.c_proj (T)  h.{l}.ln2 -> h.{l}.ln_2
//   h.{l}.mlp.fc -> h.{l}.mlp.c_fc (T)        h.{l}.mlp.proj -> h.{l}.mlp.c_proj (T)
// The arithmetic matches transformers' GPT-2 with activation_function gelu_new (tanh GELU, as
// our EPI_GELU), layer_norm_epsilon 1e-5 (ops_cpu's LayerNorm), attention scaled by 1/sqrt(HS).
#include "convert/hf_arch.h"

#include <string.h>

#include "common/check.h"

static cJSON *gpt2_config_json(const Config *c) {
    cJSON *o = hf_json_common(c, &HF_GPT2);
    cJSON_AddNumberToObject(o, "n_positions", c->model.max_seq_len);
    cJSON_AddNumberToObject(o, "n_ctx", c->model.max_seq_len);
    cJSON_AddNumberToObject(o, "n_embd", c->model.n_embd);
    cJSON_AddNumberToObject(o, "n_layer", c->model.n_layer);
    cJSON_AddNumberToObject(o, "n_head", c->model.n_head);
    cJSON_AddNullToObject(o, "n_inner");
    cJSON_AddStringToObject(o, "activation_function", "gelu_new");
    cJSON_AddNumberToObject(o, "layer_norm_epsilon", 1e-5);
    // Dropout rates as GPT-2 names them: attention probabilities, and the residual/embedding sites.
    cJSON_AddNumberToObject(o, "attn_pdrop", c->attention.dropout);
    cJSON_AddNumberToObject(o, "resid_pdrop", c->model.dropout);
    cJSON_AddNumberToObject(o, "embd_pdrop", c->model.dropout);
    cJSON_AddNumberToObject(o, "summary_first_dropout", 0.0);
    cJSON_AddBoolToObject(o, "scale_attn_weights", 1);
    cJSON_AddBoolToObject(o, "scale_attn_by_inverse_layer_idx", 0);
    cJSON_AddBoolToObject(o, "reorder_and_upcast_attn", 0);
    return o;
}

static int gpt2_parse(const cJSON *o, const char *path, GPTConfig *g, int *window, int *tied, char *err,
                      size_t errlen) {
    *window = -1;
    *tied = 1;
    g->pos = POS_LEARNED;
    g->rope_theta = 10000.0f;
    const char *positions = hf_json_get(o, "n_positions") ? "n_positions" : "n_ctx";
    if (hf_json_int(o, "n_embd", &g->C, path, err, errlen) != 0 ||
        hf_json_int(o, "n_layer", &g->L, path, err, errlen) != 0 ||
        hf_json_int(o, "n_head", &g->NH, path, err, errlen) != 0 ||
        hf_json_int(o, "vocab_size", &g->V, path, err, errlen) != 0 ||
        hf_json_int(o, positions, &g->maxT, path, err, errlen) != 0)
        return -1;
    g->NKV = g->NH;
    // transformers' GPT2Config defaults: gelu_new, 1e-5, n_inner 4 * n_embd.
    if (hf_json_tanh_gelu(o, "activation_function", 1, path, err, errlen) != 0 ||
        hf_json_ln_eps(o, "layer_norm_epsilon", path, err, errlen) != 0 ||
        hf_json_mlp_width(o, "n_inner", g->C, 1, path, err, errlen) != 0 ||
        hf_json_bool_is(o, "scale_attn_weights", 1, 1, "flashgpt scales attention by 1/sqrt(head size)",
                        path, err, errlen) != 0 ||
        hf_json_bool_is(o, "scale_attn_by_inverse_layer_idx", 0, 0, "flashgpt does not scale attention "
                        "by layer", path, err, errlen) != 0 ||
        hf_json_bool_is(o, "tie_word_embeddings", 1, 1, "flashgpt ties the output head to wte", path,
                        err, errlen) != 0 ||
        hf_json_bool_is(o, "add_cross_attention", 0, 0, "flashgpt is decoder-only", path, err, errlen) != 0)
        return -1;
    return 0;
}

static const HfPair GPT2_LAYER[] = {
    {"ln_1.weight", "ln1.weight", 0},         {"ln_1.bias", "ln1.bias", 0},
    {"attn.c_attn.weight", "attn.qkv.weight", 1}, {"attn.c_attn.bias", "attn.qkv.bias", 0},
    {"attn.c_proj.weight", "attn.proj.weight", 1}, {"attn.c_proj.bias", "attn.proj.bias", 0},
    {"ln_2.weight", "ln2.weight", 0},         {"ln_2.bias", "ln2.bias", 0},
    {"mlp.c_fc.weight", "mlp.fc.weight", 1},  {"mlp.c_fc.bias", "mlp.fc.bias", 0},
    {"mlp.c_proj.weight", "mlp.proj.weight", 1}, {"mlp.c_proj.bias", "mlp.proj.bias", 0}};

static void gpt2_plan(const GPTConfig *g, HfPlan *p) {
    hf_plan_add(p, "wte.weight", "wte", 2, g->V, g->C, 0, 0);
    hf_plan_add(p, "wpe.weight", "wpe", 2, g->maxT, g->C, 0, 0);
    for (int l = 0; l < g->L; l++)
        hf_plan_layer_pairs(p, g, "h.%d.", l, GPT2_LAYER, (int)(sizeof GPT2_LAYER / sizeof GPT2_LAYER[0]));
    hf_plan_add(p, "ln_f.weight", "lnf.weight", 1, g->C, 1, 0, 0);
    hf_plan_add(p, "ln_f.bias", "lnf.bias", 1, g->C, 1, 0, 0);
}

// Buffers of transformers' attention that some files carry; they hold no weights.
static const char *const GPT2_IGNORED[] = {".attn.bias", ".attn.masked_bias", NULL};

const HfArch HF_GPT2 = {"gpt2", "GPT2LMHeadModel", "transformer.", "lm_head.weight", "wte.weight",
                        GPT2_IGNORED, gpt2_config_json, gpt2_parse, gpt2_plan};
