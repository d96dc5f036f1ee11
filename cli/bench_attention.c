// cli/bench_attention: `train_gpt bench --attention`: the attention of one layer of the config's
// model alone (forward, then backward), through the backend as the model calls it: the fused
// qkv buffer and its strides, causal, the config's window, dropout, implementation and
// deterministic mode, random inputs. TFLOP/s count 4 * B * heads * head size FLOPs per visible
// (query, key) pair forward (FlashAttention's convention: about half the square when causal) and
// 2.5 times that backward.
#include "cli/cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/rng.h"
#include "common/timer.h"

// Visible (query, key) pairs of one causal head of T tokens whose keys reach at most `window`
// back (-1: unbounded).
static double visible_pairs(int T, int window) {
    double n = 0;
    for (int i = 0; i < T; i++) n += (window < 0 || window > i ? i : window) + 1;
    return n;
}

// n values of N(0, 1) uploaded into a new backend buffer of the compute dtype.
static void *random_buffer(Backend *be, Rng *r, size_t n) {
    float *host = xmalloc(n * sizeof(float));  // (n)
    for (size_t i = 0; i < n; i++) host[i] = rng_normal(r);
    void *d = be->alloc(be, n * dtype_size(be->dtype));
    be->upload_f32(be, d, host, n);
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

void cli_bench_attention(const Config *c, Backend *be, long steps, int print) {
    const int B = c->train.batch_size, T = c->train.seq_len, NH = c->model.n_head;
    const int NKV = c->model.n_kv_head ? c->model.n_kv_head : NH, HS = c->model.n_embd / NH;
    const int C = NH * HS, OCq = (NH + 2 * NKV) * HS;
    const size_t N = (size_t)B * T, ds = dtype_size(be->dtype);
    Rng r;
    rng_seed(&r, (uint64_t)c->train.seed);
    void *qkv = random_buffer(be, &r, N * OCq), *dout = random_buffer(be, &r, N * C);
    void *out = be->alloc(be, N * C * ds), *dqkv = be->alloc(be, N * OCq * ds);
    float *lse = be->alloc(be, N * NH * sizeof(float));

    AttnParams p;
    memset(&p, 0, sizeof p);
    attn_fused_qkv(&p, qkv, out, B, T, NH, NKV, HS, ds);
    attn_fused_qkv_grads(&p, dqkv, dout, ds);
    p.lse = lse;
    p.causal = 1;
    p.window_left = c->attention.window;
    p.window_right = -1;
    p.dropout_p = c->attention.dropout;
    p.seed = (uint64_t)c->train.seed;
    p.impl = (AttnImpl)c->attention.impl;
    p.deterministic = c->attention.deterministic;

    backend_attention(be, &p, 0);   // warm-up (and the workspace)
    backend_attention(be, &p, 1);
    const double fwd = time_calls(be, &p, 0, steps), bwd = time_calls(be, &p, 1, steps);
    const double flops = 4.0 * B * NH * HS * visible_pairs(T, c->attention.window);
    if (print) {
        printf("bench attention: %s backend (%s), %s, batch %d x seq %d, %d heads (%d kv) of %d, "
               "causal", be->name, dtype_name(be->dtype),
               config_choice_name("attention.impl", c->attention.impl), B, T, NH, NKV, HS);
        if (c->attention.window >= 0) printf(", window %d", c->attention.window);
        if (c->attention.dropout > 0) printf(", dropout %g", c->attention.dropout);
        printf(": forward %.3f ms (%.3g TFLOP/s), backward %.3f ms (%.3g TFLOP/s)\n", fwd * 1e3,
               flops / fwd / 1e12, bwd * 1e3, 2.5 * flops / bwd / 1e12);
    }
    void *bufs[] = {qkv, dout, out, dqkv, lse};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->release(be, bufs[i]);
}
