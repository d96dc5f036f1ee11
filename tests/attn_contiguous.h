// attn_contiguous: AttnParams over contiguous (B, T, heads, HS) tensors, the layout the CPU
// reference tests and the block-sparse tests (CPU and GPU) start from.
#pragma once
#include <math.h>
#include <string.h>

#include "attention/attention.h"

typedef struct {
    const void *q, *k, *v, *dout;  // (B, T_q, NH, HS), (B, T_k, NKV, HS) x2, like q
    void *out, *dq, *dk, *dv;      // like q, q, k, v
    float *lse;                    // (B, NH, T_q)
} AttnTensors;

typedef struct {
    int B, T_q, T_k, NH, NKV, HS;
    int causal, window;  // window: keys at most this far back (and ahead, unless causal); -1 off
} AttnShape;

static inline AttnStrides attn_contiguous_strides(int T, int H, int HS) {
    return (AttnStrides){(int64_t)T * H * HS, (int64_t)H * HS, HS};
}

// Zeroed params with every tensor, its strides, the sizes, scale 1/sqrt(HS), causal and window.
static inline AttnParams attn_contiguous(const AttnTensors *t, const AttnShape *s) {
    AttnParams p;
    memset(&p, 0, sizeof p);
    p.q = t->q; p.k = t->k; p.v = t->v; p.dout = t->dout;
    p.out = t->out; p.lse = t->lse; p.dq = t->dq; p.dk = t->dk; p.dv = t->dv;
    p.q_st = p.o_st = p.do_st = p.dq_st = attn_contiguous_strides(s->T_q, s->NH, s->HS);
    p.k_st = p.v_st = p.dk_st = p.dv_st = attn_contiguous_strides(s->T_k, s->NKV, s->HS);
    p.B = s->B; p.T_q = s->T_q; p.T_k = s->T_k; p.NH = s->NH; p.NKV = s->NKV; p.HS = s->HS;
    p.scale = 1.0f / sqrtf((float)s->HS);
    p.causal = s->causal;
    p.window_left = s->window;
    p.window_right = s->causal ? -1 : s->window;
    return p;
}
