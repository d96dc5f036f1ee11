// params: AttnParams for the fused QKV layout, the one every GPT-style caller uses, and the
// struct's size for mirrors in other languages.
#include <math.h>

#include "attention/attention.h"

void attn_fused_qkv(AttnParams *p, const void *qkv, void *out, int B, int T, int NH, int NKV,
                    int HS, size_t elem_bytes) {
    const int64_t OCq = (int64_t)(NH + 2 * NKV) * HS, C = (int64_t)NH * HS;
    const AttnStrides qkv_st = {T * OCq, OCq, HS}, y_st = {T * C, C, HS};
    p->q = qkv;
    p->k = (const char *)qkv + (size_t)NH * HS * elem_bytes;
    p->v = (const char *)qkv + (size_t)(NH + NKV) * HS * elem_bytes;
    p->out = out;
    p->q_st = p->k_st = p->v_st = qkv_st;
    p->o_st = y_st;
    p->B = B;
    p->T_q = p->T_k = T;
    p->NH = NH;
    p->NKV = NKV;
    p->HS = HS;
    p->scale = 1.0f / sqrtf((float)HS);
}

void attn_fused_qkv_grads(AttnParams *p, void *dqkv, const void *dout, size_t elem_bytes) {
    p->dout = dout;
    p->do_st = p->o_st;
    p->dq = dqkv;
    p->dk = (char *)dqkv + (size_t)p->NH * p->HS * elem_bytes;
    p->dv = (char *)dqkv + (size_t)(p->NH + p->NKV) * p->HS * elem_bytes;
    p->dq_st = p->dk_st = p->dv_st = p->q_st;
}

size_t attn_params_size(void) { return sizeof(AttnParams); }
