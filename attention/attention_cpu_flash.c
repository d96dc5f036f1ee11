// attention_cpu_flash: the FlashAttention-2 algorithm in fp32 on the CPU, the reference the CUDA
// flash kernels are checked against.
//
// Forward: per (b, h, query tile) a loop over the key tiles the tile's mask ranges touch (and,
// with a block mask, that its query block's list holds), with an online softmax (running max m and sum l per row); the output is written once, with
// lse = m + log(l). Backward: per (b, kv head) a loop over key tiles, recomputing P = exp(S - lse)
// per (query tile, key tile) from the saved lse; the thread owns dK/dV of its kv head and dQ of
// the query heads sharing it, so there are no races and the summation order is fixed
// (deterministic). No T x T matrix: extra memory is O(T + tile * (tile + HS)) per thread.
//
// Every sum runs in a fixed order that does not depend on the tensors' strides or on the thread
// count, so results are bitwise reproducible and equal for contiguous and fused QKV layouts.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention/attention.h"
#include "attention/attention_cpu.h"
#include "attention/mask.h"

// Tile shape: 64 x 64 fp32 scores are 16 KiB and a (64, HS <= 128) K^T tile 32 KiB, so one tile
// of each stays in L2 while the query rows stream past.
#define FLASH_BR 64  // query rows per tile
#define FLASH_BC 64  // keys per tile
_Static_assert(ATTN_SPARSE_BLOCK % FLASH_BR == 0 && ATTN_SPARSE_BLOCK % FLASH_BC == 0,
               "a block-sparse block is whole tiles");

typedef struct {
    float *kt;   // (HS, BC) K^T of the current key tile
    float *vt;   // (HS, BC) V^T (backward)
    float *s;    // (BR, BC) scores, then probabilities
    float *dp;   // (BR, BC) dP, then dS (backward)
    float *acc;  // (BR, HS) forward output accumulator; (BC, HS) dK accumulator in backward
    float *dv;   // (BC, HS) dV accumulator (backward)
    float *dcap; // (BR, BC) the soft-cap's derivative at each score (backward with softcap)
    float *m, *l;  // (BR) running max and sum (forward)
} FlashScratch;

// Returns 0, or -1 when an allocation failed (scratch_free still frees the rest).
static int scratch_alloc(FlashScratch *w, int HS) {
    w->kt = malloc(sizeof(float) * HS * FLASH_BC);
    w->vt = malloc(sizeof(float) * HS * FLASH_BC);
    w->s = malloc(sizeof(float) * FLASH_BR * FLASH_BC);
    w->dp = malloc(sizeof(float) * FLASH_BR * FLASH_BC);
    w->acc = malloc(sizeof(float) * (FLASH_BR > FLASH_BC ? FLASH_BR : FLASH_BC) * HS);
    w->dv = malloc(sizeof(float) * FLASH_BC * HS);
    w->dcap = malloc(sizeof(float) * FLASH_BR * FLASH_BC);
    w->m = malloc(sizeof(float) * FLASH_BR);
    w->l = malloc(sizeof(float) * FLASH_BR);
    return w->kt && w->vt && w->s && w->dp && w->acc && w->dv && w->dcap && w->m && w->l ? 0 : -1;
}

static void scratch_free(FlashScratch *w) {
    free(w->kt); free(w->vt); free(w->s); free(w->dp); free(w->acc); free(w->dv); free(w->dcap);
    free(w->m); free(w->l);
}

static int min_i(int a, int b) { return a < b ? a : b; }
static int max_i(int a, int b) { return a > b ? a : b; }

// xt (HS, BC) = rows j0 .. j0+bc-1 of head g of x, transposed.
static void gather_transposed(float *xt, const void *x, AttnStrides st, int b, int g, int j0, int bc,
                              int HS) {
    for (int c = 0; c < bc; c++) {
        const float *row = attn_cpu_row(x, st, b, j0 + c, g);
        for (int d = 0; d < HS; d++) xt[d * FLASH_BC + c] = row[d];
    }
}

// out (br, BC) = A (br rows of a tensor, head h, from row i0) . Xt (HS, BC): s[r][c] = a_r . x_c.
// The c loop is innermost (vectorised, no horizontal sums) and d is unrolled by 4 so each output
// row is loaded and stored a quarter as often; C evaluates o + a0 x0 + a1 x1 + ... left to right,
// so every element still sums over d in order.
static void tile_matmul_t(float *out, const void *a, AttnStrides st, int b, int h, int i0, int br,
                          const float *xt, int bc, int HS) {
    for (int r = 0; r < br; r++) {
        const float *ar = attn_cpu_row(a, st, b, i0 + r, h);
        float *restrict o = out + r * FLASH_BC;
        for (int c = 0; c < bc; c++) o[c] = 0.0f;
        int d = 0;
        for (; d + 4 <= HS; d += 4) {
            const float a0 = ar[d], a1 = ar[d + 1], a2 = ar[d + 2], a3 = ar[d + 3];
            const float *x0 = xt + d * FLASH_BC, *x1 = x0 + FLASH_BC, *x2 = x1 + FLASH_BC,
                        *x3 = x2 + FLASH_BC;
#pragma omp simd
            for (int c = 0; c < bc; c++) o[c] = o[c] + a0 * x0[c] + a1 * x1[c] + a2 * x2[c] + a3 * x3[c];
        }
        for (; d < HS; d++) {
            const float ad = ar[d], *x = xt + d * FLASH_BC;
#pragma omp simd
            for (int c = 0; c < bc; c++) o[c] += ad * x[c];
        }
    }
}

// y (n) += sum over t of coef[t] * x[t] (n), skipping zero coefficients (masked or dropped
// probabilities: their rows are never read, so garbage there cannot leak in as 0 * inf). Terms
// are added in order t = 0, 1, ..., four at a time to load and store y a quarter as often.
static void axpy_rows(float *restrict y, const float *coef, const float *const *x, int m, int n) {
    float a[FLASH_BR > FLASH_BC ? FLASH_BR : FLASH_BC];
    const float *xs[FLASH_BR > FLASH_BC ? FLASH_BR : FLASH_BC];
    int k = 0;
    for (int t = 0; t < m; t++)
        if (coef[t] != 0.0f) {
            a[k] = coef[t];
            xs[k++] = x[t];
        }
    int t = 0;
    for (; t + 4 <= k; t += 4) {
        const float a0 = a[t], a1 = a[t + 1], a2 = a[t + 2], a3 = a[t + 3];
        const float *restrict x0 = xs[t], *restrict x1 = xs[t + 1], *restrict x2 = xs[t + 2],
                              *restrict x3 = xs[t + 3];
#pragma omp simd
        for (int d = 0; d < n; d++) y[d] = y[d] + a0 * x0[d] + a1 * x1[d] + a2 * x2[d] + a3 * x3[d];
    }
    for (; t < k; t++) {
        const float a0 = a[t], *restrict x0 = xs[t];
#pragma omp simd
        for (int d = 0; d < n; d++) y[d] += a0 * x0[d];
    }
}

// Row pointers (b, t0 + t, h) for t < n of a strided tensor.
static void row_pointers(const float **rows, const void *x, AttnStrides st, int b, int t0, int n, int h) {
    for (int t = 0; t < n; t++) rows[t] = attn_cpu_row(x, st, b, t0 + t, h);
}

// Scaled, capped, biased and masked scores s (br, BC) of query rows i0.. against key tile j0..
// (K^T in w->kt). rng[r] is the key range of query i0 + r. Forward and backward share this so
// the backward recomputes exactly the forward's scores; with softcap, dcap (br, BC) receives the
// cap's derivative at each score when it is not NULL.
static void tile_scores(const AttnParams *p, float *s, float *dcap, const float *kt, int b, int h,
                        int i0, int br, int j0, int bc, const AttnKeyRange *rng) {
    tile_matmul_t(s, p->q, p->q_st, b, h, i0, br, kt, bc, p->HS);
    const int shift = (int)attn_query_shift(p);  // positions fit an int (train.seq_len <= 2^22)
    const float slope = p->alibi_slopes ? attn_alibi_slope(p, b, h) : 0.0f;
    int full = 1;  // every (r, c) visible: the bulk of the tiles skips the per-element mask
    for (int r = 0; r < br; r++) full &= rng[r].lo <= j0 && rng[r].hi >= j0 + bc;
    for (int r = 0; r < br; r++) {
        float *sr = s + r * FLASH_BC;
        for (int c = 0; c < bc; c++) sr[c] *= p->scale;
        if (p->softcap > 0.0f)
            for (int c = 0; c < bc; c++) {
                if (dcap) dcap[r * FLASH_BC + c] = attn_softcap_grad(p->softcap, sr[c]);
                sr[c] = attn_softcap(p->softcap, sr[c]);
            }
        if (p->alibi_slopes)
            for (int c = 0; c < bc; c++) sr[c] += attn_alibi_bias(slope, i0 + r + shift, j0 + c);
        if (!full)
            for (int c = 0; c < bc; c++)
                if (j0 + c < rng[r].lo || j0 + c >= rng[r].hi) sr[c] = -INFINITY;
    }
}

// Smallest lo and largest hi over the non-empty ranges (an empty union gives lo >= hi).
static AttnKeyRange ranges_union(const AttnKeyRange *rng, int n, int T_k) {
    AttnKeyRange u = {T_k, 0};
    for (int r = 0; r < n; r++)
        if (rng[r].lo < rng[r].hi) {
            u.lo = min_i(u.lo, rng[r].lo);
            u.hi = max_i(u.hi, rng[r].hi);
        }
    return u;
}

static void forward_tile(const AttnParams *p, FlashScratch *w, int b, int h, int i0) {
    const int HS = p->HS, br = min_i(FLASH_BR, p->T_q - i0), g = h / (p->NH / p->NKV);
    const float keep_scale = attn_dropout_keep_scale(p);
    AttnKeyRange rng[FLASH_BR];
    for (int r = 0; r < br; r++) rng[r] = attn_key_range(p, b, i0 + r);
    AttnKeyRange u = ranges_union(rng, br, p->T_k);
    float *acc = w->acc;  // (br, HS)
    for (int r = 0; r < br; r++) {
        w->m[r] = -INFINITY;
        w->l[r] = 0.0f;
        memset(acc + r * HS, 0, sizeof(float) * HS);
    }
    // Key tiles outside [u.lo, u.hi) are masked for every row of this query tile, and those of
    // the blocks a block mask leaves out are never read: both skipped.
    const AttnTileSpan span = attn_tile_span(p->sparse_q_offsets, p->sparse_q_blocks, i0 / ATTN_SPARSE_BLOCK,
                                             u.lo / FLASH_BC, (u.hi + FLASH_BC - 1) / FLASH_BC, FLASH_BC);
    for (int it = 0; it < span.count; it++) {
        const int j0 = attn_span_tile(&span, it) * FLASH_BC;
        const int bc = min_i(FLASH_BC, p->T_k - j0);
        gather_transposed(w->kt, p->k, p->k_st, b, g, j0, bc, HS);
        tile_scores(p, w->s, NULL, w->kt, b, h, i0, br, j0, bc, rng);
        const float *vrows[FLASH_BC];
        row_pointers(vrows, p->v, p->v_st, b, j0, bc, g);
        for (int r = 0; r < br; r++) {
            float *sr = w->s + r * FLASH_BC;
            float mx = -INFINITY;
            for (int c = 0; c < bc; c++) mx = sr[c] > mx ? sr[c] : mx;  // not fmaxf: a libm call at -O2
            const float m_new = fmaxf(w->m[r], mx);
            // A row masked so far has m = -inf: use 0 so exp(-inf - 0) = 0, never exp(NaN).
            const float m_use = m_new == -INFINITY ? 0.0f : m_new;
            const float alpha = expf(w->m[r] - m_use);
            float sum = 0.0f;
            float *ar = acc + r * HS;
            for (int d = 0; d < HS; d++) ar[d] *= alpha;
            for (int c = 0; c < bc; c++) {
                float pc = expf(sr[c] - m_use);
                sum += pc;
                if (p->dropout_p > 0.0f)
                    pc = attn_dropout_keep(p, b, h, i0 + r, j0 + c) ? pc * keep_scale : 0.0f;
                sr[c] = pc;
            }
            axpy_rows(ar, sr, vrows, bc, HS);
            w->l[r] = w->l[r] * alpha + sum;
            w->m[r] = m_new;
        }
    }
    for (int r = 0; r < br; r++) {
        float *o = attn_cpu_row_mut(p->out, p->o_st, b, i0 + r, h);
        float *lse = p->lse + attn_lse_offset(p, b, h) + i0 + r;
        const float *ar = acc + r * HS;
        if (w->l[r] > 0.0f) {
            const float inv = 1.0f / w->l[r];
            for (int d = 0; d < HS; d++) o[d] = ar[d] * inv;
            *lse = w->m[r] + logf(w->l[r]);
        } else {  // fully masked row
            for (int d = 0; d < HS; d++) o[d] = 0.0f;
            *lse = INFINITY;
        }
    }
}

// A thread whose scratch allocation fails skips its share of the work, and the call returns -1.
int attn_cpu_flash_forward(const AttnParams *p) {
    const int n_qt = (p->T_q + FLASH_BR - 1) / FLASH_BR;
    int failed = 0;
#pragma omp parallel reduction(|| : failed)
    {
        FlashScratch w;
        failed = scratch_alloc(&w, p->HS) != 0;
#pragma omp for collapse(3) schedule(dynamic)
        for (int b = 0; b < p->B; b++)
            for (int h = 0; h < p->NH; h++)
                for (int t = 0; t < n_qt; t++)
                    if (!failed) forward_tile(p, &w, b, h, t * FLASH_BR);
        scratch_free(&w);
    }
    return failed ? -1 : 0;
}

// Per (b, kv head g): per-row state shared by every key tile.
typedef struct {
    AttnKeyRange *rng;     // (T_q) key range of each query row
    AttnKeyRange *tiles;   // (n_qt) union of the ranges of each query tile
    float *D;              // (group, T_q) rowsum(dO * O) of each query head of the group
} BackwardRows;

// D of query head h (the hh-th of its group) in batch row b: the caller's rows of p->dsum
// (attention.h), or this thread's.
static float *head_dsum(const AttnParams *p, const BackwardRows *rows, int b, int h, int hh) {
    if (p->dsum) return p->dsum + ((int64_t)b * p->NH + h) * p->T_q;
    return rows->D + (int64_t)hh * p->T_q;
}

// Row (b, i, h) of the dQ that the backward adds scale * dS K into: dq, or the row of the caller's
// accumulator (its CPU layout: (B, NH, T_q, HS) row-major), which holds dS K and is scaled once
// when stored (attn_dq_accum_store_cpu).
static float *dq_row(const AttnParams *p, int b, int i, int h) {
    if (p->dq_accum) return p->dq_accum + (((int64_t)b * p->NH + h) * p->T_q + i) * p->HS;
    return attn_cpu_row_mut(p->dq, p->dq_st, b, i, h);
}

// dV_acc += P_d^T dO, dS = P * (dP - D) (times the cap's derivative with softcap),
// dK_acc += dS^T Q, dQ += scale * dS K for one (query tile, key tile) pair; w->s holds the
// scores on entry, w->dcap their cap derivatives.
static void backward_pair(const AttnParams *p, FlashScratch *w, const float *D, int b, int h, int g,
                          int i0, int br, int j0, int bc) {
    const int HS = p->HS;
    const float keep_scale = attn_dropout_keep_scale(p);
    const float *lse = p->lse + attn_lse_offset(p, b, h);
    tile_matmul_t(w->dp, p->dout, p->do_st, b, h, i0, br, w->vt, bc, HS);  // dO V^T (br, bc)
    for (int r = 0; r < br; r++) {
        const int i = i0 + r;
        float *sr = w->s + r * FLASH_BC, *dpr = w->dp + r * FLASH_BC;
        // lse = +inf (fully masked row) and s = -inf (masked element) both give P = 0.
        for (int c = 0; c < bc; c++) {
            float pc = expf(sr[c] - lse[i]), pd = pc, dpc = dpr[c];
            if (p->dropout_p > 0.0f) {
                int keep = attn_dropout_keep(p, b, h, i, j0 + c);
                pd = keep ? pc * keep_scale : 0.0f;
                dpc = keep ? dpc * keep_scale : 0.0f;
            }
            sr[c] = pd;                    // dropped probability: what multiplied V
            dpr[c] = pc * (dpc - D[i]);    // dS
            if (p->softcap > 0.0f) dpr[c] *= w->dcap[r * FLASH_BC + c];
        }
    }
    const float *qrows[FLASH_BR], *dorows[FLASH_BR], *krows[FLASH_BC];
    row_pointers(qrows, p->q, p->q_st, b, i0, br, h);
    row_pointers(dorows, p->dout, p->do_st, b, i0, br, h);
    row_pointers(krows, p->k, p->k_st, b, j0, bc, g);
    float coef[FLASH_BR > FLASH_BC ? FLASH_BR : FLASH_BC];
    const float dq_scale = p->dq_accum ? 1.0f : p->scale;
    for (int r = 0; r < br; r++) {  // dQ (br, HS) += scale * dS K
        for (int c = 0; c < bc; c++) coef[c] = dq_scale * w->dp[r * FLASH_BC + c];
        axpy_rows(dq_row(p, b, i0 + r, h), coef, krows, bc, HS);
    }
    for (int c = 0; c < bc; c++) {  // dV (bc, HS) += P_d^T dO, dK (bc, HS) += dS^T Q (unscaled)
        for (int r = 0; r < br; r++) coef[r] = w->s[r * FLASH_BC + c];
        axpy_rows(w->dv + c * HS, coef, dorows, br, HS);
        for (int r = 0; r < br; r++) coef[r] = w->dp[r * FLASH_BC + c];
        axpy_rows(w->acc + c * HS, coef, qrows, br, HS);
    }
}

static void backward_kv_head(const AttnParams *p, FlashScratch *w, BackwardRows *rows, int b, int g) {
    const int HS = p->HS, group = p->NH / p->NKV, n_qt = (p->T_q + FLASH_BR - 1) / FLASH_BR;
    for (int i = 0; i < p->T_q; i++) rows->rng[i] = attn_key_range(p, b, i);
    for (int t = 0; t < n_qt; t++)
        rows->tiles[t] = ranges_union(rows->rng + t * FLASH_BR, min_i(FLASH_BR, p->T_q - t * FLASH_BR),
                                      p->T_k);
    for (int hh = 0; hh < group; hh++) {
        const int h = g * group + hh;
        float *D = head_dsum(p, rows, b, h, hh);
        for (int i = 0; i < p->T_q && !p->dsum_ready; i++) {
            const float *o = attn_cpu_row(p->out, p->o_st, b, i, h);
            const float *dout = attn_cpu_row(p->dout, p->do_st, b, i, h);
            double dsum = 0.0;
            for (int d = 0; d < HS; d++) dsum += (double)dout[d] * o[d];
            D[i] = (float)dsum;
        }
        for (int i = 0; i < p->T_q && !p->accumulate && !p->dq_accum; i++)
            memset(attn_cpu_row_mut(p->dq, p->dq_st, b, i, h), 0, sizeof(float) * HS);
    }
    for (int j0 = 0; j0 < p->T_k; j0 += FLASH_BC) {
        const int bc = min_i(FLASH_BC, p->T_k - j0);
        // The query tiles of the blocks that read this key tile (all of them when dense).
        const AttnTileSpan span = attn_tile_span(p->sparse_k_offsets, p->sparse_k_blocks, j0 / ATTN_SPARSE_BLOCK,
                                                 0, n_qt, FLASH_BR);
        if (span.count > 0) {
            gather_transposed(w->kt, p->k, p->k_st, b, g, j0, bc, HS);
            gather_transposed(w->vt, p->v, p->v_st, b, g, j0, bc, HS);
        }
        memset(w->acc, 0, sizeof(float) * bc * HS);  // dK (bc, HS), unscaled
        memset(w->dv, 0, sizeof(float) * bc * HS);   // dV (bc, HS)
        for (int hh = 0; hh < group; hh++) {
            const int h = g * group + hh;
            for (int it = 0; it < span.count; it++) {
                const int t = attn_span_tile(&span, it);
                AttnKeyRange u = rows->tiles[t];
                if (u.lo >= u.hi || u.hi <= j0 || u.lo >= j0 + bc) continue;  // fully masked pair
                const int i0 = t * FLASH_BR, br = min_i(FLASH_BR, p->T_q - i0);
                tile_scores(p, w->s, w->dcap, w->kt, b, h, i0, br, j0, bc, rows->rng + i0);
                backward_pair(p, w, head_dsum(p, rows, b, h, hh), b, h, g, i0, br, j0, bc);
            }
        }
        for (int c = 0; c < bc; c++) {
            float *dk = attn_cpu_row_mut(p->dk, p->dk_st, b, j0 + c, g);
            float *dv = attn_cpu_row_mut(p->dv, p->dv_st, b, j0 + c, g);
            if (p->accumulate)
                for (int d = 0; d < HS; d++) {
                    dk[d] += p->scale * w->acc[c * HS + d];
                    dv[d] += w->dv[c * HS + d];
                }
            else
                for (int d = 0; d < HS; d++) {
                    dk[d] = p->scale * w->acc[c * HS + d];
                    dv[d] = w->dv[c * HS + d];
                }
        }
    }
}

int attn_cpu_flash_backward(const AttnParams *p) {
    const int group = p->NH / p->NKV, n_qt = (p->T_q + FLASH_BR - 1) / FLASH_BR;
    int failed = 0;
#pragma omp parallel reduction(|| : failed)
    {
        FlashScratch w;
        failed = scratch_alloc(&w, p->HS) != 0;
        BackwardRows rows = {malloc(sizeof(AttnKeyRange) * p->T_q), malloc(sizeof(AttnKeyRange) * n_qt),
                             malloc(sizeof(float) * (size_t)group * p->T_q)};
        failed = failed || !rows.rng || !rows.tiles || !rows.D;
#pragma omp for collapse(2) schedule(dynamic)
        for (int b = 0; b < p->B; b++)
            for (int g = 0; g < p->NKV; g++)
                if (!failed) backward_kv_head(p, &w, &rows, b, g);
        free(rows.rng); free(rows.tiles); free(rows.D);
        scratch_free(&w);
    }
    return failed ? -1 : 0;
}

void attn_dq_accum_store_cpu(const AttnParams *p) {
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < p->B; b++)
        for (int i = 0; i < p->T_q; i++)
            for (int h = 0; h < p->NH; h++) {
                const float *a = p->dq_accum + (((int64_t)b * p->NH + h) * p->T_q + i) * p->HS;
                float *dq = attn_cpu_row_mut(p->dq, p->dq_st, b, i, h);
                for (int d = 0; d < p->HS; d++) dq[d] = (p->accumulate ? dq[d] : 0.0f) + p->scale * a[d];
            }
}
