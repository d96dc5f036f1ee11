// hf_neox: Hugging Face GPT-NeoX (GPTNeoXForCausalLM), the target of partial-RoPE models
// (model.rope_dims R < HS) with one key/value head per query head and no window. Point by point
// against transformers' modeling_gpt_neox.py:
//   - use_parallel_residual false: x += attn(ln1(x)); x += mlp(ln2(x)), our block; LayerNorms
//     with bias (input_layernorm, post_attention_layernorm, final_layer_norm, layer_norm_eps);
//   - query_key_value fuses the heads as [q_h | k_h | v_h] per head h (a view of
//     (NH, 3 * HS)), where ours is [q (all heads) | k | v]: a row permutation;
//   - RoPE rotates the first rotary_ndims = HS * rotary_pct dimensions of each head, rotate_half
//     within them: pair (j, j + R/2), j < R/2, at inv_freq theta^(-2j/R). Ours turns the pairs
//     (d, d + HS/2), d < R/2, at the same frequencies (model/gpt.h). Both q and k heads are
//     therefore exported with their dimensions reordered [0, R/2) | [HS/2, HS/2 + R/2) |
//     [R/2, HS/2) | [HS/2 + R/2, HS): the dot products q.k, and so the model, are unchanged;
//   - dense (the attention output), dense_h_to_4h and dense_4h_to_h with bias, hidden_act
//     gelu_pytorch_tanh, attention scaled by 1/sqrt(head_size), attention_bias true;
//   - embed_out tied to embed_in (tie_word_embeddings);
//   - hidden_dropout on the embedding and both branch outputs, attention_dropout.
#include "convert/hf_arch.h"

#include <math.h>
#include <stdio.h>

#include "common/check.h"

// HS * rotary_pct in double, as transformers computes rotary_ndims (int() truncates): the
// smallest pct with int(HS * pct) == R, so the export gives back exactly R.
static double rotary_pct(int R, int HS) {
    double pct = (double)R / HS;
    while ((int)(HS * pct) < R) pct = nextafter(pct, 2.0);
    return pct;
}

static cJSON *neox_config_json(const Config *c) {
    const int HS = c->model.n_embd / c->model.n_head, R = c->model.rope_dims ? c->model.rope_dims : HS;
    cJSON *o = hf_json_common_rotary(c, &HF_NEOX);
    cJSON_AddNumberToObject(o, "layer_norm_eps", 1e-5);
    cJSON_AddNumberToObject(o, "rotary_pct", rotary_pct(R, HS));
    cJSON_AddNumberToObject(o, "rotary_emb_base", c->model.rope_theta);
    cJSON_AddBoolToObject(o, "use_parallel_residual", 0);
    cJSON_AddBoolToObject(o, "attention_bias", 1);
    cJSON_AddNumberToObject(o, "hidden_dropout", c->model.dropout);
    return o;
}

static int neox_parse(const cJSON *o, const char *path, GPTConfig *g, int *window, int *tied, char *err,
                      size_t errlen) {
    *window = -1;
    g->pos = POS_ROPE;
    if (hf_json_dims(o, g, path, err, errlen) != 0) return -1;
    if (g->C % g->NH != 0)
        return set_error(err, errlen, "%s: hidden_size %d is not divisible by num_attention_heads %d", path,
                         g->C, g->NH);
    const int HS = g->C / g->NH;
    // transformers 5 keeps it as rope_parameters.partial_rotary_factor in the configs it saves.
    const cJSON *pct = hf_json_get(o, "rotary_pct"), *params = hf_json_get(o, "rope_parameters");
    if (!pct && params) pct = hf_json_get(params, "partial_rotary_factor");
    if (pct && (!cJSON_IsNumber(pct) || !(pct->valuedouble > 0 && pct->valuedouble <= 1)))
        return set_error(err, errlen, "%s: rotary_pct must be a number in (0, 1]", path);
    const int R = (int)(HS * (pct ? pct->valuedouble : 0.25));   // GPTNeoXConfig's default 0.25
    if (R < 2 || R % 2 != 0)
        return set_error(err, errlen, "%s: rotary_pct gives %d rotated dimensions of the head size %d: "
                                      "flashgpt rotates an even number of them, at least 2", path, R, HS);
    g->rope_dims = R == HS ? 0 : R;
    if (hf_json_tanh_gelu(o, "hidden_act", 0, path, err, errlen) != 0 ||
        hf_json_ln_eps(o, "layer_norm_eps", path, err, errlen) != 0 ||
        hf_json_mlp_width(o, "intermediate_size", g->C, 0, path, err, errlen) != 0 ||
        hf_json_rope_theta(o, "rotary_emb_base", &g->rope_theta, path, err, errlen) != 0 ||
        hf_json_bool_is(o, "use_parallel_residual", 1, 0, "flashgpt's block adds attention, then the MLP "
                        "of the result (sequential residual)", path, err, errlen) != 0 ||
        hf_json_bool_is(o, "attention_bias", 1, 1, "flashgpt's attention projections have biases", path,
                        err, errlen) != 0 ||
        hf_json_bool(o, "tie_word_embeddings", 0, tied, path, err, errlen) != 0)
        return -1;
    return 0;
}

static const HfPair NEOX_LAYER[] = {
    {"input_layernorm.weight", "ln1.weight", 0}, {"input_layernorm.bias", "ln1.bias", 0},
    {"attention.dense.weight", "attn.proj.weight", 0}, {"attention.dense.bias", "attn.proj.bias", 0},
    {"post_attention_layernorm.weight", "ln2.weight", 0}, {"post_attention_layernorm.bias", "ln2.bias", 0},
    {"mlp.dense_h_to_4h.weight", "mlp.fc.weight", 0}, {"mlp.dense_h_to_4h.bias", "mlp.fc.bias", 0},
    {"mlp.dense_4h_to_h.weight", "mlp.proj.weight", 0}, {"mlp.dense_4h_to_h.bias", "mlp.proj.bias", 0}};

// query_key_value row r <- our qkv row map[r]: per head [q_h | k_h | v_h], q and k reordered.
static void neox_qkv_map(int *map, int NH, int HS, int R) {
    const int half = HS / 2, r2 = R / 2, rest = half - r2;
    for (int h = 0; h < NH; h++)
        for (int part = 0; part < 3; part++)
            for (int j = 0; j < HS; j++) {
                int d = j;   // v keeps its order
                if (part < 2)
                    d = j < r2 ? j : j < R ? half + (j - r2) : j < R + rest ? r2 + (j - R) : half + r2 + (j - R - rest);
                map[(h * 3 + part) * HS + j] = part * NH * HS + h * HS + d;
            }
}

static void neox_plan(const GPTConfig *g, HfPlan *p) {
    const int HS = g->C / g->NH, R = g->rope_dims ? g->rope_dims : HS, OC = 3 * g->C;
    int *map = hf_plan_map(p, OC);
    neox_qkv_map(map, g->NH, HS, R);
    hf_plan_add(p, "embed_in.weight", "wte", 2, g->V, g->C, 0, 0);
    for (int l = 0; l < g->L; l++) {
        char hf[96], ours[64];
        snprintf(hf, sizeof hf, "layers.%d.attention.query_key_value.weight", l);
        snprintf(ours, sizeof ours, "h.%d.attn.qkv.weight", l);
        hf_plan_add(p, hf, ours, 2, OC, g->C, 0, 0)->row_map = map;
        snprintf(hf, sizeof hf, "layers.%d.attention.query_key_value.bias", l);
        snprintf(ours, sizeof ours, "h.%d.attn.qkv.bias", l);
        hf_plan_add(p, hf, ours, 1, OC, 1, 0, 0)->row_map = map;
        hf_plan_layer_pairs(p, g, "layers.%d.", l, NEOX_LAYER, (int)(sizeof NEOX_LAYER / sizeof NEOX_LAYER[0]));
    }
    hf_plan_add(p, "final_layer_norm.weight", "lnf.weight", 1, g->C, 1, 0, 0);
    hf_plan_add(p, "final_layer_norm.bias", "lnf.bias", 1, g->C, 1, 0, 0);
}

static const char *const NEOX_IGNORED[] = {".attention.bias", ".attention.masked_bias",
                                           ".attention.rotary_emb.inv_freq", NULL};

const HfArch HF_NEOX = {"gpt_neox", "GPTNeoXForCausalLM", "gpt_neox.", "embed_out.weight", "embed_in.weight",
                        NEOX_IGNORED, neox_config_json, neox_parse, neox_plan};
