// hf_starcoder2: Hugging Face Starcoder2 (Starcoder2ForCausalLM), the target of RoPE models that
// rotate the whole head, with or without grouped-query attention and one sliding window on
// every layer. Point by point against transformers' modeling_starcoder2.py:
//   - pre-LayerNorm blocks with bias (input_layernorm, post_attention_layernorm, norm_epsilon
//     1e-5) and a final LayerNorm (model.norm): our ln1, ln2, lnf;
//   - q_proj, k_proj, v_proj, o_proj are nn.Linear with bias (use_bias): the row blocks
//     [q | k | v] of our fused qkv, (out, in) like ours, and attn.proj;
//   - rotate_half RoPE on the whole head at inv_freq theta^(-2d/HS): our half-split pairs
//     (d, d + HS/2) at the same frequencies (model.rope_dims 0 or HS);
//   - repeat_kv: query head h reads key/value head h / (NH/NKV), as our attention;
//   - attention scaled by 1/sqrt(head_dim);
//   - sliding_window S: key j is visible from query i iff i - S < j <= i, so our window W
//     (j >= i - W) is S = W + 1; the same window on every layer;
//   - mlp.c_fc, mlp.c_proj with bias and gelu_pytorch_tanh: our mlp.fc, mlp.proj and EPI_GELU;
//   - lm_head tied to embed_tokens (tie_word_embeddings);
//   - residual_dropout on the attention and MLP outputs, embedding_dropout, attention_dropout:
//     model.dropout and attention.dropout.
#include "convert/hf_arch.h"

#include <math.h>
#include <stdio.h>

#include "common/check.h"

static cJSON *starcoder2_config_json(const Config *c) {
    cJSON *o = hf_json_common_rotary(c, &HF_STARCODER2);
    cJSON_AddNumberToObject(o, "num_key_value_heads", c->model.n_kv_head);
    cJSON_AddNumberToObject(o, "norm_epsilon", 1e-5);
    cJSON_AddNumberToObject(o, "rope_theta", c->model.rope_theta);
    if (c->attention.window >= 0) cJSON_AddNumberToObject(o, "sliding_window", c->attention.window + 1.0);
    else cJSON_AddNullToObject(o, "sliding_window");
    cJSON_AddBoolToObject(o, "use_bias", 1);
    cJSON_AddNumberToObject(o, "residual_dropout", c->model.dropout);
    cJSON_AddNumberToObject(o, "embedding_dropout", c->model.dropout);
    return o;
}

static int starcoder2_parse(const cJSON *o, const char *path, GPTConfig *g, int *window, int *tied,
                            char *err, size_t errlen) {
    g->pos = POS_ROPE;
    g->rope_dims = 0;
    if (hf_json_dims(o, g, path, err, errlen) != 0) return -1;
    if (hf_json_get(o, "num_key_value_heads") &&
        hf_json_int(o, "num_key_value_heads", &g->NKV, path, err, errlen) != 0)
        return -1;
    const cJSON *hd = hf_json_get(o, "head_dim"), *prf = hf_json_get(o, "partial_rotary_factor");
    if (hd && (!cJSON_IsNumber(hd) || hd->valuedouble * g->NH != g->C))
        return set_error(err, errlen, "%s: head_dim must be hidden_size / num_attention_heads", path);
    if (prf && (!cJSON_IsNumber(prf) || prf->valuedouble != 1.0))
        return set_error(err, errlen, "%s: partial_rotary_factor must be 1 for Starcoder2 (a partial "
                                      "rotary model imports as gpt_neox)", path);
    if (hf_json_tanh_gelu(o, "hidden_act", 1, path, err, errlen) != 0 ||
        hf_json_ln_eps(o, "norm_epsilon", path, err, errlen) != 0 ||
        hf_json_mlp_width(o, "intermediate_size", g->C, 0, path, err, errlen) != 0 ||
        hf_json_rope_theta(o, "rope_theta", &g->rope_theta, path, err, errlen) != 0 ||
        hf_json_bool_is(o, "use_bias", 1, 1, "flashgpt's linear layers and LayerNorms have biases", path,
                        err, errlen) != 0 ||
        hf_json_bool(o, "tie_word_embeddings", 1, tied, path, err, errlen) != 0)
        return -1;
    *window = -1;
    if (hf_json_get(o, "sliding_window")) {
        int S;
        if (hf_json_int(o, "sliding_window", &S, path, err, errlen) != 0) return -1;
        *window = S - 1;
    }
    return 0;
}

static const HfPair STARCODER2_LAYER[] = {
    {"input_layernorm.weight", "ln1.weight", 0}, {"input_layernorm.bias", "ln1.bias", 0},
    {"self_attn.o_proj.weight", "attn.proj.weight", 0}, {"self_attn.o_proj.bias", "attn.proj.bias", 0},
    {"post_attention_layernorm.weight", "ln2.weight", 0}, {"post_attention_layernorm.bias", "ln2.bias", 0},
    {"mlp.c_fc.weight", "mlp.fc.weight", 0},   {"mlp.c_fc.bias", "mlp.fc.bias", 0},
    {"mlp.c_proj.weight", "mlp.proj.weight", 0}, {"mlp.c_proj.bias", "mlp.proj.bias", 0}};

static void starcoder2_plan(const GPTConfig *g, HfPlan *p) {
    const int HS = g->C / g->NH, rows[3] = {g->NH * HS, g->NKV * HS, g->NKV * HS};
    const int start[3] = {0, g->NH * HS, (g->NH + g->NKV) * HS};
    const char *const proj[3] = {"q_proj", "k_proj", "v_proj"};
    hf_plan_add(p, "embed_tokens.weight", "wte", 2, g->V, g->C, 0, 0);
    for (int l = 0; l < g->L; l++) {
        char hf[96], ours[64];
        for (int k = 0; k < 3; k++) {
            snprintf(hf, sizeof hf, "layers.%d.self_attn.%s.weight", l, proj[k]);
            snprintf(ours, sizeof ours, "h.%d.attn.qkv.weight", l);
            hf_plan_add(p, hf, ours, 2, rows[k], g->C, start[k], 0);
            snprintf(hf, sizeof hf, "layers.%d.self_attn.%s.bias", l, proj[k]);
            snprintf(ours, sizeof ours, "h.%d.attn.qkv.bias", l);
            hf_plan_add(p, hf, ours, 1, rows[k], 1, start[k], 0);
        }
        hf_plan_layer_pairs(p, g, "layers.%d.", l, STARCODER2_LAYER,
                            (int)(sizeof STARCODER2_LAYER / sizeof STARCODER2_LAYER[0]));
    }
    hf_plan_add(p, "norm.weight", "lnf.weight", 1, g->C, 1, 0, 0);
    hf_plan_add(p, "norm.bias", "lnf.bias", 1, g->C, 1, 0, 0);
}

static const char *const STARCODER2_IGNORED[] = {".rotary_emb.inv_freq", NULL};

const HfArch HF_STARCODER2 = {"starcoder2", "Starcoder2ForCausalLM", "model.", "lm_head.weight",
                              "embed_tokens.weight", STARCODER2_IGNORED, starcoder2_config_json,
                              starcoder2_parse, starcoder2_plan};
