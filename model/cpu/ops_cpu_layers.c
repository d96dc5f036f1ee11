// ops_cpu_layers: the CPU backend's element-wise and row-wise ops in fp32 with OpenMP:
// embeddings, LayerNorm, residual add and the fused softmax cross-entropy.
//
// Parameter gradients that several rows scatter into (embedding tables, LayerNorm weight/bias)
// are reduced by splitting the CHANNELS among threads, each thread looping over every row in
// order: no atomics, and bit-identical results whatever the thread count.
#include <math.h>
#include <string.h>

#include "model/cpu/ops_cpu.h"

void cpu_embed_forward(Backend *be, void *out_, const int *tokens, const int *pos, const void *wte_,
                       const void *wpe_, int B, int T, int C) {
    float *out = out_;          // (B, T, C)
    const float *wte = wte_;    // (Vp, C)
    const float *wpe = wpe_;    // (maxT, C) or NULL
    #pragma omp parallel for schedule(static) if ((size_t)B * T * C >= CPU_PAR_MIN)
    for (long i = 0; i < (long)B * T; i++) {
        const float *te = wte + (size_t)tokens[i] * C;
        float *o = out + (size_t)i * C;
        if (wpe) {
            const float *pe = wpe + (size_t)(pos ? pos[i] : (int)(i % T)) * C;
            for (int c = 0; c < C; c++) o[c] = te[c] + pe[c];
        } else {
            for (int c = 0; c < C; c++) o[c] = te[c];
        }
    }
}

void cpu_embed_backward(Backend *be, void *dwte_, void *dwpe_, const void *dout_, const int *tokens,
                        const int *pos, int B, int T, int C, int V, int P) {
    float *dwte = dwte_;        // (V, C)
    float *dwpe = dwpe_;        // (P, C) or NULL
    const float *dout = dout_;  // (B, T, C)
    #pragma omp parallel for schedule(static) if ((size_t)B * T * C >= CPU_PAR_MIN)
    for (int c0 = 0; c0 < C; c0 += COL_CHUNK) {
        int c1 = c0 + COL_CHUNK < C ? c0 + COL_CHUNK : C;
        for (long i = 0; i < (long)B * T; i++) {
            const float *d = dout + (size_t)i * C;
            float *te = dwte + (size_t)tokens[i] * C;
            for (int c = c0; c < c1; c++) te[c] += d[c];
            if (dwpe) {
                float *pe = dwpe + (size_t)(pos ? pos[i] : (int)(i % T)) * C;
                for (int c = c0; c < c1; c++) pe[c] += d[c];
            }
        }
    }
}

void cpu_layernorm_forward(Backend *be, void *out_, float *mean, float *rstd, const void *inp_,
                           const void *w_, const void *b_, int N, int C) {
    float *out = out_;          // (N, C)
    const float *inp = inp_;    // (N, C)
    const float *w = w_, *b = b_;  // (C)
    const double eps = 1e-5;
    #pragma omp parallel for schedule(static) if ((size_t)N * C >= CPU_PAR_MIN)
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C;
        double m = 0, v = 0;
        for (int c = 0; c < C; c++) m += x[c];
        m /= C;
        for (int c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
        float s = (float)(1.0 / sqrt(v / C + eps));
        float *o = out + (size_t)i * C;
        for (int c = 0; c < C; c++) o[c] = (x[c] - (float)m) * s * w[c] + b[c];
        mean[i] = (float)m;
        rstd[i] = s;
    }
}

// The reference of the fused op: the add (through b's dropout mask), then the LayerNorm.
void cpu_add_layernorm_forward(Backend *be, void *res, void *out, float *mean, float *rstd,
                               const void *a, const void *b, const void *w, const void *bias,
                               int N, int C, const DropMask *b_drop) {
    cpu_add(be, res, a, b, (size_t)N * C, b_drop);
    cpu_layernorm_forward(be, out, mean, rstd, res, w, bias, N, C);
}

void cpu_layernorm_backward(Backend *be, void *dinp_, void *dcopy_, void *dw_, void *db_,
                            const void *dout_, const void *inp_, const void *w_, const float *mean,
                            const float *rstd, int N, int C, const DropMask *dcopy_drop) {
    float *dinp = dinp_;        // (N, C), accumulates
    float *dw = dw_, *db = db_;  // (C), accumulate
    const float *dout = dout_, *inp = inp_;  // (N, C)
    const float *w = w_;        // (C)
    // dinp = rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)) with dnorm = dout * w.
    #pragma omp parallel for schedule(static) if ((size_t)N * C >= CPU_PAR_MIN)
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C, *d = dout + (size_t)i * C;
        float m = mean[i], s = rstd[i];
        double sum_dn = 0, sum_dn_n = 0;
        for (int c = 0; c < C; c++) {
            float dn = d[c] * w[c];
            sum_dn += dn;
            sum_dn_n += dn * ((x[c] - m) * s);
        }
        float a = (float)(sum_dn / C), bb = (float)(sum_dn_n / C);
        float *di = dinp + (size_t)i * C;
        for (int c = 0; c < C; c++) di[c] += s * (d[c] * w[c] - a - (x[c] - m) * s * bb);
        if (dcopy_) memcpy((float *)dcopy_ + (size_t)i * C, di, (size_t)C * sizeof(float));
    }
    #pragma omp parallel for schedule(static) if ((size_t)N * C >= CPU_PAR_MIN)
    for (int c0 = 0; c0 < C; c0 += COL_CHUNK) {
        int c1 = c0 + COL_CHUNK < C ? c0 + COL_CHUNK : C;
        for (int i = 0; i < N; i++) {
            const float *x = inp + (size_t)i * C, *d = dout + (size_t)i * C;
            for (int c = c0; c < c1; c++) {
                dw[c] += d[c] * ((x[c] - mean[i]) * rstd[i]);
                db[c] += d[c];
            }
        }
    }
    if (dcopy_) cpu_dropout(be, dcopy_, (size_t)N * C, dcopy_drop);
}

void cpu_add(Backend *be, void *out_, const void *a_, const void *b_, size_t n, const DropMask *b_drop) {
    if (b_drop && b_drop->p > 0.0f) {
        cpu_dropout_add(out_, a_, b_, n, b_drop);
        return;
    }
    float *out = out_;
    const float *a = a_, *b = b_;
    #pragma omp parallel for schedule(static) if (n >= CPU_PAR_MIN)
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void cpu_softmax_xent(Backend *be, void *logits_, float *losses, float *lse, const int *targets,
                      int N, int V, int Vp, float dscale) {
    float *logits = logits_;    // (N, Vp); the first V columns are real
    #pragma omp parallel for schedule(static) if ((size_t)N * Vp >= CPU_PAR_MIN)
    for (int i = 0; i < N; i++) {
        float *z = logits + (size_t)i * Vp;
        const int tgt = targets[i];
        if (dscale != 0.0f) {
            for (int j = 0; j < Vp; j++)
                z[j] = tgt < 0 || j >= V ? 0.0f
                                         : dscale * (expf(z[j] - lse[i]) - (j == tgt ? 1.0f : 0.0f));
            continue;
        }
        if (tgt < 0) {
            losses[i] = lse[i] = 0.0f;
            continue;
        }
        float zmax = -INFINITY;
        for (int j = 0; j < V; j++) zmax = z[j] > zmax ? z[j] : zmax;
        double sum = 0;
        for (int j = 0; j < V; j++) sum += expf(z[j] - zmax);
        lse[i] = zmax + (float)log(sum);
        losses[i] = lse[i] - z[tgt];
    }
}
