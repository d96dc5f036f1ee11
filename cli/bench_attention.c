// cli/bench_attention: `train_gpt bench --attention`: the attention of one layer of the config's
// model alone (forward, then backward), through the backend as the model calls it: the fused
// qkv buffer and its strides, causal, the config's window, dropout, implementation and
// deterministic mode, random inputs. TFLOP/s count 4 * B * heads * head size FLOPs per visible
// (query, key) pair forward (FlashAttention's convention: about half the square when causal) and
// 2.5 times that backward. With attention.sparse, the block-sparse call and the dense one on
// the same inputs, their times and TFLOP/s over each one's own visible pairs, the sparse call's
// dense-equivalent TFLOP/s (the dense pairs over its time) and the blocks' density; without the
// dense call (dense 0: at a million tokens it alone takes seconds per pass), the sparse line
// alone, its dense-equivalent TFLOP/s still counted from the dense pairs. With
// dist.context_parallel > 1, also the ring's work for the same sequence split over that many
// ranks (bench_ring).
#include "cli/cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/rng.h"
#include "common/timer.h"
#include "model/ring_attention.h"
#include "model/sparse_lists.h"

// Visible (query, key) pairs of one causal head of T tokens whose keys reach at most `window`
// back (-1: unbounded).
static double visible_pairs(int T, int window) {
    double n = 0;
    for (int i = 0; i < T; i++) n += (window < 0 || window > i ? i : window) + 1;
    return n;
}

// Visible (query, key) pairs of one causal head of T tokens under block mask m and `window`:
// per present block, its rows' causal, windowed key runs clipped to the block.
static double sparse_pairs(const AttnBlockMask *m, int T, int window) {
    double n = 0;
    for (int qb = 0; qb < m->n_qb; qb++)
        for (int e = m->q_offsets[qb]; e < m->q_offsets[qb + 1]; e++) {
            const int k0 = m->q_blocks[e] * ATTN_SPARSE_BLOCK, k1 = k0 + ATTN_SPARSE_BLOCK - 1;
            for (int i = qb * ATTN_SPARSE_BLOCK; i < (qb + 1) * ATTN_SPARSE_BLOCK && i < T; i++) {
                const int lo = window >= 0 && i - window > k0 ? i - window : k0, hi = i < k1 ? i : k1;
                if (hi >= lo) n += hi - lo + 1;
            }
        }
    return n;
}

// n values of N(0, 1) in a new backend buffer of the compute dtype: the first RANDOM_BLOCK of them
// drawn, and repeated beyond it. The attention's time does not depend on the values, and at a
// million tokens drawing every one would cost about a minute of host time and 12 GB of host memory.
enum { RANDOM_BLOCK = 1 << 22 };
static void *random_buffer(Backend *be, Rng *r, size_t n) {
    const size_t m = n < RANDOM_BLOCK ? n : RANDOM_BLOCK, ds = dtype_size(be->dtype);
    float *host = xmalloc(m * sizeof(float));  // (m)
    for (size_t i = 0; i < m; i++) host[i] = rng_normal(r);
    void *d = be->alloc(be, n * ds);
    for (size_t off = 0; off < n; off += m)
        be->upload_f32(be, (char *)d + off * ds, host, n - off < m ? n - off : m);
    free(host);
    return d;
}

// Mean seconds of `steps` calls of the forward (backward = 0) or the backward.
static double time_calls(Backend *be, AttnParams *p, int backward, long steps) {
    be->synchronize(be);
    const double t0 = now_seconds();
    for (long s = 0; s < steps; s++) {
        backend_attention(be, p, backward);
    }
    be->synchronize(be);
    return (now_seconds() - t0) / (double)steps;
}

// One layer's attention problem of B x T tokens as the model describes it, on random inputs.
typedef struct {
    AttnParams p;
    void *bufs[5];  // qkv, dout, out, dqkv, lse
} BenchProblem;

static BenchProblem bench_problem(const Config *c, Backend *be, Rng *r, int B, int T) {
    const int NH = c->model.n_head, NKV = c->model.n_kv_head ? c->model.n_kv_head : NH;
    const int HS = c->model.n_embd / NH, C = NH * HS, OCq = (NH + 2 * NKV) * HS;
    const size_t N = (size_t)B * T, ds = dtype_size(be->dtype);
    BenchProblem b;
    void *qkv = random_buffer(be, r, N * OCq), *dout = random_buffer(be, r, N * C);
    void *out = be->alloc(be, N * C * ds), *dqkv = be->alloc(be, N * OCq * ds);
    float *lse = be->alloc(be, N * NH * sizeof(float));
    memset(&b.p, 0, sizeof b.p);
    attn_fused_qkv(&b.p, qkv, out, B, T, NH, NKV, HS, ds);
    attn_fused_qkv_grads(&b.p, dqkv, dout, ds);
    b.p.lse = lse;
    b.p.causal = 1;
    b.p.window_left = c->attention.window;
    b.p.window_right = -1;
    b.p.dropout_p = c->attention.dropout;
    b.p.seed = (uint64_t)c->train.seed;
    b.p.impl = (AttnImpl)c->attention.impl;
    b.p.deterministic = c->attention.deterministic;
    void *bufs[5] = {qkv, dout, out, dqkv, lse};
    memcpy(b.bufs, bufs, sizeof bufs);
    return b;
}

static void bench_problem_free(Backend *be, BenchProblem *b) {
    for (int i = 0; i < 5; i++) be->release(be, b->bufs[i]);
}

// The ring's link for timing one rank alone: nothing moves (the attention's time does not depend
// on the values, and which chunk pairs run depends on positions alone).
static int idle_start(void *ctx, const void *send, size_t send_bytes, int dst, void *recv,
                      size_t recv_bytes, int src) {
    return 0;
}
static void idle_wait(void *ctx, int handle) {}

// The ring's breakdown: per phase (model/ring_attention.h) the device milliseconds of one
// forward and one backward of every rank, summed over the ranks, beside the unsplit call's.
static void print_ring_times(const RingTimes *t, long steps, double fwd, double bwd) {
    double sum[2] = {0, 0};
    printf("bench attention: the ring's device time by phase, ms per forward / backward, all ranks "
           "summed (their ops in brackets):\n");
    for (int ph = 0; ph < RING_N_PHASES; ph++) {
        printf("  %-8s", RING_PHASE_NAMES[ph]);
        for (int d = 0; d < 2; d++) {
            printf(" %10.3f (%5.1f)", t->ms[d][ph] / steps, (double)t->ops[d][ph] / steps);
            sum[d] += t->ms[d][ph] / steps;
        }
        printf("\n");
    }
    printf("  %-8s %10.3f         %10.3f         = %.3f ms\n", "total", sum[0], sum[1], sum[0] + sum[1]);
    printf("  %-8s %10.3f         %10.3f         = %.3f ms; ring kernels %.3fx, all %.3fx\n", "unsplit",
           fwd * 1e3, bwd * 1e3, (fwd + bwd) * 1e3,
           (t->ms[0][RING_KERNEL] + t->ms[1][RING_KERNEL]) / steps / ((fwd + bwd) * 1e3),
           (sum[0] + sum[1]) / ((fwd + bwd) * 1e3));
}

// dist.context_parallel = CP: the ring's work for one sequence (forward and backward of every
// rank, each rank's chunk-pair kernels, merges and fp32 stores, no transfers), the ranks one after
// the other on this device, summed, beside the unsplit call's fwd + bwd seconds; and the device
// memory one rank's attention needs (its inputs, outputs, gradients and ring buffers). Then the
// same steps again with a mark after every op: the breakdown by phase.
static void bench_ring(const Config *c, Backend *be, Rng *r, long steps, double fwd, double bwd,
                       int print) {
    const int CP = c->dist.context_parallel, B = c->train.batch_size, TL = c->train.seq_len / CP;
    const int NH = c->model.n_head, NKV = c->model.n_kv_head ? c->model.n_kv_head : NH;
    const double whole = fwd + bwd;
    double sum = 0, peak_mib = 0;
    RingTimes times;
    memset(&times, 0, sizeof times);
    for (int rank = 0; rank < CP; rank++) {
        size_t free0, used0, free1, used1;
        be->synchronize(be);
        const int have_mem = be->memory(be, &free0, &used0);
        BenchProblem b = bench_problem(c, be, r, B, TL);
        const RingLink link = {.ctx = NULL, .rank = rank, .size = CP, .start = idle_start,
                               .wait = idle_wait};
        RingAttention *ra = ring_attention_create(be, &link, B, TL, NH, NKV, c->model.n_embd / NH);
        ring_attention_forward(ra, &b.p);  // warm-up (and the attention workspace)
        ring_attention_backward(ra, &b.p);
        be->synchronize(be);
        if (have_mem && be->memory(be, &free1, &used1) && used1 > used0) {
            const double mib = (double)(used1 - used0) / (1 << 20);
            if (mib > peak_mib) peak_mib = mib;
        }
        const double t0 = now_seconds();
        for (long s = 0; s < steps; s++) {
            ring_attention_forward(ra, &b.p);
            ring_attention_backward(ra, &b.p);
        }
        be->synchronize(be);
        sum += (now_seconds() - t0) / (double)steps;
        ring_attention_time(ra, &times);
        for (long s = 0; s < steps; s++) {
            ring_attention_forward(ra, &b.p);
            ring_attention_backward(ra, &b.p);
        }
        ring_attention_free(ra);
        bench_problem_free(be, &b);
    }
    if (print) {
        printf("bench attention: context parallelism %d: the ring's work of its %d ranks (%d tokens "
               "each), summed: forward + backward %.3f ms, %.3fx the unsplit %.3f ms",
               CP, CP, TL, sum * 1e3, sum / whole, whole * 1e3);
        if (peak_mib > 0) printf("; device memory of one rank's attention %.0f MiB", peak_mib);
        printf("\n");
        print_ring_times(&times, steps, fwd, bwd);
    }
}

// Sparse layers: the pattern's lists on p, the same call timed again, and one more line (the
// speed-ups against dense only where dense_fwd > 0, that is where dense was timed).
static void bench_sparse(const Config *c, Backend *be, AttnParams *p, long steps, double dense_fwd,
                         double dense_bwd, double dense_flops, int print) {
    const int B = c->train.batch_size, T = c->train.seq_len, HS = c->model.n_embd / c->model.n_head;
    SparseLists *s = sparse_lists_create(be, c);
    sparse_lists_apply(s, p, 0);
    backend_attention(be, p, 0);  // warm-up
    backend_attention(be, p, 1);
    const double fwd = time_calls(be, p, 0, steps), bwd = time_calls(be, p, 1, steps);
    const AttnSparseSpec spec = sparse_lists_spec(c);
    AttnBlockMask m;
    char err[256];
    if (attn_block_mask_build(&m, &spec, T, T, 1, err, sizeof err) != 0) fatal(EXIT_USAGE, "%s", err);
    const double flops = 4.0 * B * c->model.n_head * HS * sparse_pairs(&m, T, c->attention.window);
    if (print) {
        char fwd_x[32] = "", bwd_x[32] = "";
        if (dense_fwd > 0) {
            snprintf(fwd_x, sizeof fwd_x, ", %.2fx dense", dense_fwd / fwd);
            snprintf(bwd_x, sizeof bwd_x, ", %.2fx dense", dense_bwd / bwd);
        }
        printf("bench attention: sparse %s (%.4f of the blocks, %d present), batch %d x seq %d: forward %.3f ms "
               "(%.3g TFLOP/s, %.3g dense-equivalent%s), backward %.3f ms (%.3g TFLOP/s, %.3g dense-equivalent%s)\n",
               config_choice_name("attention.sparse", c->attention.sparse), attn_block_mask_density(&m), m.nnz, B,
               T, fwd * 1e3, flops / fwd / 1e12, dense_flops / fwd / 1e12, fwd_x, bwd * 1e3,
               2.5 * flops / bwd / 1e12, 2.5 * dense_flops / bwd / 1e12, bwd_x);
    }
    attn_block_mask_free(&m);
    sparse_lists_free(s);
}

void cli_bench_attention(const Config *c, Backend *be, long steps, int dense, int print) {
    const int B = c->train.batch_size, T = c->train.seq_len, NH = c->model.n_head;
    const int NKV = c->model.n_kv_head ? c->model.n_kv_head : NH, HS = c->model.n_embd / NH;
    Rng r;
    rng_seed(&r, (uint64_t)c->train.seed);
    BenchProblem b = bench_problem(c, be, &r, B, T);
    AttnParams *p = &b.p;
    const double flops = 4.0 * B * NH * HS * visible_pairs(T, c->attention.window);
    double fwd = 0, bwd = 0;
    if (dense) {
        backend_attention(be, p, 0);   // warm-up (and the workspace)
        backend_attention(be, p, 1);
        fwd = time_calls(be, p, 0, steps);
        bwd = time_calls(be, p, 1, steps);
    }
    if (print && dense) {
        printf("bench attention: %s backend (%s), %s, batch %d x seq %d, %d heads (%d kv) of %d, "
               "causal", be->name, dtype_name(be->dtype),
               config_choice_name("attention.impl", c->attention.impl), B, T, NH, NKV, HS);
        if (c->attention.window >= 0) printf(", window %d", c->attention.window);
        if (c->attention.dropout > 0) printf(", dropout %g", c->attention.dropout);
        printf(": %sforward %.3f ms (%.3g TFLOP/s), backward %.3f ms (%.3g TFLOP/s)\n",
               c->attention.sparse ? "dense " : "", fwd * 1e3, flops / fwd / 1e12, bwd * 1e3,
               2.5 * flops / bwd / 1e12);
    }
    if (c->attention.sparse) bench_sparse(c, be, p, steps, fwd, bwd, flops, print);
    bench_problem_free(be, &b);
    if (c->dist.context_parallel > 1) bench_ring(c, be, &r, steps, fwd, bwd, print);
}
