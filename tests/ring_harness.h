// ring_harness: ring attention (model/ring_attention.c) in one process, for the CPU test
// (tests/test_ring_attention.c) and the GPU one (tests/gpu/test_ring_attention_gpu.c): P
// threads, each with its own backend (on the CUDA backend: its own stream on the one GPU),
// exchange blocks through an in-memory RingLink; ring_results() returns every rank's output,
// lse and gradients on its zigzag tokens, and ring_whole() the same problem over the whole
// sequence in one attention call on a backend, for the comparison.
#pragma once
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/rng.h"
#include "model/backend.h"
#include "model/ring_attention.h"
#include "ring_hub.h"
#include "testlib.h"

#ifndef RING_HS
#define RING_HS 16  // head size; the GPU test sets 64 (a flash kernel's)
#endif
enum { RNH = 4, RNKV = 2, RHS = RING_HS };
#define RW ((RNH + 2 * RNKV) * RHS)  // elements per token of the fused qkv row

typedef struct {
    int P, c, window, alibi;        // ranks, tokens per chunk, attention.window (-1: none), ALiBi
    int B;                          // batch rows (with 1, a block of which one chunk is read,
                                    // and its dK/dV part, travel as that chunk alone)
    int deterministic;              // attention.deterministic: the ring adds dQ per call
    Backend *(*make_backend)(DType);  // one per rank thread, of dtype
    DType dtype;
    int T;                          // 2 * P * c
    float *qkv, *dout;              // whole sequence: (B, T, W), (B, T, NH * HS), host fp32
    float slopes[RNH];
    Hub hub;
    // per rank results on the local tokens: (B, TL, NH*HS), (B, NH, TL), (B, TL, W)
    float *out[HUB_MAXP], *lse[HUB_MAXP], *dqkv[HUB_MAXP];
} RingCase;

// The layer's attention over the fused buffer, as the model describes it.
static AttnParams ring_fused(const RingCase *r, const void *qkv, void *out, float *lse, int T,
                             const float *slopes, size_t es) {
    AttnParams p;
    memset(&p, 0, sizeof p);
    attn_fused_qkv(&p, qkv, out, r->B, T, RNH, RNKV, RHS, es);
    p.lse = lse;
    p.causal = 1;
    p.window_left = r->window;
    p.window_right = -1;
    p.alibi_slopes = r->alibi ? slopes : NULL;
    p.impl = ATTN_IMPL_FLASH;
    p.deterministic = r->deterministic;
    return p;
}

// Host fp32 -> backend memory of its dtype.
static void *ring_upload(Backend *be, const float *host, size_t n) {
    void *d = be->alloc(be, n * dtype_size(be->dtype));
    be->upload_f32(be, d, host, n);
    return d;
}

static float *ring_download(Backend *be, const void *d, size_t n) {
    float *h = xmalloc(n * sizeof(float));
    be->download_f32(be, h, d, n);
    return h;
}

typedef struct {
    RingCase *rc;
    int rank;
} RingJob;

static void *ring_rank_main(void *arg) {
    RingJob *j = arg;
    RingCase *r = j->rc;
    const int TL = r->T / r->P;
    Backend *be = r->make_backend(r->dtype);
    const size_t es = dtype_size(be->dtype), nq = (size_t)r->B * TL * RW, no = (size_t)r->B * TL * RNH * RHS;
    float *qkv = xmalloc(sizeof(float) * nq), *dout = xmalloc(sizeof(float) * no);
    for (int b = 0; b < r->B; b++)
        for (int t = 0; t < TL; t++) {
            const int g = ring_global_pos(j->rank, r->P, TL, t);
            memcpy(qkv + ((size_t)b * TL + t) * RW, r->qkv + ((size_t)b * r->T + g) * RW, sizeof(float) * RW);
            memcpy(dout + ((size_t)b * TL + t) * RNH * RHS, r->dout + ((size_t)b * r->T + g) * RNH * RHS,
                   sizeof(float) * RNH * RHS);
        }
    void *qkv_d = ring_upload(be, qkv, nq), *dout_d = ring_upload(be, dout, no);
    void *out_d = be->alloc(be, no * es), *dqkv_d = be->alloc(be, nq * es);
    unsigned char *nan = xmalloc(nq * es);  // all ones: NaN, as the gradients are OVERWRITTEN
    memset(nan, 0xff, nq * es);
    be->upload(be, dqkv_d, nan, nq * es);
    free(nan);
    float *lse_d = be->alloc(be, (size_t)r->B * RNH * TL * sizeof(float));
    float *slopes_d = be->alloc(be, sizeof r->slopes);
    be->upload(be, slopes_d, r->slopes, sizeof r->slopes);
    Port port = {&r->hub, be, j->rank};
    const RingLink link = hub_link(&port);
    RingAttention *ra = ring_attention_create(be, &link, r->B, TL, RNH, RNKV, RHS);
    AttnParams p;
    // Twice: the second pass finds the ring's buffers as the first left them (not zeroed as
    // allocated), so a missing zeroing shows.
    for (int pass = 0; pass < 2; pass++) {
        p = ring_fused(r, qkv_d, out_d, lse_d, TL, slopes_d, es);
        ring_attention_forward(ra, &p);
        p = ring_fused(r, qkv_d, out_d, lse_d, TL, slopes_d, es);
        attn_fused_qkv_grads(&p, dqkv_d, dout_d, es);
        ring_attention_backward(ra, &p);
    }
    be->synchronize(be);
    r->out[j->rank] = ring_download(be, out_d, no);
    r->dqkv[j->rank] = ring_download(be, dqkv_d, nq);
    r->lse[j->rank] = xmalloc((size_t)r->B * RNH * TL * sizeof(float));
    be->download(be, r->lse[j->rank], lse_d, (size_t)r->B * RNH * TL * sizeof(float));
    ring_attention_free(ra);
    void *bufs[] = {qkv_d, dout_d, out_d, dqkv_d, lse_d, slopes_d};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) be->release(be, bufs[i]);
    be->destroy(be);
    free(qkv);
    free(dout);
    return NULL;
}

// Fresh random inputs for rc (P, c, B, window, alibi, make_backend set): N(0, 1) qkv and dout,
// rounded through `round_be`'s dtype when it is not NULL (so every side sees the same values).
static void ring_inputs(RingCase *rc, Backend *round_be, uint64_t seed) {
    rc->T = 2 * rc->P * rc->c;
    Rng rng;
    rng_seed(&rng, seed);
    const size_t nq = (size_t)rc->B * rc->T * RW, no = (size_t)rc->B * rc->T * RNH * RHS;
    rc->qkv = xmalloc(sizeof(float) * nq);
    rc->dout = xmalloc(sizeof(float) * no);
    for (size_t i = 0; i < nq; i++) rc->qkv[i] = rng_normal(&rng);
    for (size_t i = 0; i < no; i++) rc->dout[i] = rng_normal(&rng);
    for (int h = 0; h < RNH; h++) rc->slopes[h] = powf(2.0f, -8.0f * (float)(h + 1) / RNH);
    if (round_be) {
        float *bufs[2] = {rc->qkv, rc->dout};
        const size_t ns[2] = {nq, no};
        for (int i = 0; i < 2; i++) {
            void *d = ring_upload(round_be, bufs[i], ns[i]);
            round_be->download_f32(round_be, bufs[i], d, ns[i]);
            round_be->release(round_be, d);
        }
    }
}

// Runs the ring: every rank's results land in rc->out, lse, dqkv. Returns the number of blocks
// sent by all ranks together in one pass of forward and backward (3 P (P - 1) when every pair
// is visible: K/V forward and backward, a dK/dV chain buffer after each visit).
static int ring_results(RingCase *rc) {
    hub_init(&rc->hub, rc->P);
    pthread_t th[HUB_MAXP];
    RingJob jobs[HUB_MAXP];
    for (int r = 0; r < rc->P; r++) {
        jobs[r] = (RingJob){rc, r};
        pthread_create(&th[r], NULL, ring_rank_main, &jobs[r]);
    }
    for (int r = 0; r < rc->P; r++) pthread_join(th[r], NULL);
    hub_destroy(&rc->hub);
    return hub_sent(&rc->hub) / 2;  // ring_rank_main's two passes
}

// One attention call over the whole sequence on be: out (B, T, NH*HS), lse transposed to
// (B, T, NH) so it compares row by row, dqkv (B, T, W), host fp32.
typedef struct {
    float *out, *lse_t, *dqkv;
} RingWhole;

static RingWhole ring_whole(const RingCase *rc, Backend *be) {
    const int T = rc->T;
    const size_t es = dtype_size(be->dtype), nq = (size_t)rc->B * T * RW, no = (size_t)rc->B * T * RNH * RHS;
    void *qkv_d = ring_upload(be, rc->qkv, nq), *dout_d = ring_upload(be, rc->dout, no);
    void *out_d = be->alloc(be, no * es), *dqkv_d = be->alloc(be, nq * es);
    float *lse_d = be->alloc(be, (size_t)rc->B * RNH * T * sizeof(float));
    float *slopes_d = be->alloc(be, sizeof rc->slopes);
    be->upload(be, slopes_d, rc->slopes, sizeof rc->slopes);
    AttnParams p = ring_fused(rc, qkv_d, out_d, lse_d, T, slopes_d, es);
    backend_attention(be, &p, 0);
    attn_fused_qkv_grads(&p, dqkv_d, dout_d, es);
    backend_attention(be, &p, 1);
    be->synchronize(be);
    RingWhole w = {ring_download(be, out_d, no), xmalloc(sizeof(float) * rc->B * T * RNH),
                   ring_download(be, dqkv_d, nq)};
    float *lse = xmalloc(sizeof(float) * rc->B * RNH * T);
    be->download(be, lse, lse_d, sizeof(float) * rc->B * RNH * T);
    for (int b = 0; b < rc->B; b++)
        for (int h = 0; h < RNH; h++)
            for (int t = 0; t < T; t++)
                w.lse_t[((size_t)b * T + t) * RNH + h] = lse[((size_t)b * RNH + h) * T + t];
    free(lse);
    void *bufs[] = {qkv_d, dout_d, out_d, dqkv_d, lse_d, slopes_d};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) be->release(be, bufs[i]);
    return w;
}

// Relative L2 of the rows of the ranks' local tensors (B, TL, w) against the whole-sequence
// tensor (B, T, w) at their global positions. lse: the ranks' (B, NH, TL) are read transposed.
static double ring_rows_err(const RingCase *rc, float *const *local, const float *whole, int w,
                            int is_lse) {
    const int P = rc->P, T = rc->T, TL = T / P;
    double num = 0, den = 0;
    for (int r = 0; r < P; r++)
        for (int b = 0; b < rc->B; b++)
            for (int t = 0; t < TL; t++)
                for (int d = 0; d < w; d++) {
                    const float a = is_lse ? local[r][((size_t)b * RNH + d) * TL + t]
                                           : local[r][((size_t)b * TL + t) * w + d];
                    const float e = whole[((size_t)b * T + ring_global_pos(r, P, TL, t)) * w + d];
                    num += ((double)a - e) * ((double)a - e);
                    den += (double)e * e;
                }
    return sqrt(num / den);
}

// Errors of the ring's out, lse and dqkv against w.
typedef struct {
    double out, lse, dqkv;
} RingErr;

static RingErr ring_err(const RingCase *rc, const RingWhole *w) {
    return (RingErr){ring_rows_err(rc, rc->out, w->out, RNH * RHS, 0),
                     ring_rows_err(rc, rc->lse, w->lse_t, RNH, 1),
                     ring_rows_err(rc, rc->dqkv, w->dqkv, RW, 0)};
}

static void ring_free(RingCase *rc, RingWhole *w, int n_whole) {
    for (int r = 0; r < rc->P; r++) {
        free(rc->out[r]);
        free(rc->lse[r]);
        free(rc->dqkv[r]);
    }
    for (int i = 0; i < n_whole; i++) {
        free(w[i].out);
        free(w[i].lse_t);
        free(w[i].dqkv);
    }
    free(rc->qkv);
    free(rc->dout);
}
