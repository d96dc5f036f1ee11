// GPU attention tests: attn_forward / attn_backward on a CUDA context (flash and naive) against the CPU
// reference (attn_*_cpu, fp32) and a float64 reference, over odd shapes, GQA, strided fused QKV,
// windows, ALiBi (per head, or per batch row and head), documents, dropout, fully masked rows,
// causal T_q > T_k, soft-capping (sm90 family and naive path) and the deterministic mode, the
// dropout masks the kernels draw (read back bit by bit, forward and backward on either family
// and on the naive path, with the offset as an argument and split with device memory), and a
// problem split into chunk pairs as context parallelism's ring runs it (explicit positions, strided LSE,
// gradients accumulated in fp32), on the kernel family attn_select_kernel picks (a context of
// kernel auto) and again on a context of kernel sm80; then the context's own refusals, which
// leave the process running.
//
// Tolerance (STYLE.md, after flash-attention's tests): the GPU's error against float64 must stay
// within 2x the error of a straightforward implementation in the same precision (float64
// arithmetic that rounds S, P, O, dP, dS and the gradients to bf16/fp16, as a PyTorch bf16
// eager run would), plus 1e-4 for fp32 accumulation-order noise (rms relative error of sums of
// up to ~1e4 terms at 2^-24 each stays under 1e-5). The same bound applies against the fp32 CPU
// reference, whose own error against float64 is below 1e-5.
//
// Usage: test_attention_gpu [--quick]   (--quick: a small subset for compute-sanitizer)
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention/attention.h"
#include "attention/mask.h"
#include "common/check.h"
#include "common/rng.h"
#include "tests/testlib.h"
#include "tests/gpu/cuda_ok.h"

// ---- element conversion (round to nearest even) -------------------------------------------

static uint16_t f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    x += 0x7FFFu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}
static float bf16_to_f32(uint16_t h) {
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}
static uint16_t f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, mant = x & 0x7FFFFFu;
    int exp = (int)((x >> 23) & 0xFF) - 127 + 15;
    if (exp >= 31) return (uint16_t)(sign | 0x7C00u);
    if (exp <= 0) {  // subnormal half
        if (exp < -10) return (uint16_t)sign;
        mant |= 0x800000u;
        int shift = 14 - exp;
        uint32_t h = mant >> shift, rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1u))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)exp << 10) | (mant >> 13), rem = mant & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;  // a carry rounds into the exponent
    return (uint16_t)(sign | h);
}
static float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1F, mant = h & 0x3FFu;
    if (exp == 0) {
        float v = ldexpf((float)mant, -24);
        return sign ? -v : v;
    }
    uint32_t x = exp == 31 ? sign | 0x7F800000u | (mant << 13) : sign | ((exp - 15 + 127) << 23) | (mant << 13);
    float f;
    memcpy(&f, &x, 4);
    return f;
}
static float round_to(DType t, float f) {
    if (t == DTYPE_BF16) return bf16_to_f32(f32_to_bf16(f));
    if (t == DTYPE_F16) return f16_to_f32(f32_to_f16(f));
    return f;
}
static size_t esize(DType t) { return t == DTYPE_F32 ? 4 : 2; }

// Host fp32 <-> device element type, n elements.
static void upload(void *dst, const float *src, size_t n, DType t) {
    size_t eb = esize(t);
    void *tmp = malloc(n * eb);
    for (size_t i = 0; i < n; i++) {
        if (t == DTYPE_F32) ((float *)tmp)[i] = src[i];
        else ((uint16_t *)tmp)[i] = t == DTYPE_BF16 ? f32_to_bf16(src[i]) : f32_to_f16(src[i]);
    }
    CUDA_OK(cudaMemcpy(dst, tmp, n * eb, cudaMemcpyHostToDevice));
    free(tmp);
}
static void download(float *dst, const void *src, size_t n, DType t) {
    size_t eb = esize(t);
    void *tmp = malloc(n * eb);
    CUDA_OK(cudaMemcpy(tmp, src, n * eb, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) {
        if (t == DTYPE_F32) dst[i] = ((float *)tmp)[i];
        else dst[i] = t == DTYPE_BF16 ? bf16_to_f32(((uint16_t *)tmp)[i]) : f16_to_f32(((uint16_t *)tmp)[i]);
    }
    free(tmp);
}

// ---- cases --------------------------------------------------------------------------------

typedef struct {
    const char *name;
    DType dtype;
    AttnImpl impl;
    int B, T_q, T_k, NH, NKV, HS;
    int causal, wl, wr;
    int alibi, docs, fused;  // ALiBi slopes (1: (NH), 2: (B, NH)); 3 documents per row; fused QKV
    float dropout;
    int deterministic;
    float softcap;  // 0 = off
    int ramp;       // K's rows grow toward key 0 (up to 7x): the forward, which visits keys last
                    // to first, sees a row's running max jump by many units several times
} Case;

// Strided view of a tensor on the host (fp32) and on the device (element type).
typedef struct {
    float *h;
    void *d;
    size_t n;  // elements of the allocation
    AttnStrides st;
} Buf;

static Buf buf_alloc(size_t n, AttnStrides st, DType t) {
    Buf b = {calloc(n, sizeof(float)), NULL, n, st};
    CUDA_OK(cudaMalloc(&b.d, n * esize(t)));
    return b;
}
static Buf buf_host(size_t n, AttnStrides st) {
    Buf b = {calloc(n, sizeof(float)), NULL, n, st};
    return b;
}
static void buf_free(Buf *b) {
    free(b->h);
    if (b->d) CUDA_OK(cudaFree(b->d));
}
// Raw device bytes of the gradients (the one fused buffer, or dq, dk, dv back to back).
static void *grads_bytes(const Buf *all, const Buf *dq, const Buf *dk, const Buf *dv, DType t, size_t *n) {
    const Buf *parts[3] = {all ? all : dq, all ? NULL : dk, all ? NULL : dv};
    size_t total = 0;
    for (int i = 0; i < 3; i++) total += parts[i] ? parts[i]->n * esize(t) : 0;
    char *blob = malloc(total), *w = blob;
    for (int i = 0; i < 3; i++) {
        if (!parts[i]) continue;
        CUDA_OK(cudaMemcpy(w, parts[i]->d, parts[i]->n * esize(t), cudaMemcpyDeviceToHost));
        w += parts[i]->n * esize(t);
    }
    *n = total;
    return blob;
}
static float *at(const Buf *b, int bb, int t, int h) {
    return b->h + (int64_t)bb * b->st.batch + (int64_t)t * b->st.row + (int64_t)h * b->st.head;
}

// Float64 reference (lowp = 0) or the straightforward same-precision one (lowp = 1, rounding
// as described at the top). Outputs are contiguous: out, dq (B, T_q, NH, HS); dk, dv (B, T_k,
// NKV, HS); lse (B, NH, T_q).
typedef struct {
    double *out, *lse, *dq, *dk, *dv;
} Ref;

// lowp: the element type to round intermediates to (DTYPE_F32 = no rounding, the float64 reference)

static double rnd(DType lowp, double x) { return lowp == DTYPE_F32 ? x : round_to(lowp, (float)x); }

static void ref_attention(const AttnParams *p, const Buf *q, const Buf *k, const Buf *v, const Buf *dout,
                          const float *slopes_h, DType lowp, Ref *r) {
    const int64_t shift = attn_query_shift(p);
    const int G = p->NH / p->NKV, HS = p->HS, Tq = p->T_q, Tk = p->T_k;
    const double ks = p->dropout_p > 0 ? attn_dropout_keep_scale(p) : 1.0;
    size_t nkv = (size_t)p->B * Tk * p->NKV * HS;
    memset(r->dk, 0, nkv * sizeof(double));
    memset(r->dv, 0, nkv * sizeof(double));
    double *P = malloc((size_t)Tq * Tk * sizeof(double));   // undropped probabilities
    double *DS = malloc((size_t)Tq * Tk * sizeof(double));  // dS
    for (int b = 0; b < p->B; b++)
        for (int h = 0; h < p->NH; h++) {
            const int g = h / G;
#pragma omp parallel for schedule(dynamic, 4)
            for (int i = 0; i < Tq; i++) {
                const float *qi = at(q, b, i, h), *doi = at(dout, b, i, h);
                double *Pi = P + (size_t)i * Tk, *dSi = DS + (size_t)i * Tk;
                const int pos = (int)(i + shift);
                double mx = -INFINITY;
                for (int j = 0; j < Tk; j++) {
                    double s = -INFINITY;
                    if (attn_visible(p, b, i, j)) {
                        const float *kj = at(k, b, j, g);
                        double acc = 0;
                        for (int d = 0; d < HS; d++) acc += (double)qi[d] * kj[d];
                        s = rnd(lowp, acc * p->scale);
                        if (p->softcap > 0) s = rnd(lowp, p->softcap * tanh(s / p->softcap));
                        if (slopes_h) s += attn_alibi_bias(slopes_h[b * p->alibi_batch_stride + h], pos, j);
                    }
                    Pi[j] = s;
                    if (s > mx) mx = s;
                }
                double sum = 0;
                for (int j = 0; j < Tk; j++) sum += Pi[j] == -INFINITY ? 0 : exp(Pi[j] - mx);
                double *oi = r->out + (((size_t)b * Tq + i) * p->NH + h) * HS;
                r->lse[((size_t)b * p->NH + h) * Tq + i] = sum > 0 ? mx + log(sum) : INFINITY;
                for (int d = 0; d < HS; d++) oi[d] = 0;
                for (int j = 0; j < Tk; j++) {
                    Pi[j] = sum > 0 && Pi[j] != -INFINITY ? rnd(lowp, exp(Pi[j] - mx) / sum) : 0;
                    double keep = p->dropout_p > 0 ? attn_dropout_keep(p, b, h, i, j) * ks : 1.0;
                    if (Pi[j] * keep == 0) continue;
                    const float *vj = at(v, b, j, g);
                    for (int d = 0; d < HS; d++) oi[d] += Pi[j] * keep * vj[d];
                }
                double D = 0;
                for (int d = 0; d < HS; d++) {
                    oi[d] = rnd(lowp, oi[d]);
                    D += (double)doi[d] * oi[d];
                }
                for (int j = 0; j < Tk; j++) {
                    dSi[j] = 0;
                    if (Pi[j] == 0) continue;
                    const float *vj = at(v, b, j, g);
                    double dp = 0;
                    for (int d = 0; d < HS; d++) dp += (double)doi[d] * vj[d];
                    dp = rnd(lowp, dp);
                    if (p->dropout_p > 0) dp *= attn_dropout_keep(p, b, h, i, j) * ks;
                    double cap_grad = 1;  // d(softcap * tanh(s / softcap)) / ds at the raw score
                    if (p->softcap > 0) {
                        const float *kj = at(k, b, j, g);
                        double acc = 0;
                        for (int d = 0; d < HS; d++) acc += (double)qi[d] * kj[d];
                        const double t = tanh(rnd(lowp, acc * p->scale) / p->softcap);
                        cap_grad = 1 - t * t;
                    }
                    dSi[j] = rnd(lowp, Pi[j] * (dp - D) * cap_grad);
                }
                double *dqi = r->dq + (((size_t)b * Tq + i) * p->NH + h) * HS;
                for (int d = 0; d < HS; d++) dqi[d] = 0;
                for (int j = 0; j < Tk; j++) {
                    if (dSi[j] == 0) continue;
                    const float *kj = at(k, b, j, g);
                    for (int d = 0; d < HS; d++) dqi[d] += dSi[j] * kj[d];
                }
                for (int d = 0; d < HS; d++) dqi[d] = rnd(lowp, dqi[d] * p->scale);
            }
#pragma omp parallel for schedule(dynamic, 4)
            for (int j = 0; j < Tk; j++) {
                double *dkj = r->dk + (((size_t)b * Tk + j) * p->NKV + g) * HS;
                double *dvj = r->dv + (((size_t)b * Tk + j) * p->NKV + g) * HS;
                for (int i = 0; i < Tq; i++) {
                    double pij = P[(size_t)i * Tk + j], dsij = DS[(size_t)i * Tk + j];
                    if (pij == 0 && dsij == 0) continue;
                    double keep = p->dropout_p > 0 ? attn_dropout_keep(p, b, h, i, j) * ks : 1.0;
                    const float *qi = at(q, b, i, h), *doi = at(dout, b, i, h);
                    for (int d = 0; d < HS; d++) {
                        dkj[d] += p->scale * dsij * qi[d];
                        dvj[d] += pij * keep * doi[d];
                    }
                }
            }
        }
    if (lowp != DTYPE_F32)
        for (size_t i = 0; i < nkv; i++) {
            r->dk[i] = rnd(lowp, r->dk[i]);
            r->dv[i] = rnd(lowp, r->dv[i]);
        }
    free(P);
    free(DS);
}

// The float64 reference of p (rs[0]) and the straightforward one in dt (rs[1]).
static void refs_compute(Ref rs[2], const AttnParams *p, const Buf *q, const Buf *k, const Buf *v, const Buf *dout,
                         const float *slopes_h, DType dt) {
    const size_t nq = (size_t)p->B * p->T_q * p->NH * p->HS, nk = (size_t)p->B * p->T_k * p->NKV * p->HS;
    for (int i = 0; i < 2; i++) {
        rs[i].out = malloc(nq * sizeof(double));
        rs[i].dq = malloc(nq * sizeof(double));
        rs[i].dk = malloc(nk * sizeof(double));
        rs[i].dv = malloc(nk * sizeof(double));
        rs[i].lse = malloc((size_t)p->B * p->NH * p->T_q * sizeof(double));
        ref_attention(p, q, k, v, dout, slopes_h, i ? dt : DTYPE_F32, &rs[i]);
    }
}
static void refs_free(Ref rs[2]) {
    for (int i = 0; i < 2; i++) {
        free(rs[i].out); free(rs[i].dq); free(rs[i].dk); free(rs[i].dv); free(rs[i].lse);
    }
}

// ||a - ref|| / ||scale|| over a strided host tensor a (B, T, H, HS) against a contiguous double
// ref; scale is ref itself, or the float64 reference when ref is another approximation (a
// gradient that is exactly 0, like dq at T = 1, would otherwise divide rounding noise by noise).
static double err_vs(const Buf *a, const double *ref, const double *scale, int B, int T, int H, int HS) {
    double num = 0, den = 0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++) {
                const float *x = at(a, b, t, h);
                const double *y = ref + (((size_t)b * T + t) * H + h) * HS;
                for (int d = 0; d < HS; d++) {
                    double e = (double)x[d] - y[d];
                    if (!isfinite(x[d])) return INFINITY;  // unwritten (poisoned) or NaN
                    const double sc = scale[(((size_t)b * T + t) * H + h) * HS + d];
                    num += e * e;
                    den += sc * sc;
                }
            }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}
static double err_d(const double *a, const double *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double e = a[i] - ref[i];
        num += e * e;
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}
// Same strided tensor copied into a contiguous double array.
static void to_contig(const Buf *a, double *dst, int B, int T, int H, int HS) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++)
                for (int d = 0; d < HS; d++) dst[(((size_t)b * T + t) * H + h) * HS + d] = at(a, b, t, h)[d];
}

#define ATOL 1e-4

// LSE: both +inf (fully masked row) or within the fp32 error of a log-sum-exp of these scores.
static int lse_ok(const float *lse, const double *ref, size_t n, double *worst) {
    *worst = 0;
    for (size_t i = 0; i < n; i++) {
        if (isinf(ref[i])) {
            if (!(isinf(lse[i]) && lse[i] > 0)) return 0;
            continue;
        }
        if (!isfinite(lse[i])) return 0;
        // scores come from the same rounded inputs in fp32: relative error ~1e-6, 1e-4 leaves room
        double e = fabs(lse[i] - ref[i]) / fmax(1.0, fabs(ref[i]));
        if (e > *worst) *worst = e;
    }
    return *worst < 1e-4;
}

// ALiBi slopes into h (NH of them, or (B, NH) with per_batch: each batch row its own) and a
// device copy (returned).
static float *make_slopes(float *h, int B, int NH, int per_batch) {
    const int n = per_batch ? B * NH : NH;
    for (int i = 0; i < n; i++) h[i] = powf(2.0f, -8.0f * (i % NH + 1) / NH) * (1.0f + 0.5f * (i / NH));
    float *d;
    CUDA_OK(cudaMalloc((void **)&d, n * sizeof(float)));
    CUDA_OK(cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice));
    return d;
}

// The CPU reference's forward and backward of pc (host tensors, lse contiguous); slopes per batch
// row run one batch row at a time with that row's slopes, so the comparison does not depend on
// the CPU reading alibi_batch_stride.
static void cpu_reference(const AttnParams *pc) {
    if (!pc->alibi_slopes || !pc->alibi_batch_stride) {
        attn_forward_cpu(pc);
        attn_backward_cpu(pc);
        return;
    }
    for (int b = 0; b < pc->B; b++) {
        AttnParams r = *pc;
        r.B = 1;
        r.alibi_slopes = pc->alibi_slopes + b * pc->alibi_batch_stride;
        r.alibi_batch_stride = 0;
        r.q = (const float *)pc->q + b * pc->q_st.batch;
        r.k = (const float *)pc->k + b * pc->k_st.batch;
        r.v = (const float *)pc->v + b * pc->v_st.batch;
        r.dout = (const float *)pc->dout + b * pc->do_st.batch;
        r.out = (float *)pc->out + b * pc->o_st.batch;
        r.dq = (float *)pc->dq + b * pc->dq_st.batch;
        r.dk = (float *)pc->dk + b * pc->dk_st.batch;
        r.dv = (float *)pc->dv + b * pc->dv_st.batch;
        r.lse = pc->lse + (size_t)b * pc->NH * pc->T_q;
        attn_forward_cpu(&r);
        attn_backward_cpu(&r);
    }
}

static void run_case(AttnContext *ctx, const Case *c, Rng *rng) {
    char err[ERR_LEN];
    const int B = c->B, Tq = c->T_q, Tk = c->T_k, NH = c->NH, NKV = c->NKV, HS = c->HS;
    const DType dt = c->dtype;
    Buf q, k, v, dq, dk, dv;
    Buf qkv_all = {0}, dqkv_all = {0};
    if (c->fused) {  // (B, T, (NH + 2 NKV) * HS) as the model's QKV projection writes it
        const int W = (NH + 2 * NKV) * HS;
        AttnStrides st = {(int64_t)Tq * W, W, HS};
        qkv_all = buf_alloc((size_t)B * Tq * W, st, dt);
        dqkv_all = buf_alloc((size_t)B * Tq * W, st, dt);
        q = qkv_all; k = qkv_all; v = qkv_all;
        k.h += NH * HS; v.h += (NH + NKV) * HS;
        k.d = (char *)k.d + NH * HS * esize(dt); v.d = (char *)v.d + (NH + NKV) * HS * esize(dt);
        dq = dqkv_all; dk = dqkv_all; dv = dqkv_all;
        dk.h += NH * HS; dv.h += (NH + NKV) * HS;
        dk.d = (char *)dk.d + NH * HS * esize(dt); dv.d = (char *)dv.d + (NH + NKV) * HS * esize(dt);
    } else {
        AttnStrides sq = {(int64_t)Tq * NH * HS, NH * HS, HS}, sk = {(int64_t)Tk * NKV * HS, NKV * HS, HS};
        q = buf_alloc((size_t)B * Tq * NH * HS, sq, dt);
        dq = buf_alloc((size_t)B * Tq * NH * HS, sq, dt);
        k = buf_alloc((size_t)B * Tk * NKV * HS, sk, dt);
        v = buf_alloc((size_t)B * Tk * NKV * HS, sk, dt);
        dk = buf_alloc((size_t)B * Tk * NKV * HS, sk, dt);
        dv = buf_alloc((size_t)B * Tk * NKV * HS, sk, dt);
    }
    AttnStrides so = {(int64_t)Tq * NH * HS, NH * HS, HS};
    Buf out = buf_alloc((size_t)B * Tq * NH * HS, so, dt), dout = buf_alloc((size_t)B * Tq * NH * HS, so, dt);

    // inputs: randn rounded to the element type, so CPU and GPU see identical values
    Buf *ins[4] = {c->fused ? &qkv_all : &q, c->fused ? NULL : &k, c->fused ? NULL : &v, &dout};
    for (int i = 0; i < 4; i++) {
        if (!ins[i]) continue;
        for (size_t e = 0; e < ins[i]->n; e++) {
            const int key = (int)(e / ((size_t)NKV * HS) % Tk);
            const float grow = c->ramp && i == 1 ? 1.f + 6.f * (float)(Tk - 1 - key) / (float)Tk : 1.f;
            ins[i]->h[e] = round_to(dt, grow * rng_normal(rng));
        }
        upload(ins[i]->d, ins[i]->h, ins[i]->n, dt);
    }

    float slopes_h[4 * 64];
    float *slopes_d = c->alibi ? make_slopes(slopes_h, B, NH, c->alibi == 2) : NULL;
    int cu_h[64 * 3 + 1], n_docs = 0;
    int *cu_d = NULL;
    if (c->docs) {  // three documents per row of uneven lengths (the last may be short)
        cu_h[0] = 0;
        for (int b = 0; b < B; b++) {
            cu_h[++n_docs] = b * Tq + Tq / 3 + 1;
            cu_h[++n_docs] = b * Tq + (3 * Tq) / 4;
            cu_h[++n_docs] = (b + 1) * Tq;
        }
        CUDA_OK(cudaMalloc((void **)&cu_d, (n_docs + 1) * sizeof(int)));
        CUDA_OK(cudaMemcpy(cu_d, cu_h, (n_docs + 1) * sizeof(int), cudaMemcpyHostToDevice));
    }

    AttnParams p;
    memset(&p, 0, sizeof p);
    p.B = B; p.T_q = Tq; p.T_k = Tk; p.NH = NH; p.NKV = NKV; p.HS = HS;
    p.scale = 1.0f / sqrtf((float)HS);
    p.causal = c->causal; p.window_left = c->wl; p.window_right = c->wr;
    p.dropout_p = c->dropout; p.seed = 1234; p.offset = 77;
    p.dtype = dt; p.impl = c->impl; p.deterministic = c->deterministic;
    p.softcap = c->softcap;
    p.q_st = q.st; p.k_st = k.st; p.v_st = v.st; p.o_st = out.st; p.do_st = dout.st;
    p.dq_st = dq.st; p.dk_st = dk.st; p.dv_st = dv.st;
    p.n_docs = c->docs ? n_docs : 0;
    p.alibi_batch_stride = c->alibi == 2 ? NH : 0;
    if (p.causal && Tq > Tk) {  // bottom-right alignment, given as explicit positions
        p.pos_explicit = 1;
        p.k_pos0 = Tq - Tk;
    }

    // CPU reference (fp32) on the host copies
    AttnParams pc = p;
    pc.dtype = DTYPE_F32; pc.impl = ATTN_IMPL_FLASH; pc.deterministic = 0;
    pc.q = q.h; pc.k = k.h; pc.v = v.h; pc.dout = dout.h;
    Buf out_c = buf_host(out.n, out.st);
    Buf dq_c = buf_host(dq.n, dq.st), dk_c = buf_host(dk.n, dk.st), dv_c = buf_host(dv.n, dv.st);
    if (c->fused) {  // the fused gradient views start at their heads' columns, like the device ones
        dk_c.h += NH * HS; dv_c.h += (NH + NKV) * HS;
    }
    float *lse_c = malloc((size_t)B * NH * Tq * sizeof(float));
    pc.out = out_c.h; pc.lse = lse_c; pc.dq = dq_c.h; pc.dk = dk_c.h; pc.dv = dv_c.h;
    pc.alibi_slopes = c->alibi ? slopes_h : NULL;
    pc.cu_seqlens = c->docs ? cu_h : NULL;
    int cpu_ok = attn_check(&pc, DEVICE_CPU, 1, err, sizeof err) == 0;
    EXPECT(cpu_ok, "%s: CPU reference rejects the case: %s", c->name, err);
    if (cpu_ok) cpu_reference(&pc);

    // float64 and same-precision references
    size_t nq = (size_t)B * Tq * NH * HS, nk = (size_t)B * Tk * NKV * HS, nl = (size_t)B * NH * Tq;
    Ref rs[2];
    refs_compute(rs, &pc, &q, &k, &v, &dout, c->alibi ? slopes_h : NULL, dt);
    const Ref r64 = rs[0], rlp = rs[1];

    // GPU, with every output poisoned (0xFF bytes: NaN in every element type) first
    p.q = q.d; p.k = k.d; p.v = v.d; p.out = out.d; p.dout = dout.d; p.dq = dq.d; p.dk = dk.d; p.dv = dv.d;
    p.alibi_slopes = slopes_d; p.cu_seqlens = cu_d;
    float *lse_d;
    CUDA_OK(cudaMalloc((void **)&lse_d, nl * sizeof(float)));
    p.lse = lse_d;
    p.workspace_bytes = attn_workspace_bytes(&p, DEVICE_CUDA);
    CUDA_OK(cudaMalloc(&p.workspace, p.workspace_bytes ? p.workspace_bytes : 16));
    CUDA_OK(cudaMemset(out.d, 0xFF, out.n * esize(dt)));
    CUDA_OK(cudaMemset(lse_d, 0xFF, nl * sizeof(float)));
    EXPECT(attn_forward(ctx, &p, err, sizeof err) == 0, "%s: forward refused: %s", c->name, err);
    CUDA_OK(cudaGetLastError());
    if (c->fused) {
        CUDA_OK(cudaMemset(dqkv_all.d, 0xFF, dqkv_all.n * esize(dt)));
    } else {
        CUDA_OK(cudaMemset(dq.d, 0xFF, dq.n * esize(dt)));
        CUDA_OK(cudaMemset(dk.d, 0xFF, dk.n * esize(dt)));
        CUDA_OK(cudaMemset(dv.d, 0xFF, dv.n * esize(dt)));
    }
    EXPECT(attn_backward(ctx, &p, err, sizeof err) == 0, "%s: backward refused: %s", c->name, err);
    CUDA_OK(cudaDeviceSynchronize());

    float *lse_g = malloc(nl * sizeof(float));
    CUDA_OK(cudaMemcpy(lse_g, lse_d, nl * sizeof(float), cudaMemcpyDeviceToHost));
    download(out.h, out.d, out.n, dt);
    if (c->fused) download(dqkv_all.h, dqkv_all.d, dqkv_all.n, dt);
    else {
        download(dq.h, dq.d, dq.n, dt);
        download(dk.h, dk.d, dk.n, dt);
        download(dv.h, dv.d, dv.n, dt);
    }

    // errors: GPU vs float64, same-precision straightforward vs float64, GPU vs CPU
    const char *names[4] = {"out", "dq", "dk", "dv"};
    const Buf *gpu[4] = {&out, &dq, &dk, &dv}, *cpu[4] = {&out_c, &dq_c, &dk_c, &dv_c};
    const double *ref[4] = {r64.out, r64.dq, r64.dk, r64.dv}, *lowp[4] = {rlp.out, rlp.dq, rlp.dk, rlp.dv};
    const int Ts[4] = {Tq, Tq, Tk, Tk}, Hs[4] = {NH, NH, NKV, NKV};
    const size_t ns[4] = {nq, nq, nk, nk};
    printf("  %-34s", c->name);
    double *tmp = malloc((nq > nk ? nq : nk) * sizeof(double));
    for (int i = 0; i < 4; i++) {
        double e_gpu = err_vs(gpu[i], ref[i], ref[i], B, Ts[i], Hs[i], HS);
        double e_lp = err_d(lowp[i], ref[i], ns[i]);
        double bound = 2 * e_lp + ATOL;
        to_contig(cpu[i], tmp, B, Ts[i], Hs[i], HS);
        double e_cpu_ref = err_d(tmp, ref[i], ns[i]);
        double e_gpu_cpu = err_vs(gpu[i], tmp, ref[i], B, Ts[i], Hs[i], HS);
        printf(" %s %.1e/%.1e", names[i], e_gpu, bound);
        EXPECT(e_gpu <= bound, "%s: %s error vs float64 %.3e > bound %.3e (2 x %.3e + %.0e)", c->name, names[i],
               e_gpu, bound, e_lp, ATOL);
        EXPECT(e_gpu_cpu <= bound + e_cpu_ref, "%s: %s error vs CPU reference %.3e > %.3e", c->name, names[i],
               e_gpu_cpu, bound + e_cpu_ref);
    }
    double lse_err;
    EXPECT(lse_ok(lse_g, r64.lse, nl, &lse_err), "%s: LSE wrong or not +inf on a fully masked row (worst %.2e)",
           c->name, lse_err);
    printf(" lse %.1e\n", lse_err);

    if (c->deterministic) {  // a second backward must give the same bits in dq, dk and dv
        size_t n1, n2;
        void *first = grads_bytes(c->fused ? &dqkv_all : NULL, &dq, &dk, &dv, dt, &n1);
        EXPECT(attn_backward(ctx, &p, err, sizeof err) == 0, "%s: second backward refused: %s", c->name, err);
        CUDA_OK(cudaDeviceSynchronize());
        void *again = grads_bytes(c->fused ? &dqkv_all : NULL, &dq, &dk, &dv, dt, &n2);
        EXPECT(n1 == n2 && memcmp(first, again, n1) == 0, "%s: deterministic backward differs between two runs",
               c->name);
        free(first);
        free(again);
    }

    free(tmp);
    free(lse_g);
    free(lse_c);
    refs_free(rs);
    CUDA_OK(cudaFree(lse_d));
    CUDA_OK(cudaFree(p.workspace));
    if (slopes_d) CUDA_OK(cudaFree(slopes_d));
    if (cu_d) CUDA_OK(cudaFree(cu_d));
    if (c->fused) {
        dk_c.h -= NH * HS; dv_c.h -= (NH + NKV) * HS;
        buf_free(&qkv_all); buf_free(&dqkv_all);
    } else {
        buf_free(&q); buf_free(&k); buf_free(&v); buf_free(&dq); buf_free(&dk); buf_free(&dv);
    }
    buf_free(&dq_c); buf_free(&dk_c); buf_free(&dv_c);
    buf_free(&out_c);
    buf_free(&out);
    buf_free(&dout);
}

// ---- chunk pairs (context parallelism's ring) ---------------------------------------------

// One problem of T queries and T keys split at q_split and k_split into two query chunks and
// two key chunks, all four pairs run as separate calls.
typedef struct {
    const char *name;
    DType dtype;
    int B, T, NH, NKV, HS;
    int causal, wl, wr, alibi;  // alibi as in Case
    int q_split, k_split;
    int deterministic;
} ChunkCase;

// The pair (queries [q0, q1), keys [k0, k1)) of the unsplit problem p: explicit positions, every
// tensor pointer moved to its chunk's first row (dq, dk, dv fp32, as accumulate reads them), the
// lse addressed inside p's (B, NH, T) layout through its strides.
static AttnParams chunk_params(const AttnParams *p, int q0, int q1, int k0, int k1) {
    AttnParams c = *p;
    const size_t es = esize(p->dtype);
    c.pos_explicit = 1;
    c.q_pos0 = q0;
    c.k_pos0 = k0;
    c.T_q = q1 - q0;
    c.T_k = k1 - k0;
    c.q = (const char *)p->q + q0 * p->q_st.row * es;
    c.k = (const char *)p->k + k0 * p->k_st.row * es;
    c.v = (const char *)p->v + k0 * p->v_st.row * es;
    c.out = (char *)p->out + q0 * p->o_st.row * es;
    c.dout = (const char *)p->dout + q0 * p->do_st.row * es;
    c.dq = (float *)p->dq + q0 * p->dq_st.row;
    c.dk = (float *)p->dk + k0 * p->dk_st.row;
    c.dv = (float *)p->dv + k0 * p->dv_st.row;
    c.lse = p->lse + q0;
    c.lse_batch_stride = (int64_t)p->NH * p->T_q;
    c.lse_head_stride = p->T_q;
    return c;
}

// run_chunks' backward again from the same start values, the calls of each query chunk sharing
// D (computed by its first call, read by its second: attention.h's dsum) and, without the
// deterministic backward, one dQ accumulator (dq_accum) added into the fp32 dq once by
// attn_dq_accum_store. dK and dV depend on D alone, the same floats, so with the deterministic
// backward they and dQ equal run_chunks' (grads[g]->h: the calls' share) bitwise; without it the
// accumulated dQ, and dK and dV where the stream-K backward shares a key tile between two blocks
// (their atomics), sum in another order: within 1e-5 of the calls' own (relative L2), and
// within run_chunks' bound against float64.
static void chunks_shared(AttnContext *ctx, const ChunkCase *c, const AttnParams *p, const int qb[3],
                          const int kb[3], Buf *const grads[3], float *const start[3],
                          const double *const ref[3], const double *const lowp[3]) {
    char err[ERR_LEN];
    const int B = c->B, NH = c->NH, NKV = c->NKV, HS = c->HS;
    float *dsum_d[2], *acc_d[2] = {NULL, NULL};
    for (int qc = 0; qc < 2; qc++) {
        const AttnParams pp = chunk_params(p, qb[qc], qb[qc + 1], kb[0], kb[1]);
        CUDA_OK(cudaMalloc((void **)&dsum_d[qc], (size_t)B * NH * pp.T_q * sizeof(float)));
        if (c->deterministic) continue;
        CUDA_OK(cudaMalloc((void **)&acc_d[qc], attn_dq_accum_floats(&pp) * sizeof(float)));
        CUDA_OK(cudaMemset(acc_d[qc], 0, attn_dq_accum_floats(&pp) * sizeof(float)));
    }
    for (int g = 0; g < 3; g++) upload(grads[g]->d, start[g], grads[g]->n, DTYPE_F32);
    for (int kc = 0; kc < 2; kc++)
        for (int qc = 0; qc < 2; qc++) {
            AttnParams pp = chunk_params(p, qb[qc], qb[qc + 1], kb[kc], kb[kc + 1]);
            pp.dsum = dsum_d[qc];
            pp.dsum_ready = kc > 0;
            pp.dq_accum = acc_d[qc];
            EXPECT(attn_backward(ctx, &pp, err, sizeof err) == 0, "%s: shared backward of chunk pair "
                   "(%d, %d) refused: %s", c->name, qc, kc, err);
        }
    for (int qc = 0; qc < 2 && !c->deterministic; qc++) {
        AttnParams pp = chunk_params(p, qb[qc], qb[qc + 1], kb[0], kb[1]);
        pp.dq_accum = acc_d[qc];
        EXPECT(attn_dq_accum_store(ctx, &pp, err, sizeof err) == 0, "%s: dQ store refused: %s", c->name, err);
    }
    CUDA_OK(cudaDeviceSynchronize());
    printf("  %-34s shared:", "");
    const char *names[3] = {"dq", "dk", "dv"};
    const int Hs[3] = {NH, NKV, NKV};
    for (int g = 0; g < 3; g++) {
        float *h = malloc(grads[g]->n * sizeof(float));
        download(h, grads[g]->d, grads[g]->n, DTYPE_F32);
        for (size_t e = 0; e < grads[g]->n; e++) h[e] -= start[g][e];
        const double from_own = rel_err_f32(h, grads[g]->h, grads[g]->n);
        if (c->deterministic)
            EXPECT(memcmp(h, grads[g]->h, grads[g]->n * sizeof(float)) == 0,
                   "%s: %s with D shared differs from the calls' own", c->name, names[g]);
        else  // the same sums in another order: far closer than either is to float64
            EXPECT(from_own <= 1e-5, "%s: %s with D shared is %.2e from the calls' own (relative L2; the order "
                   "of a sum moves it by a few fp32 ulps)", c->name, names[g], from_own);
        Buf got = *grads[g];
        got.h = h;
        const double e_gpu = err_vs(&got, ref[g], ref[g], B, c->T, Hs[g], HS);
        const double bound = 2 * err_d(lowp[g], ref[g], grads[g]->n) + ATOL;
        printf(" %s %.1e/%.1e (%.0e from own)", names[g], e_gpu, bound, from_own);
        EXPECT(e_gpu <= bound, "%s: shared %s error vs float64 %.3e > bound %.3e", c->name, names[g], e_gpu, bound);
        free(h);
    }
    printf("\n");
    for (int qc = 0; qc < 2; qc++) {
        CUDA_OK(cudaFree(dsum_d[qc]));
        if (acc_d[qc]) CUDA_OK(cudaFree(acc_d[qc]));
    }
}

// Forward over the four pairs (each pair's out into its key chunk's own tensor, its lse into its
// key chunk's plane of (2, B, NH, T) by the lse strides), merged on the host through the lse;
// then the backward of every pair with accumulate, from the merged out and lse, adding into fp32
// dq, dk, dv that start from random values. Merged out and lse and the summed gradients must
// match the unsplit problem's float64 reference within the bounds of run_case. Then the same
// backward again with the calls' per-query work shared (chunks_shared). With sm90 (ctx runs the
// sm90 family), a case named "stream-K" must run some of its backward calls on the stream-K
// instance (attn_backward_stream_k); a deterministic one never does.
static void run_chunks(AttnContext *ctx, const ChunkCase *c, Rng *rng, int sm90) {
    char err[ERR_LEN];
    const int B = c->B, T = c->T, NH = c->NH, NKV = c->NKV, HS = c->HS;
    const DType dt = c->dtype;
    const AttnStrides sq = {(int64_t)T * NH * HS, NH * HS, HS}, sk = {(int64_t)T * NKV * HS, NKV * HS, HS};
    const size_t nq = (size_t)B * T * NH * HS, nk = (size_t)B * T * NKV * HS, nl = (size_t)B * NH * T;
    Buf q = buf_alloc(nq, sq, dt), k = buf_alloc(nk, sk, dt), v = buf_alloc(nk, sk, dt), dout = buf_alloc(nq, sq, dt);
    Buf out = buf_alloc(nq, sq, dt), part[2] = {buf_alloc(nq, sq, dt), buf_alloc(nq, sq, dt)};
    Buf dq = buf_alloc(nq, sq, DTYPE_F32), dk = buf_alloc(nk, sk, DTYPE_F32), dv = buf_alloc(nk, sk, DTYPE_F32);
    Buf *ins[4] = {&q, &k, &v, &dout}, *grads[3] = {&dq, &dk, &dv};
    for (int i = 0; i < 4; i++) {
        for (size_t e = 0; e < ins[i]->n; e++) ins[i]->h[e] = round_to(dt, rng_normal(rng));
        upload(ins[i]->d, ins[i]->h, ins[i]->n, dt);
    }
    float slopes_h[4 * 64];
    float *slopes_d = c->alibi ? make_slopes(slopes_h, B, NH, c->alibi == 2) : NULL;

    AttnParams p;
    memset(&p, 0, sizeof p);
    p.B = B; p.T_q = p.T_k = T; p.NH = NH; p.NKV = NKV; p.HS = HS;
    p.scale = 1.0f / sqrtf((float)HS);
    p.causal = c->causal; p.window_left = c->wl; p.window_right = c->wr;
    p.dtype = dt; p.impl = ATTN_IMPL_FLASH; p.deterministic = c->deterministic;
    p.alibi_batch_stride = c->alibi == 2 ? NH : 0;
    p.q_st = p.o_st = p.do_st = p.dq_st = sq;
    p.k_st = p.v_st = p.dk_st = p.dv_st = sk;
    Ref rs[2];
    refs_compute(rs, &p, &q, &k, &v, &dout, c->alibi ? slopes_h : NULL, dt);
    const Ref r64 = rs[0], rlp = rs[1];

    const int qb[3] = {0, c->q_split, T}, kb[3] = {0, c->k_split, T};
    float *lse_d, *lse_parts_d;
    CUDA_OK(cudaMalloc((void **)&lse_d, nl * sizeof(float)));
    CUDA_OK(cudaMalloc((void **)&lse_parts_d, 2 * nl * sizeof(float)));
    CUDA_OK(cudaMemset(lse_parts_d, 0xFF, 2 * nl * sizeof(float)));  // NaN: every row must be written
    p.q = q.d; p.k = k.d; p.v = v.d; p.dout = dout.d; p.dq = dq.d; p.dk = dk.d; p.dv = dv.d;
    p.alibi_slopes = slopes_d;
    for (int kc = 0; kc < 2; kc++) {
        CUDA_OK(cudaMemset(part[kc].d, 0xFF, nq * esize(dt)));
        for (int qc = 0; qc < 2; qc++) {
            AttnParams pp = p;
            pp.out = part[kc].d;
            pp.lse = lse_parts_d + kc * nl;
            pp = chunk_params(&pp, qb[qc], qb[qc + 1], kb[kc], kb[kc + 1]);
            EXPECT(attn_forward(ctx, &pp, err, sizeof err) == 0, "%s: forward of chunk pair (%d, %d) refused: %s",
                   c->name, qc, kc, err);
        }
    }
    CUDA_OK(cudaDeviceSynchronize());
    float *lse_parts = malloc(2 * nl * sizeof(float)), *lse = malloc(nl * sizeof(float));
    CUDA_OK(cudaMemcpy(lse_parts, lse_parts_d, 2 * nl * sizeof(float), cudaMemcpyDeviceToHost));
    for (int kc = 0; kc < 2; kc++) download(part[kc].h, part[kc].d, nq, dt);
    for (int b = 0; b < B; b++)  // the merge of attention.h's attn_merge, in double
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < T; i++) {
                const size_t l = ((size_t)b * NH + h) * T + i;
                const float l0 = lse_parts[l], l1 = lse_parts[nl + l];
                const double m = isinf(l0) ? l1 : isinf(l1) ? l0 : fmax(l0, l1);
                const double w0 = isinf(l0) ? 0 : exp(l0 - m), w1 = isinf(l1) ? 0 : exp(l1 - m);
                lse[l] = w0 + w1 > 0 ? (float)(m + log(w0 + w1)) : INFINITY;
                if (isnan(l0) || isnan(l1)) lse[l] = NAN;
                const float *o0 = at(&part[0], b, i, h), *o1 = at(&part[1], b, i, h);
                float *o = at(&out, b, i, h);
                for (int d = 0; d < HS; d++)
                    o[d] = w0 + w1 > 0 ? (float)((w0 * o0[d] + w1 * o1[d]) / (w0 + w1)) : 0.f;
            }
    double lse_err;
    printf("  %-34s", c->name);
    const double e_out = err_vs(&out, r64.out, r64.out, B, T, NH, HS), b_out = 2 * err_d(rlp.out, r64.out, nq) + ATOL;
    printf(" out %.1e/%.1e", e_out, b_out);
    EXPECT(e_out <= b_out, "%s: merged out error vs float64 %.3e > bound %.3e", c->name, e_out, b_out);
    EXPECT(lse_ok(lse, r64.lse, nl, &lse_err), "%s: merged LSE wrong or not +inf on a fully masked row (worst %.2e)",
           c->name, lse_err);

    // backward from the merged out (in the element type) and lse
    for (size_t e = 0; e < nq; e++) out.h[e] = round_to(dt, out.h[e]);
    upload(out.d, out.h, nq, dt);
    CUDA_OK(cudaMemcpy(lse_d, lse, nl * sizeof(float), cudaMemcpyHostToDevice));
    float *start[3];
    for (int g = 0; g < 3; g++) {
        start[g] = malloc(grads[g]->n * sizeof(float));
        for (size_t e = 0; e < grads[g]->n; e++) start[g][e] = grads[g]->h[e] = rng_normal(rng);
        upload(grads[g]->d, grads[g]->h, grads[g]->n, DTYPE_F32);
    }
    p.out = out.d;
    p.lse = lse_d;
    p.accumulate = 1;
    int stream_k = 0;  // calls on the stream-K instance
    for (int kc = 0; kc < 2; kc++)
        for (int qc = 0; qc < 2; qc++) {
            AttnParams pp = chunk_params(&p, qb[qc], qb[qc + 1], kb[kc], kb[kc + 1]);
            stream_k += attn_backward_stream_k(ctx, &pp);
            EXPECT(attn_backward(ctx, &pp, err, sizeof err) == 0, "%s: backward of chunk pair (%d, %d) refused: %s",
                   c->name, qc, kc, err);
        }
    if (sm90 && strstr(c->name, "stream-K"))
        EXPECT(stream_k > 0, "%s: no backward call ran the stream-K instance", c->name);
    if (c->deterministic || !sm90)
        EXPECT(stream_k == 0, "%s: %d backward calls ran the stream-K instance (not with the deterministic "
               "backward, nor off the sm90 family)", c->name, stream_k);
    CUDA_OK(cudaDeviceSynchronize());
    const char *names[3] = {"dq", "dk", "dv"};
    const double *ref[3] = {r64.dq, r64.dk, r64.dv}, *lowp[3] = {rlp.dq, rlp.dk, rlp.dv};
    const int Hs[3] = {NH, NKV, NKV};
    for (int g = 0; g < 3; g++) {
        download(grads[g]->h, grads[g]->d, grads[g]->n, DTYPE_F32);
        for (size_t e = 0; e < grads[g]->n; e++) grads[g]->h[e] -= start[g][e];  // this call's share
        const double e_gpu = err_vs(grads[g], ref[g], ref[g], B, T, Hs[g], HS);
        const double bound = 2 * err_d(lowp[g], ref[g], g ? nk : nq) + ATOL;
        printf(" %s %.1e/%.1e", names[g], e_gpu, bound);
        EXPECT(e_gpu <= bound, "%s: summed %s error vs float64 %.3e > bound %.3e", c->name, names[g], e_gpu, bound);
    }
    printf(" lse %.1e\n", lse_err);
    chunks_shared(ctx, c, &p, qb, kb, grads, start, ref, lowp);
    for (int g = 0; g < 3; g++) free(start[g]);

    free(lse_parts);
    free(lse);
    refs_free(rs);
    CUDA_OK(cudaFree(lse_d));
    CUDA_OK(cudaFree(lse_parts_d));
    if (slopes_d) CUDA_OK(cudaFree(slopes_d));
    Buf *all[10] = {&q, &k, &v, &dout, &out, &part[0], &part[1], &dq, &dk, &dv};
    for (int i = 0; i < 10; i++) buf_free(all[i]);
}

// Dropout statistics: the keep rate of attn_dropout_keep (the rule the kernels share, and which
// the CPU comparison above shows they follow) is 1 - round(256 p) / 256 within 5 standard
// deviations.
static void test_dropout_stats(void) {
    AttnParams p;
    memset(&p, 0, sizeof p);
    p.B = 2; p.NH = 3; p.T_q = p.T_k = 300; p.dropout_p = 0.2f; p.seed = 99; p.offset = 5;
    long kept = 0, n = 0;
    for (int b = 0; b < p.B; b++)
        for (int h = 0; h < p.NH; h++)
            for (int i = 0; i < p.T_q; i++)
                for (int j = 0; j < p.T_k; j++, n++) kept += attn_dropout_keep(&p, b, h, i, j);
    const double expect = 1.0 / attn_dropout_keep_scale(&p);  // 1 - 51 / 256
    double rate = (double)kept / n, sd = sqrt(0.2 * 0.8 / n);
    EXPECT(fabs(rate - expect) < 5 * sd, "keep rate %.5f, expected %.5f +- %.5f", rate, expect, 5 * sd);
}

// Refusals come back as a status and a message naming attention's parameter; the process (and
// the context) carry on: a head size without a kernel, then a problem that runs.
static void test_refusals(AttnContext *ctx) {
    const int B = 1, T = 8, NH = 1, HS = 80;
    AttnParams p;
    memset(&p, 0, sizeof p);
    void *buf;
    float *lse;
    CUDA_OK(cudaMalloc(&buf, (size_t)4 * B * T * NH * 128 * 2));
    CUDA_OK(cudaMalloc((void **)&lse, (size_t)B * NH * T * sizeof(float)));
    attn_fused_qkv(&p, buf, (char *)buf + (size_t)3 * B * T * NH * 128 * 2, B, T, NH, NH, HS, 2);
    p.lse = lse;
    p.causal = 1;
    p.window_left = p.window_right = -1;
    p.dtype = DTYPE_BF16;
    char err[ERR_LEN] = "";
    EXPECT(attn_forward(ctx, &p, err, sizeof err) == -1 && strstr(err, "HS = 80"),
           "head size 80: expected a refusal naming HS, got '%s'", err);
    attn_fused_qkv(&p, buf, (char *)buf + (size_t)3 * B * T * NH * 128 * 2, B, T, NH, NH, 128, 2);
    EXPECT(attn_forward(ctx, &p, err, sizeof err) == 0, "head size 128 after a refusal: %s", err);
    p.window_left = -5;
    EXPECT(attn_forward(ctx, &p, err, sizeof err) == -1 && strstr(err, "window"),
           "window -5: expected a refusal naming the window, got '%s'", err);
    // fp32 runs the naive kernels, which overwrite dq, dk and dv: a backward with accumulate
    // (the ring's sum over key blocks) is refused, never computed wrong; without it, it runs.
    const size_t n = (size_t)B * T * NH * 128;   // elements of each of q, k, v, out, dq, dk, dv, dout
    float *f32;
    CUDA_OK(cudaMalloc((void **)&f32, 8 * n * sizeof(float)));
    CUDA_OK(cudaMemset(f32, 0, 8 * n * sizeof(float)));
    attn_fused_qkv(&p, f32, f32 + 3 * n, B, T, NH, NH, 128, sizeof(float));
    attn_fused_qkv_grads(&p, f32 + 4 * n, f32 + 7 * n, sizeof(float));
    p.window_left = -1;
    p.dtype = DTYPE_F32;
    EXPECT(attn_forward(ctx, &p, err, sizeof err) == 0, "fp32 forward: %s", err);
    p.accumulate = 1;
    EXPECT(attn_backward(ctx, &p, err, sizeof err) == -1 && strstr(err, "accumulate"),
           "fp32 backward with accumulate: expected a refusal naming accumulate, got '%s'", err);
    p.accumulate = 0;
    EXPECT(attn_backward(ctx, &p, err, sizeof err) == 0, "fp32 backward after the refusal: %s", err);
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaFree(f32));
    CUDA_OK(cudaFree(buf));
    CUDA_OK(cudaFree(lse));
}

// A context that asked for the sm90 family runs the forward at head size 256 and refuses the
// backward there (its dK and dV do not fit the registers), naming the head sizes it takes; a
// context of kernel auto runs that backward on the sm80 family.
static void test_sm90_head_sizes(AttnContext *sm90, AttnContext *autos) {
    const int B = 1, T = 8, NH = 1, HS = 256;
    const size_t n = (size_t)B * T * NH * HS;   // elements of each of q, k, v, out, dq, dk, dv, dout
    void *buf;
    float *lse;
    CUDA_OK(cudaMalloc(&buf, 8 * n * 2));
    CUDA_OK(cudaMemset(buf, 0, 8 * n * 2));
    CUDA_OK(cudaMalloc((void **)&lse, (size_t)B * NH * T * sizeof(float)));
    AttnParams p;
    memset(&p, 0, sizeof p);
    attn_fused_qkv(&p, buf, (char *)buf + 3 * n * 2, B, T, NH, NH, HS, 2);
    attn_fused_qkv_grads(&p, (char *)buf + 4 * n * 2, (char *)buf + 7 * n * 2, 2);
    p.lse = lse;
    p.causal = 1;
    p.window_left = p.window_right = -1;
    p.dtype = DTYPE_BF16;
    p.scale = 1.0f / 16.0f;
    char err[ERR_LEN] = "";
    EXPECT(attn_forward(sm90, &p, err, sizeof err) == 0, "sm90 forward at HS 256: %s", err);
    EXPECT(attn_backward(sm90, &p, err, sizeof err) == -1 && strstr(err, "32, 64, 96 and 128") &&
               strstr(err, "HS = 256"),
           "sm90 backward at HS 256: expected a refusal naming the head sizes it takes, got '%s'", err);
    EXPECT(attn_backward(autos, &p, err, sizeof err) == 0, "auto backward at HS 256 after the refusal: %s", err);
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaFree(buf));
    CUDA_OK(cudaFree(lse));
}

// ---- the features on the sm90 family ------------------------------------------------------

// Dropout masks of the kernels themselves, read back bit by bit for a forward on family f and a
// backward on family g (every pair of the flash families, and the naive path with itself): with
// q = k = 0 every visible probability is 1 / T_k, v the identity (key j in column j) and dout the
// identity (query i in column i), out[b, i, h, j] and dv[b, j, h, i] are keep(b, h, i, j) /
// ((1 - p) T_k) or exactly 0. Both must equal attn_dropout_keep at every element (T_k odd:
// Philox blocks straddle rows), and the keep rate must be 1 - p within 5 standard deviations.
// dev_part != 0: the kernels get the offset as 3 - dev_part plus dev_part in device memory
// (offset_dev, a CUDA graph's per-step counter), and must draw offset 3's masks.
static const char *const MASK_FAMILY[3] = {"auto", "sm80", "naive"};
static void dropout_masks_case(AttnContext *const ctxs[2], int B, int NH, int T_q, int T_k, int HS, float drop,
                               uint64_t dev_part) {
    char err[ERR_LEN];
    const DType dt = DTYPE_BF16;
    AttnStrides sq = {(int64_t)T_q * NH * HS, NH * HS, HS}, sk = {(int64_t)T_k * NH * HS, NH * HS, HS};
    const size_t nq = (size_t)B * T_q * NH * HS, nk = (size_t)B * T_k * NH * HS;
    Buf q = buf_alloc(nq, sq, dt), k = buf_alloc(nk, sk, dt), v = buf_alloc(nk, sk, dt);
    Buf out = buf_alloc(nq, sq, dt), dout = buf_alloc(nq, sq, dt), dq = buf_alloc(nq, sq, dt);
    Buf dk = buf_alloc(nk, sk, dt), dv = buf_alloc(nk, sk, dt);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            for (int j = 0; j < T_k; j++) at(&v, b, j, h)[j] = 1.0f;
            for (int i = 0; i < T_q; i++) at(&dout, b, i, h)[i] = 1.0f;
        }
    upload(q.d, q.h, nq, dt);
    upload(k.d, k.h, nk, dt);
    upload(v.d, v.h, nk, dt);
    upload(dout.d, dout.h, nq, dt);
    AttnParams p;
    memset(&p, 0, sizeof p);
    p.B = B; p.T_q = T_q; p.T_k = T_k; p.NH = p.NKV = NH; p.HS = HS;
    p.scale = 1.0f / sqrtf((float)HS);
    p.window_left = p.window_right = -1;
    p.dropout_p = drop; p.seed = 0x5eed1234abcdull; p.offset = 3;
    p.dtype = dt;
    p.q = q.d; p.k = k.d; p.v = v.d; p.out = out.d; p.dout = dout.d; p.dq = dq.d; p.dk = dk.d; p.dv = dv.d;
    p.q_st = p.o_st = p.do_st = p.dq_st = sq;
    p.k_st = p.v_st = p.dk_st = p.dv_st = sk;
    CUDA_OK(cudaMalloc((void **)&p.lse, (size_t)B * NH * T_q * sizeof(float)));
    const AttnParams ref = p;  // the host's view of the draws: offset 3 as an argument
    uint64_t *part = NULL;
    if (dev_part) {
        CUDA_OK(cudaMalloc((void **)&part, sizeof *part));
        CUDA_OK(cudaMemcpy(part, &dev_part, sizeof *part, cudaMemcpyHostToDevice));
        p.offset = 3 - dev_part;
        p.offset_dev = part;
    }
    const float half = 0.5f / ((1.0f - drop) * T_k);
    for (int f = 0; f < 3; f++)
        for (int g = 0; g < 3; g++) {
            if ((f == 2) != (g == 2)) continue;
            p.impl = f == 2 ? ATTN_IMPL_NAIVE : ATTN_IMPL_FLASH;
            EXPECT(attn_forward(ctxs[f == 1], &p, err, sizeof err) == 0, "dropout masks: forward refused: %s", err);
            EXPECT(attn_backward(ctxs[g == 1], &p, err, sizeof err) == 0, "dropout masks: backward refused: %s", err);
            CUDA_OK(cudaDeviceSynchronize());
            download(out.h, out.d, nq, dt);
            download(dv.h, dv.d, nk, dt);
            long bad_fwd = 0, bad_bwd = 0, kept = 0, n = 0;
            for (int b = 0; b < B; b++)
                for (int h = 0; h < NH; h++)
                    for (int i = 0; i < T_q; i++)
                        for (int j = 0; j < T_k; j++, n++) {
                            const int keep = attn_dropout_keep(&ref, b, h, i, j);
                            kept += keep;
                            bad_fwd += (at(&out, b, i, h)[j] > half) != keep;
                            bad_bwd += (at(&dv, b, j, h)[i] > half) != keep;
                        }
            EXPECT(bad_fwd == 0 && bad_bwd == 0,
                   "dropout masks, forward on %s and backward on %s (HS %d, T_k %d, offset %s): %ld / %ld "
                   "forward and %ld backward elements differ from attn_dropout_keep",
                   MASK_FAMILY[f], MASK_FAMILY[g], HS, T_k, dev_part ? "split with device memory" : "an argument",
                   bad_fwd, n, bad_bwd);
            const double rate = (double)kept / n, sd = sqrt(drop * (1.0 - drop) / n);
            EXPECT(fabs(rate - (1.0 - drop)) < 5 * sd, "dropout masks: keep rate %.5f, expected %.5f +- %.5f", rate,
                   1.0 - drop, 5 * sd);
        }
    CUDA_OK(cudaFree(p.lse));
    if (part) CUDA_OK(cudaFree(part));
    Buf *all[8] = {&q, &k, &v, &out, &dout, &dq, &dk, &dv};
    for (int i = 0; i < 8; i++) buf_free(all[i]);
}
static void test_dropout_masks(AttnContext *const ctxs[2]) {
    dropout_masks_case(ctxs, 2, 2, 64, 63, 64, 0.3f, 0);
    dropout_masks_case(ctxs, 1, 3, 127, 125, 128, 0.1f, 0);
    dropout_masks_case(ctxs, 2, 2, 31, 29, 32, 0.3f, 0);
    dropout_masks_case(ctxs, 1, 2, 90, 95, 96, 0.2f, 0);
    dropout_masks_case(ctxs, 1, 2, 250, 253, 256, 0.15f, 0);
    dropout_masks_case(ctxs, 2, 2, 64, 63, 64, 0.3f, ((uint64_t)7 << 40) + 12345);
    dropout_masks_case(ctxs, 1, 3, 127, 125, 128, 0.1f, ((uint64_t)1 << 63) + 1);   // 3 - part wraps
}

// Soft-capping runs on the sm90 family (and the naive path) only: on Hopper the cases below run
// there against the references, and a context of kernel sm80 refuses them with a message
// naming softcap; on another GPU the refusal is all there is to check.
static void test_softcap_families(AttnContext *sm90, AttnContext *sm80, Rng *rng) {
    const DType BF = DTYPE_BF16, FP = DTYPE_F16;
    const AttnImpl FL = ATTN_IMPL_FLASH;
    // name, dtype, impl, B, T_q, T_k, NH, NKV, HS, causal, wl, wr, alibi, docs, fused, dropout, det, softcap
    const Case cases[] = {
        {"sm90 bf16 hs64 softcap 1.5 causal GQA T=333", BF, FL, 2, 333, 333, 4, 2, 64, 1, -1, -1, 0, 0, 0, 0, 0, 1.5f, 0},
        {"sm90 fp16 hs128 softcap 2 Tq=70 Tk=300", FP, FL, 1, 70, 300, 2, 1, 128, 0, -1, -1, 0, 0, 0, 0, 0, 2.0f, 0},
        {"sm90 bf16 hs64 softcap 1.5 alibi/row win 40/10", BF, FL, 2, 257, 257, 2, 2, 64, 1, 40, 10, 2, 0, 0, 0, 0,
         1.5f, 0},
        {"sm90 bf16 hs128 softcap 3 drop 0.2 Tq=300 Tk=97", BF, FL, 2, 300, 97, 4, 2, 128, 1, -1, -1, 0, 0, 0, 0.2f, 0,
         3.0f, 0},
        {"sm90 fp16 hs64 softcap 50 docs fused", FP, FL, 3, 190, 190, 2, 1, 64, 0, -1, -1, 0, 1, 1, 0, 0, 50.0f, 0},
        {"sm90 bf16 hs96 softcap 2 causal GQA T=300 drop", BF, FL, 2, 300, 300, 4, 2, 96, 1, -1, -1, 0, 0, 0, 0.1f, 0, 2.0f, 0},
        {"sm90 fp16 hs32 softcap 1.5 Tq=70 Tk=300 alibi", FP, FL, 1, 70, 300, 2, 1, 32, 0, -1, -1, 1, 0, 0, 0, 0, 1.5f, 0},
        {"sm90 bf16 hs64 softcap 0.8 alibi drop T=1500", BF, FL, 1, 1500, 1500, 2, 2, 64, 1, -1, -1, 1, 0, 0, 0.1f, 0,
         0.8f, 0},
    };
    if (sm90)
        for (int i = 0; i < (int)(sizeof cases / sizeof *cases); i++) run_case(sm90, &cases[i], rng);
    else
        printf("  no sm90 family on this GPU or binary: only the sm80 refusal is checked\n");
    // The refusal: sizes that run, softcap set, on the sm80 family.
    const int B = 1, T = 8, NH = 1, HS = 64;
    AttnParams p;
    memset(&p, 0, sizeof p);
    void *buf;
    float *lse;
    CUDA_OK(cudaMalloc(&buf, (size_t)4 * B * T * NH * HS * 2));
    CUDA_OK(cudaMalloc((void **)&lse, (size_t)B * NH * T * sizeof(float)));
    attn_fused_qkv(&p, buf, (char *)buf + (size_t)3 * B * T * NH * HS * 2, B, T, NH, NH, HS, 2);
    p.lse = lse;
    p.window_left = p.window_right = -1;
    p.dtype = DTYPE_BF16;
    p.softcap = 30.0f;
    char err[ERR_LEN] = "";
    EXPECT(attn_forward(sm80, &p, err, sizeof err) == -1 && strstr(err, "softcap"),
           "softcap on the sm80 family: expected a refusal naming softcap, got '%s'", err);
    p.impl = ATTN_IMPL_NAIVE;
    EXPECT(attn_forward(sm80, &p, err, sizeof err) == 0, "softcap on the naive path after a refusal: %s", err);
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaFree(buf));
    CUDA_OK(cudaFree(lse));
}

int main(int argc, char **argv) {
    const int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("no CUDA device: skipped\n0 passed, 0 failed\n");
        return 0;
    }
    Rng rng;
    rng_seed(&rng, 42);
    const DType BF = DTYPE_BF16, FP = DTYPE_F16;
    const AttnImpl FL = ATTN_IMPL_FLASH, NV = ATTN_IMPL_NAIVE;
    // name, dtype, impl, B, T_q, T_k, NH, NKV, HS, causal, wl, wr, alibi, docs, fused, dropout, det, softcap
    const Case quick_cases[] = {
        {"quick bf16 hs64 causal T=97", BF, FL, 1, 97, 97, 2, 1, 64, 1, -1, -1, 0, 0, 1, 0, 0, 0, 0},
        {"quick fp16 hs128 T=70 alibi+drop", FP, FL, 1, 70, 70, 2, 2, 128, 1, -1, -1, 1, 0, 0, 0.1f, 1, 0, 0},
        {"quick bf16 hs64 docs naive", BF, NV, 2, 50, 50, 2, 2, 64, 1, -1, -1, 0, 1, 0, 0, 0, 0, 0},
        {"quick bf16 hs96 causal GQA T=70 fused", BF, FL, 1, 70, 70, 4, 2, 96, 1, -1, -1, 0, 0, 1, 0, 0, 0, 0},
        {"quick fp16 hs256 T=65 alibi det", FP, FL, 1, 65, 65, 2, 1, 256, 0, -1, -1, 1, 0, 0, 0, 1, 0, 0},
        {"quick bf16 hs32 causal T=97 drop", BF, FL, 2, 97, 97, 2, 2, 32, 1, -1, -1, 0, 0, 0, 0.1f, 0, 0, 0},
        {"quick bf16 hs128 T=300 ramp", BF, FL, 1, 300, 300, 2, 2, 128, 0, -1, -1, 0, 0, 0, 0, 0, 0, 1},
    };
    const Case cases[] = {
        {"bf16 hs64 T=1", BF, FL, 2, 1, 1, 2, 2, 64, 0, -1, -1, 0, 0, 0, 0, 0, 0, 0},
        {"bf16 hs64 causal T=1", BF, FL, 1, 1, 1, 2, 2, 64, 1, -1, -1, 0, 0, 0, 0, 0, 0, 0},
        {"bf16 hs64 causal T=17", BF, FL, 2, 17, 17, 3, 3, 64, 1, -1, -1, 0, 0, 0, 0, 0, 0, 0},
        {"bf16 hs64 T=64", BF, FL, 1, 64, 64, 2, 2, 64, 0, -1, -1, 0, 0, 0, 0, 0, 0, 0},
        {"bf16 hs64 causal T=97 fused", BF, FL, 2, 97, 97, 4, 4, 64, 1, -1, -1, 0, 0, 1, 0, 0, 0, 0},
        {"bf16 hs64 T=128", BF, FL, 1, 128, 128, 2, 2, 64, 0, -1, -1, 0, 0, 0, 0, 0, 0, 0},
        {"bf16 hs64 causal T=1000", BF, FL, 1, 1000, 1000, 2, 2, 64, 1, -1, -1, 0, 0, 0, 0, 0, 0, 0},
        {"bf16 hs64 T=1025", BF, FL, 1, 1025, 1025, 2, 1, 64, 0, -1, -1, 0, 0, 0, 0, 0, 0, 0},
        {"bf16 hs64 causal T=4096", BF, FL, 1, 4096, 4096, 1, 1, 64, 1, -1, -1, 0, 0, 0, 0, 0, 0, 0},
        {"bf16 hs128 causal T=97", BF, FL, 2, 97, 97, 2, 2, 128, 1, -1, -1, 0, 0, 0, 0, 0, 0, 0},
        {"bf16 hs128 T=1025 fused", BF, FL, 1, 1025, 1025, 2, 2, 128, 0, -1, -1, 0, 0, 1, 0, 0, 0, 0},
        {"fp16 hs64 causal T=333", FP, FL, 2, 333, 333, 2, 2, 64, 1, -1, -1, 0, 0, 0, 0, 0, 0, 0},
        {"fp16 hs128 T=200", FP, FL, 1, 200, 200, 3, 3, 128, 0, -1, -1, 0, 0, 0, 0, 0, 0, 0},
        {"bf16 hs64 GQA 8/2 causal T=300", BF, FL, 2, 300, 300, 8, 2, 64, 1, -1, -1, 0, 0, 1, 0, 0, 0, 0},
        {"bf16 hs128 MQA 4/1 T=150", BF, FL, 1, 150, 150, 4, 1, 128, 0, -1, -1, 0, 0, 0, 0, 0, 0, 0},
        {"bf16 hs64 Tq=37 Tk=300", BF, FL, 2, 37, 300, 2, 2, 64, 0, -1, -1, 0, 0, 0, 0, 0, 0, 0},
        {"bf16 hs128 causal Tq=37 Tk=300", BF, FL, 1, 37, 300, 2, 1, 128, 1, -1, -1, 0, 0, 0, 0, 0, 0, 0},
        {"bf16 hs64 window 31/0 causal", BF, FL, 1, 513, 513, 2, 2, 64, 1, 31, 0, 0, 0, 0, 0, 0, 0, 0},
        {"bf16 hs128 window 50/20", BF, FL, 2, 400, 400, 2, 2, 128, 0, 50, 20, 0, 0, 0, 0, 0, 0, 0},
        {"bf16 hs128 T=700 ramp", BF, FL, 1, 700, 700, 2, 2, 128, 0, -1, -1, 0, 0, 0, 0, 0, 0, 1},
        {"fp16 hs64 causal T=1500 ramp", FP, FL, 1, 1500, 1500, 2, 2, 64, 1, -1, -1, 0, 0, 0, 0, 0, 0, 1},
        {"bf16 hs64 T=777 ramp alibi", BF, FL, 1, 777, 777, 2, 2, 64, 0, -1, -1, 1, 0, 0, 0, 0, 0, 1},
        {"fp16 hs128 causal T=600 ramp drop", FP, FL, 1, 600, 600, 2, 2, 128, 1, -1, -1, 0, 0, 0, 0.1f, 0, 0, 1},
        {"bf16 hs64 masked rows Tq=200 Tk=40", BF, FL, 1, 200, 40, 2, 2, 64, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0},
        {"bf16 hs64 alibi causal T=300", BF, FL, 1, 300, 300, 4, 4, 64, 1, -1, -1, 1, 0, 0, 0, 0, 0, 0},
        {"bf16 hs64 docs causal B=2 T=256", BF, FL, 2, 256, 256, 2, 2, 64, 1, -1, -1, 0, 1, 0, 0, 0, 0, 0},
        {"fp16 hs128 docs T=190", FP, FL, 3, 190, 190, 2, 1, 128, 0, -1, -1, 0, 1, 1, 0, 0, 0, 0},
        {"bf16 hs64 dropout 0.1 causal T=200", BF, FL, 2, 200, 200, 2, 2, 64, 1, -1, -1, 0, 0, 0, 0.1f, 0, 0, 0},
        {"fp16 hs128 dropout 0.3 T=129", FP, FL, 1, 129, 129, 2, 1, 128, 0, -1, -1, 0, 0, 0, 0.3f, 0, 0, 0},
        {"bf16 hs64 deterministic causal T=500", BF, FL, 2, 500, 500, 4, 2, 64, 1, -1, -1, 0, 0, 1, 0, 1, 0, 0},
        {"bf16 hs128 deterministic T=300", BF, FL, 1, 300, 300, 2, 2, 128, 0, 40, 40, 1, 0, 0, 0.1f, 1, 0, 0},
        {"naive bf16 hs64 causal T=300 GQA", BF, NV, 2, 300, 300, 4, 2, 64, 1, -1, -1, 0, 0, 1, 0, 0, 0, 0},
        {"naive fp16 hs128 T=97 drop+alibi", FP, NV, 1, 97, 97, 2, 2, 128, 0, -1, -1, 1, 0, 0, 0.2f, 0, 0, 0},
        {"naive fp32 hs64 causal T=100", DTYPE_F32, NV, 1, 100, 100, 2, 2, 64, 1, -1, -1, 0, 0, 0, 0, 0, 0, 0},
        {"naive bf16 hs64 window+docs", BF, NV, 2, 120, 120, 2, 2, 64, 1, 20, 0, 0, 1, 0, 0, 0, 0, 0},
        {"bf16 hs64 GQA 4/2 causal Tq=300 Tk=97", BF, FL, 2, 300, 97, 4, 2, 64, 1, -1, -1, 0, 0, 0, 0, 0, 0, 0},
        {"fp16 hs128 GQA 4/1 causal Tq=200 Tk=70 win 30/0", FP, FL, 1, 200, 70, 4, 1, 128, 1, 30, 0, 0, 0, 0, 0, 0, 0, 0},
        {"bf16 hs64 causal Tq=257 Tk=129 win 40/10 det", BF, FL, 2, 257, 129, 2, 2, 64, 1, 40, 10, 0, 0, 0, 0, 1, 0, 0},
        {"bf16 hs64 alibi per batch row causal", BF, FL, 3, 150, 150, 4, 2, 64, 1, -1, -1, 2, 0, 0, 0, 0, 0, 0},
        {"naive bf16 hs64 GQA causal Tq=200 Tk=77 win 20/0", BF, NV, 2, 200, 77, 4, 2, 64, 1, 20, 0, 0, 0, 0, 0, 0, 0, 0},
        {"naive fp32 hs32 MQA causal Tq=130 Tk=64", DTYPE_F32, NV, 1, 130, 64, 4, 1, 32, 1, -1, -1, 0, 0, 0, 0, 0, 0, 0},
        {"naive bf16 hs64 alibi per batch row causal", BF, NV, 3, 150, 150, 4, 2, 64, 1, -1, -1, 2, 0, 0, 0, 0, 0, 0},
        {"naive fp16 hs128 softcap 1.5 causal alibi", FP, NV, 2, 97, 97, 2, 2, 128, 1, -1, -1, 1, 0, 0, 0, 0, 1.5f, 0},
        {"naive bf16 hs64 softcap 2 Tq=70 Tk=150 GQA", BF, NV, 1, 70, 150, 4, 2, 64, 0, -1, -1, 0, 0, 0, 0, 0, 2.0f, 0},
        {"naive fp32 softcap 0.7 causal Tq=100 Tk=60 drop", DTYPE_F32, NV, 1, 100, 60, 2, 1, 64, 1, -1, -1, 2, 0, 0,
         0.1f, 0, 0.7f, 0},
        {"fp32 (naive) softcap 5 alibi per row", DTYPE_F32, FL, 2, 90, 90, 2, 2, 64, 0, 30, 30, 2, 0, 0, 0, 0, 5.0f, 0},
        {"fp16 hs128 alibi per batch row det", FP, FL, 2, 100, 100, 2, 2, 128, 0, 20, 20, 2, 0, 0, 0, 1, 0, 0},
        // head sizes 32, 96 and 256 (sm80 tiles of their own; on Hopper the sm90 family in HS 64's and
        // HS 128's tiles, but the backward at 256)
        {"bf16 hs32 causal T=1", BF, FL, 1, 1, 1, 2, 2, 32, 1, -1, -1, 0, 0, 0, 0, 0, 0, 0},
        {"bf16 hs32 causal T=4100 (three warpgroups)", BF, FL, 1, 4100, 4100, 1, 1, 32, 1, -1, -1, 0, 0, 0, 0, 0, 0, 0},
        {"fp16 hs96 causal T=4100 fused", FP, FL, 1, 4100, 4100, 1, 1, 96, 1, -1, -1, 0, 0, 1, 0, 0, 0, 0},
        {"bf16 hs32 causal GQA 6/2 T=257 fused", BF, FL, 2, 257, 257, 6, 2, 32, 1, -1, -1, 0, 0, 1, 0, 0, 0, 0},
        {"fp16 hs32 Tq=37 Tk=300", FP, FL, 2, 37, 300, 2, 2, 32, 0, -1, -1, 0, 0, 0, 0, 0, 0, 0},
        {"bf16 hs32 T=1025 window 50/20 det", BF, FL, 1, 1025, 1025, 2, 1, 32, 0, 50, 20, 0, 0, 0, 0, 1, 0, 0},
        {"bf16 hs32 alibi+drop docs causal", BF, FL, 2, 190, 190, 2, 2, 32, 1, -1, -1, 1, 1, 0, 0.2f, 0, 0, 0},
        {"bf16 hs96 causal T=333 fused", BF, FL, 2, 333, 333, 3, 3, 96, 1, -1, -1, 0, 0, 1, 0, 0, 0, 0},
        {"fp16 hs96 GQA 4/2 T=200", FP, FL, 1, 200, 200, 4, 2, 96, 0, -1, -1, 0, 0, 0, 0, 0, 0, 0},
        {"bf16 hs96 causal Tq=300 Tk=97 MQA", BF, FL, 2, 300, 97, 4, 1, 96, 1, -1, -1, 0, 0, 0, 0, 0, 0, 0},
        {"bf16 hs96 T=1025 masked rows win 3/0", BF, FL, 1, 1025, 1025, 2, 2, 96, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0},
        {"fp16 hs96 alibi drop 0.1 det T=129", FP, FL, 1, 129, 129, 2, 2, 96, 1, -1, -1, 2, 0, 0, 0.1f, 1, 0, 0},
        {"bf16 hs96 docs causal fused", BF, FL, 3, 190, 190, 2, 1, 96, 1, -1, -1, 0, 1, 1, 0, 0, 0, 0},
        {"bf16 hs256 causal T=300 fused", BF, FL, 1, 300, 300, 2, 2, 256, 1, -1, -1, 0, 0, 1, 0, 0, 0, 0},
        {"fp16 hs256 GQA 4/2 Tq=70 Tk=129", FP, FL, 2, 70, 129, 4, 2, 256, 0, -1, -1, 0, 0, 0, 0, 0, 0, 0},
        {"bf16 hs256 causal T=97 win 40/0", BF, FL, 2, 97, 97, 2, 2, 256, 1, 40, 0, 0, 0, 0, 0, 0, 0, 0},
        {"bf16 hs256 alibi drop 0.2 det T=200", BF, FL, 1, 200, 200, 2, 1, 256, 1, -1, -1, 1, 0, 0, 0.2f, 1, 0, 0},
        {"fp16 hs256 docs T=190 fused", FP, FL, 2, 190, 190, 2, 2, 256, 0, -1, -1, 0, 1, 1, 0, 0, 0, 0},
    };
    // name, dtype, B, T, NH, NKV, HS, causal, wl, wr, alibi, q_split, k_split, det
    const ChunkCase chunk_cases[] = {
        {"chunks bf16 hs64 causal GQA", BF, 2, 300, 4, 2, 64, 1, -1, -1, 0, 170, 70, 0},
        {"chunks fp16 hs128 causal window 50/0", FP, 1, 257, 2, 1, 128, 1, 50, 0, 0, 100, 190, 0},
        {"chunks bf16 hs64 full window 30/30", BF, 1, 200, 2, 2, 64, 0, 30, 30, 0, 64, 137, 0},
        {"chunks bf16 hs64 causal alibi per row", BF, 2, 160, 2, 2, 64, 1, -1, -1, 2, 97, 33, 0},
        {"chunks bf16 hs128 causal deterministic", BF, 1, 230, 2, 2, 128, 1, -1, -1, 1, 129, 100, 1},
        {"chunks bf16 hs32 causal GQA", BF, 2, 200, 4, 2, 32, 1, -1, -1, 0, 70, 130, 0},
        {"chunks fp16 hs96 causal window 60/0", FP, 1, 257, 2, 1, 96, 1, 60, 0, 0, 100, 190, 0},
        {"chunks bf16 hs96 full stream-K", BF, 1, 1400, 4, 4, 96, 0, -1, -1, 0, 650, 650, 0},
        {"chunks fp16 hs32 full GQA stream-K", FP, 2, 1100, 4, 2, 32, 0, -1, -1, 0, 500, 600, 0},
        {"chunks bf16 hs256 causal alibi deterministic", BF, 1, 190, 2, 2, 256, 1, -1, -1, 1, 97, 64, 1},
        // more pair iterations than multiprocessors: stream-K blocks whose runs cross key tiles;
        // then more units (key tiles x heads) than two waves of 132: whole units first
        {"chunks bf16 hs64 full GQA stream-K", BF, 2, 1100, 4, 2, 64, 0, -1, -1, 0, 500, 600, 0},
        {"chunks fp16 hs128 causal stream-K", FP, 1, 1400, 4, 4, 128, 1, -1, -1, 0, 650, 650, 0},
        {"chunks bf16 hs64 full 48 heads stream-K waves", BF, 2, 400, 48, 48, 64, 0, -1, -1, 0, 100, 100, 0},
    };
    const ChunkCase quick_chunks[] = {
        {"quick chunks bf16 hs64 causal", BF, 1, 100, 2, 1, 64, 1, -1, -1, 0, 60, 30, 0},
    };
    const Case *list = quick ? quick_cases : cases;
    const int n = quick ? (int)(sizeof quick_cases / sizeof *quick_cases) : (int)(sizeof cases / sizeof *cases);
    printf("case: error vs float64 / bound (2 x same-precision error + %.0e) per output\n", ATOL);
    // Every case runs on the kernel family the selection picks (on Hopper the sm90 family where
    // it applies), then again with the sm80 family forced, so both stay covered on one GPU.
    char err[ERR_LEN];
    AttnContext *ctxs[2] = {attn_context_create(DEVICE_CUDA, NULL, ATTN_KERNEL_AUTO, err, sizeof err),
                            attn_context_create(DEVICE_CUDA, NULL, ATTN_KERNEL_SM80, err, sizeof err)};
    CHECK(ctxs[0] && ctxs[1]);
    // A context that asks for the sm90 family exists on a Hopper GPU with sm_90a code, where
    // the automatic one runs that family.
    AttnContext *sm90 = attn_context_create(DEVICE_CUDA, NULL, ATTN_KERNEL_SM90, err, sizeof err);
    for (int fam = 0; fam < 2; fam++) {
        for (int i = 0; i < n; i++) {
            char name[160];
            snprintf(name, sizeof name, "%s%s", fam ? "[sm80] " : "", list[i].name);
            TEST_CASE(name, run_case(ctxs[fam], &list[i], &rng));
        }
        const ChunkCase *chunks = quick ? quick_chunks : chunk_cases;
        const int n_chunks = quick ? (int)(sizeof quick_chunks / sizeof *quick_chunks)
                                   : (int)(sizeof chunk_cases / sizeof *chunk_cases);
        for (int i = 0; i < n_chunks; i++) {
            char name[160];
            snprintf(name, sizeof name, "%s%s", fam ? "[sm80] " : "", chunks[i].name);
            TEST_CASE(name, run_chunks(ctxs[fam], &chunks[i], &rng, fam == 0 && sm90));
        }
    }
    TEST_CASE("refusals return a status and leave the process running", test_refusals(ctxs[0]));
    TEST_CASE("dropout masks of every forward/backward family pair equal attn_dropout_keep (offset as an argument, "
              "and split with device memory)", test_dropout_masks(ctxs));
    if (!quick) TEST_CASE("softcap on the sm90 family, refused on sm80", test_softcap_families(sm90, ctxs[1], &rng));
    if (sm90)
        TEST_CASE("a context of kernel sm90 refuses the backward at HS 256, naming the head sizes it takes",
                  test_sm90_head_sizes(sm90, ctxs[0]));
    else
        printf("  no sm90 family on this GPU or binary: its head-size refusal is not checked\n");
    attn_context_destroy(sm90);
    attn_context_destroy(ctxs[0]);
    attn_context_destroy(ctxs[1]);
    TEST_CASE("dropout keep rate", test_dropout_stats());
    return TEST_SUMMARY();
}
