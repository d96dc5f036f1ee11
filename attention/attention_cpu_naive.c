// attention_cpu_naive: standard attention with the whole (T_q, T_k) score matrix of one (b, h)
// materialised: scores, softmax, matmul. The simple reference the flash versions are checked
// against; its backward recomputes the softmax from the scores and uses the textbook softmax
// gradient dS = P * (dP - rowsum(P * dP)), independent of the flash D = rowsum(dO * O) identity.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention/attention.h"
#include "attention/attention_cpu.h"
#include "attention/mask.h"

static float dot(const float *a, const float *b, int n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int d = 0; d < n; d++) s += a[d] * b[d];
    return s;
}

static inline void axpy(float *restrict y, float a, const float *restrict x, int n) {
#pragma omp simd
    for (int d = 0; d < n; d++) y[d] += a * x[d];
}

// The scaled score of query i of head h against key j, before capping, ALiBi and masks.
static float raw_score(const AttnParams *p, int b, int h, int i, int j) {
    const int g = h / (p->NH / p->NKV);
    return dot(attn_cpu_row(p->q, p->q_st, b, i, h), attn_cpu_row(p->k, p->k_st, b, j, g), p->HS) *
           p->scale;
}

// P (T_q, T_k) = softmax of the scaled, capped, biased, masked scores of head h; lse (T_q) of
// each row (+inf and a zero row when every key is masked).
static void softmax_rows(const AttnParams *p, float *P, float *lse, int b, int h) {
    const int shift = (int)attn_query_shift(p);
    const float slope = p->alibi_slopes ? attn_alibi_slope(p, b, h) : 0.0f;
    for (int i = 0; i < p->T_q; i++) {
        float *pr = P + (int64_t)i * p->T_k;
        AttnKeyRange r = attn_key_range(p, b, i);
        float mx = -INFINITY;
        for (int j = 0; j < p->T_k; j++) {
            if (j < r.lo || j >= r.hi || !attn_block_present(p, i, j)) {
                pr[j] = -INFINITY;
                continue;
            }
            pr[j] = raw_score(p, b, h, i, j);
            if (p->softcap > 0.0f) pr[j] = attn_softcap(p->softcap, pr[j]);
            if (p->alibi_slopes) pr[j] += attn_alibi_bias(slope, i + shift, j);
            mx = fmaxf(mx, pr[j]);
        }
        if (mx == -INFINITY) {
            for (int j = 0; j < p->T_k; j++) pr[j] = 0.0f;
            lse[i] = INFINITY;
            continue;
        }
        double sum = 0.0;
        for (int j = 0; j < p->T_k; j++) {
            pr[j] = expf(pr[j] - mx);
            sum += pr[j];
        }
        const float inv = (float)(1.0 / sum);
        for (int j = 0; j < p->T_k; j++) pr[j] *= inv;
        lse[i] = mx + (float)log(sum);
    }
}

// Applies dropout to row i of a (T_q, T_k) matrix: dropped entries 0, kept ones scaled.
static void dropout_row(const AttnParams *p, float *row, int b, int h, int i) {
    const float keep_scale = attn_dropout_keep_scale(p);
    for (int j = 0; j < p->T_k; j++)
        row[j] = attn_dropout_keep(p, b, h, i, j) ? row[j] * keep_scale : 0.0f;
}

static void forward_head(const AttnParams *p, float *P, int b, int h) {
    const int g = h / (p->NH / p->NKV);
    softmax_rows(p, P, p->lse + attn_lse_offset(p, b, h), b, h);
    for (int i = 0; i < p->T_q; i++) {
        float *pr = P + (int64_t)i * p->T_k;
        if (p->dropout_p > 0.0f) dropout_row(p, pr, b, h, i);
        float *o = attn_cpu_row_mut(p->out, p->o_st, b, i, h);
        memset(o, 0, sizeof(float) * p->HS);
        for (int j = 0; j < p->T_k; j++)
            if (pr[j] != 0.0f) axpy(o, pr[j], attn_cpu_row(p->v, p->v_st, b, j, g), p->HS);
    }
}

int attn_cpu_naive_forward(const AttnParams *p) {
    int failed = 0;
#pragma omp parallel reduction(|| : failed)
    {
        float *P = malloc(sizeof(float) * (size_t)p->T_q * p->T_k);  // (T_q, T_k)
        failed = !P;  // this thread's rows are skipped; the caller reports the failure
#pragma omp for collapse(2) schedule(dynamic)
        for (int b = 0; b < p->B; b++)
            for (int h = 0; h < p->NH; h++)
                if (P) forward_head(p, P, b, h);
        free(P);
    }
    return failed ? -1 : 0;
}

// Gradients of query head h of kv head g; dK, dV of (b, g) accumulate (zeroed by the caller).
static void backward_head(const AttnParams *p, float *P, float *dP, float *lse, int b, int h) {
    const int HS = p->HS, g = h / (p->NH / p->NKV);
    const float keep_scale = attn_dropout_keep_scale(p);
    softmax_rows(p, P, lse, b, h);
    for (int i = 0; i < p->T_q; i++) {
        float *pr = P + (int64_t)i * p->T_k, *dpr = dP + (int64_t)i * p->T_k;
        const float *dout = attn_cpu_row(p->dout, p->do_st, b, i, h);
        for (int j = 0; j < p->T_k; j++) {
            if (pr[j] == 0.0f) {  // masked (or underflowed): no gradient flows through it
                dpr[j] = 0.0f;
                continue;
            }
            float dpd = dot(dout, attn_cpu_row(p->v, p->v_st, b, j, g), HS);  // dL/d(P_dropped)
            float pd = pr[j];
            if (p->dropout_p > 0.0f) {
                int keep = attn_dropout_keep(p, b, h, i, j);
                dpd = keep ? dpd * keep_scale : 0.0f;
                pd = keep ? pd * keep_scale : 0.0f;
            }
            dpr[j] = dpd;
            if (pd != 0.0f) axpy(attn_cpu_row_mut(p->dv, p->dv_st, b, j, g), pd, dout, HS);
        }
        double rs = 0.0;  // rowsum(P * dP)
        for (int j = 0; j < p->T_k; j++) rs += (double)pr[j] * dpr[j];
        const float *q = attn_cpu_row(p->q, p->q_st, b, i, h);
        float *dq = attn_cpu_row_mut(p->dq, p->dq_st, b, i, h);
        if (!p->accumulate) memset(dq, 0, sizeof(float) * HS);
        for (int j = 0; j < p->T_k; j++) {
            float ds = pr[j] * (dpr[j] - (float)rs) * p->scale;
            if (ds == 0.0f) continue;
            if (p->softcap > 0.0f) ds *= attn_softcap_grad(p->softcap, raw_score(p, b, h, i, j));
            axpy(dq, ds, attn_cpu_row(p->k, p->k_st, b, j, g), HS);
            axpy(attn_cpu_row_mut(p->dk, p->dk_st, b, j, g), ds, q, HS);
        }
    }
}

int attn_cpu_naive_backward(const AttnParams *p) {
    const int group = p->NH / p->NKV;
    int failed = 0;
#pragma omp parallel reduction(|| : failed)
    {
        float *P = malloc(sizeof(float) * (size_t)p->T_q * p->T_k);   // (T_q, T_k)
        float *dP = malloc(sizeof(float) * (size_t)p->T_q * p->T_k);  // (T_q, T_k)
        float *lse = malloc(sizeof(float) * p->T_q);                  // (T_q) recomputed
        failed = !P || !dP || !lse;
#pragma omp for collapse(2) schedule(dynamic)
        for (int b = 0; b < p->B; b++)
            for (int g = 0; g < p->NKV; g++) {
                if (failed) continue;
                for (int j = 0; j < p->T_k && !p->accumulate; j++) {
                    memset(attn_cpu_row_mut(p->dk, p->dk_st, b, j, g), 0, sizeof(float) * p->HS);
                    memset(attn_cpu_row_mut(p->dv, p->dv_st, b, j, g), 0, sizeof(float) * p->HS);
                }
                for (int hh = 0; hh < group; hh++) backward_head(p, P, dP, lse, b, g * group + hh);
            }
        free(P); free(dP); free(lse);
    }
    return failed ? -1 : 0;
}
