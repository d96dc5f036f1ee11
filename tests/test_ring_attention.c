// Ring attention (model/ring_attention.c) in one process: P threads, each with its own CPU
// backend, exchange blocks through an in-memory RingLink, and every rank's output, lse and
// gradients (of its zigzag tokens) are compared with one attention call over the whole sequence.
// Rings of 2, 3 and 4 ranks, chunks of 7, 5 and 3 tokens (odd), causal with and without a
// sliding window, ALiBi, GQA. The MPI path is tests/test_context_parallel.py's.
//
// Tolerance: the ring computes the same sums in another order (chunks merged through their
// log-sum-exp, dK/dV added over chunks), so the results differ by fp32 rounding: relative L2 at
// most 16 ulps of 2^-24 times sqrt(T) (T keys in the longest sum).
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/rng.h"
#include "model/backend.h"
#include "model/ring_attention.h"
#include "testlib.h"

enum { B = 2, NH = 4, NKV = 2, HS = 16, MAXP = 4, MAXQ = 8 };
#define W ((NH + 2 * NKV) * HS)  // elements per token of the fused qkv row

// The in-memory ring: a rank's start() queues its (send, recv) pair; wait() meets every rank at
// a barrier, copies the previous rank's queued sends into its own receives, and meets again so
// no send buffer changes before every copy from it is done.
typedef struct {
    pthread_barrier_t bar;
    int P;
    struct {
        const void *send;
        void *recv;
        size_t bytes;
    } q[MAXP][MAXQ];
    int n[MAXP];
} Hub;

typedef struct {
    Hub *hub;
    int rank;
} Port;

static void hub_start(void *ctx, const void *send, void *recv, size_t bytes) {
    Port *pt = ctx;
    Hub *h = pt->hub;
    CHECK(h->n[pt->rank] < MAXQ);
    h->q[pt->rank][h->n[pt->rank]].send = send;
    h->q[pt->rank][h->n[pt->rank]].recv = recv;
    h->q[pt->rank][h->n[pt->rank]++].bytes = bytes;
}

static void hub_wait(void *ctx) {
    Port *pt = ctx;
    Hub *h = pt->hub;
    const int prev = (pt->rank + h->P - 1) % h->P;
    pthread_barrier_wait(&h->bar);
    CHECK(h->n[prev] == h->n[pt->rank]);
    for (int i = 0; i < h->n[pt->rank]; i++)
        memcpy(h->q[pt->rank][i].recv, h->q[prev][i].send, h->q[pt->rank][i].bytes);
    pthread_barrier_wait(&h->bar);
    h->n[pt->rank] = 0;
}

typedef struct {
    int P, T, window, alibi;
    const float *qkv, *dout;  // whole sequence: (B, T, W), (B, T, NH * HS)
    const float *slopes;
    Hub *hub;
    // per rank results, on the local tokens: (B, TL, NH*HS), (B, NH, TL), (B, TL, W)
    float *out[MAXP], *lse[MAXP], *dqkv[MAXP];
} Ring;

typedef struct {
    Ring *ring;
    int rank;
} Job;

// The layer's attention over the fused buffer, as the model describes it.
static AttnParams fused(const Ring *r, const float *qkv, float *out, float *lse, int T) {
    AttnParams p;
    memset(&p, 0, sizeof p);
    attn_fused_qkv(&p, qkv, out, B, T, NH, NKV, HS, sizeof(float));
    p.lse = lse;
    p.causal = 1;
    p.window_left = r->window;
    p.window_right = -1;
    p.alibi_slopes = r->alibi ? r->slopes : NULL;
    p.impl = ATTN_IMPL_FLASH;
    return p;
}

static void *rank_main(void *arg) {
    Job *j = arg;
    Ring *r = j->ring;
    omp_set_num_threads(1);
    const int TL = r->T / r->P;
    Backend *be = backend_cpu_create();
    float *qkv = xmalloc(sizeof(float) * B * TL * W), *dout = xmalloc(sizeof(float) * B * TL * NH * HS);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < TL; t++) {
            const int g = ring_global_pos(j->rank, r->P, TL, t);
            memcpy(qkv + ((size_t)b * TL + t) * W, r->qkv + ((size_t)b * r->T + g) * W, sizeof(float) * W);
            memcpy(dout + ((size_t)b * TL + t) * NH * HS, r->dout + ((size_t)b * r->T + g) * NH * HS,
                   sizeof(float) * NH * HS);
        }
    Port port = {r->hub, j->rank};
    const RingLink link = {.ctx = &port, .rank = j->rank, .size = r->P, .start = hub_start, .wait = hub_wait};
    RingAttention *ra = ring_attention_create(be, &link, B, TL, NH, NKV, HS);
    AttnParams p = fused(r, qkv, r->out[j->rank], r->lse[j->rank], TL);
    ring_attention_forward(ra, &p);
    p = fused(r, qkv, r->out[j->rank], r->lse[j->rank], TL);
    attn_fused_qkv_grads(&p, r->dqkv[j->rank], dout, sizeof(float));
    ring_attention_backward(ra, &p);
    ring_attention_free(ra);
    be->destroy(be);
    free(qkv);
    free(dout);
    return NULL;
}

// Relative L2 of the rows of local tensors (B, TL, w) of every rank against the whole-sequence
// tensor (B, T, w) at their global positions.
static double rows_err(float *const *local, const float *whole, int P, int T, int w) {
    const int TL = T / P;
    double num = 0, den = 0;
    for (int r = 0; r < P; r++)
        for (int b = 0; b < B; b++)
            for (int t = 0; t < TL; t++) {
                const float *a = local[r] + ((size_t)b * TL + t) * w;
                const float *e = whole + ((size_t)b * T + ring_global_pos(r, P, TL, t)) * w;
                for (int d = 0; d < w; d++) {
                    num += ((double)a[d] - e[d]) * ((double)a[d] - e[d]);
                    den += (double)e[d] * e[d];
                }
            }
    return sqrt(num / den);
}

static void run_ring(int P, int c, int window, int alibi) {
    const int T = 2 * P * c, TL = T / P;
    Rng rng;
    rng_seed(&rng, 11 + (uint64_t)(P * 100 + c));
    float *qkv = xmalloc(sizeof(float) * B * T * W), *dout = xmalloc(sizeof(float) * B * T * NH * HS);
    for (size_t i = 0; i < (size_t)B * T * W; i++) qkv[i] = rng_normal(&rng);
    for (size_t i = 0; i < (size_t)B * T * NH * HS; i++) dout[i] = rng_normal(&rng);
    float slopes[NH];
    for (int h = 0; h < NH; h++) slopes[h] = powf(2.0f, -8.0f * (float)(h + 1) / NH);
    Hub hub;
    memset(&hub, 0, sizeof hub);
    hub.P = P;
    pthread_barrier_init(&hub.bar, NULL, (unsigned)P);
    Ring ring = {.P = P, .T = T, .window = window, .alibi = alibi, .qkv = qkv, .dout = dout,
                 .slopes = slopes, .hub = &hub};
    for (int r = 0; r < P; r++) {
        ring.out[r] = xcalloc((size_t)B * TL * NH * HS, sizeof(float));
        ring.lse[r] = xcalloc((size_t)B * NH * TL, sizeof(float));
        ring.dqkv[r] = xmalloc(sizeof(float) * B * TL * W);
        memset(ring.dqkv[r], 0xff, sizeof(float) * B * TL * W);  // NaN: gradients are OVERWRITTEN
    }
    pthread_t th[MAXP];
    Job jobs[MAXP];
    for (int r = 0; r < P; r++) {
        jobs[r] = (Job){&ring, r};
        pthread_create(&th[r], NULL, rank_main, &jobs[r]);
    }
    for (int r = 0; r < P; r++) pthread_join(th[r], NULL);

    // One call over the whole sequence.
    float *out = xmalloc(sizeof(float) * B * T * NH * HS), *lse = xmalloc(sizeof(float) * B * NH * T);
    float *dqkv = xmalloc(sizeof(float) * B * T * W);
    AttnParams p = fused(&ring, qkv, out, lse, T);
    p.dtype = DTYPE_F32;
    attn_forward_cpu(&p);
    attn_fused_qkv_grads(&p, dqkv, dout, sizeof(float));
    attn_backward_cpu(&p);
    // lse (B, NH, T) as rows (B*NH, T) of one element: compare per rank through a transposed
    // view (B, T, NH) of both.
    float *lse_t = xmalloc(sizeof(float) * B * T * NH), *lse_l[MAXP];
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) lse_t[((size_t)b * T + t) * NH + h] = lse[((size_t)b * NH + h) * T + t];
    for (int r = 0; r < P; r++) {
        lse_l[r] = xmalloc(sizeof(float) * B * TL * NH);
        for (int b = 0; b < B; b++)
            for (int h = 0; h < NH; h++)
                for (int t = 0; t < TL; t++)
                    lse_l[r][((size_t)b * TL + t) * NH + h] = ring.lse[r][((size_t)b * NH + h) * TL + t];
    }
    const double tol = 16.0 * 0x1p-24 * sqrt((double)T);
    const double e_out = rows_err(ring.out, out, P, T, NH * HS), e_lse = rows_err(lse_l, lse_t, P, T, NH);
    const double e_grad = rows_err(ring.dqkv, dqkv, P, T, W);
    EXPECT(e_out <= tol && e_lse <= tol && e_grad <= tol,
           "P=%d, chunks of %d, window %d, alibi %d: rel err out %.2g, lse %.2g, dqkv %.2g > %.2g", P, c,
           window, alibi, e_out, e_lse, e_grad, tol);
    for (int r = 0; r < P; r++) {
        free(ring.out[r]);
        free(ring.lse[r]);
        free(ring.dqkv[r]);
        free(lse_l[r]);
    }
    pthread_barrier_destroy(&hub.bar);
    free(qkv); free(dout); free(out); free(lse); free(dqkv); free(lse_t);
}

int main(void) {
    TEST_CASE("2 ranks, chunks of 7, causal", run_ring(2, 7, -1, 0));
    TEST_CASE("3 ranks, chunks of 5, causal", run_ring(3, 5, -1, 0));
    TEST_CASE("4 ranks, chunks of 3, causal", run_ring(4, 3, -1, 0));
    TEST_CASE("3 ranks, chunks of 5, window 4 (pairs skipped)", run_ring(3, 5, 4, 0));
    TEST_CASE("4 ranks, chunks of 7, window 9, alibi", run_ring(4, 7, 9, 1));
    TEST_CASE("2 ranks, chunks of 33 (tiles of 64 split), window 40", run_ring(2, 33, 40, 0));
    return TEST_SUMMARY();
}
