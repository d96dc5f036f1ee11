// GPU block-sparse attention: attn_forward / attn_backward with a block mask on a CUDA context
// (the family attn_select_kernel picks, and a context of kernel sm80), for every pattern, odd
// lengths (ragged last blocks), causal and not, GQA, windows, head sizes 32, 64, 96, 128 and
// 256, against
//   - the CPU reference with the same block mask (fp32, on the same bf16-rounded inputs), which
//     tests/test_attention_sparse.c checks against float64 with the explicit mask;
//   - the dense kernels: a mask holding every block gives bitwise the dense forward, and with
//     the deterministic backward the dense gradients within a few bf16 roundings;
//   - key blocks that no list reads filled with NaN: they must never be loaded.
//
// Tolerance: the sparse kernels do the dense kernels' arithmetic on fewer tiles, so their error
// against the fp32 CPU reference must stay within 2x the dense kernels' error on the same
// inputs against the dense CPU reference (tests/gpu/test_attention_gpu.c bounds that one by
// float64), plus 1e-4 for fp32 accumulation-order noise.
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention/attention.h"
#include "common/rng.h"
#include "tests/attn_contiguous.h"
#include "tests/testlib.h"
#include "tests/gpu/cuda_ok.h"

#define NOISE 1e-4

// bf16 <-> fp32 (round to nearest even; NaN stays NaN).
static uint16_t to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if (isnan(f)) return 0x7FC0;
    return (uint16_t)((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}
static float from_bf16(uint16_t h) {
    const uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

typedef struct {
    const char *name;
    int B, T_q, T_k, NH, NKV, HS, causal, window;
    AttnSparseSpec spec;  // pattern none: every block (the full-mask comparison)
} Case;

// One problem's tensors, contiguous (B, T, heads, HS): host fp32 (bf16-rounded) and device bf16.
typedef struct {
    size_t nq, nk, nl;
    float *q, *k, *v, *dout;                       // host inputs
    float *out, *lse, *dq, *dk, *dv;               // host results (a CPU or a GPU run)
    void *d_q, *d_k, *d_v, *d_dout, *d_out, *d_dq, *d_dk, *d_dv;
    float *d_lse;
    int *d_lists[4];
    AttnBlockMask m;
} Problem;

static void *dev_upload_bf16(const float *x, size_t n) {
    uint16_t *h = malloc(2 * n);
    for (size_t i = 0; i < n; i++) h[i] = to_bf16(x[i]);
    void *d;
    CUDA_OK(cudaMalloc(&d, 2 * n));
    CUDA_OK(cudaMemcpy(d, h, 2 * n, cudaMemcpyHostToDevice));
    free(h);
    return d;
}
static void dev_download_bf16(float *x, const void *d, size_t n) {
    uint16_t *h = malloc(2 * n);
    CUDA_OK(cudaMemcpy(h, d, 2 * n, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) x[i] = from_bf16(h[i]);
    free(h);
}

static void fill_rounded(Rng *r, float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = from_bf16(to_bf16(rng_normal(r)));
}

// The full mask (pattern none) or the case's pattern, on host and device.
static void build_mask(Problem *pb, const Case *c) {
    char err[256];
    if (c->spec.pattern == ATTN_SPARSE_NONE) {
        const int n_qb = (c->T_q + ATTN_SPARSE_BLOCK - 1) / ATTN_SPARSE_BLOCK;
        const int n_kb = (c->T_k + ATTN_SPARSE_BLOCK - 1) / ATTN_SPARSE_BLOCK;
        int *off = malloc(sizeof(int) * (n_qb + 1)), *blocks = malloc(sizeof(int) * n_qb * n_kb);
        for (int qb = 0; qb <= n_qb; qb++) off[qb] = qb * n_kb;
        for (int e = 0; e < n_qb * n_kb; e++) blocks[e] = e % n_kb;
        EXPECT(attn_block_mask_from_lists(&pb->m, c->T_q, c->T_k, off, blocks, err, sizeof err) == 0, "%s", err);
        free(off);
        free(blocks);
    } else {
        EXPECT(attn_block_mask_build(&pb->m, &c->spec, c->T_q, c->T_k, c->causal, err, sizeof err) == 0, "%s", err);
    }
    const int *host[4] = {pb->m.q_offsets, pb->m.q_blocks, pb->m.k_offsets, pb->m.k_blocks};
    const size_t n[4] = {(size_t)pb->m.n_qb + 1, (size_t)pb->m.nnz, (size_t)pb->m.n_kb + 1, (size_t)pb->m.nnz};
    for (int i = 0; i < 4; i++) {
        CUDA_OK(cudaMalloc((void **)&pb->d_lists[i], sizeof(int) * (n[i] ? n[i] : 1)));
        CUDA_OK(cudaMemcpy(pb->d_lists[i], host[i], sizeof(int) * n[i], cudaMemcpyHostToDevice));
    }
}

static void problem_make(Problem *pb, const Case *c, Rng *r) {
    memset(pb, 0, sizeof *pb);
    pb->nq = (size_t)c->B * c->T_q * c->NH * c->HS;
    pb->nk = (size_t)c->B * c->T_k * c->NKV * c->HS;
    pb->nl = (size_t)c->B * c->NH * c->T_q;
    float **hq[] = {&pb->q, &pb->dout, &pb->out, &pb->dq}, **hk[] = {&pb->k, &pb->v, &pb->dk, &pb->dv};
    for (int i = 0; i < 4; i++) {
        *hq[i] = malloc(sizeof(float) * pb->nq);
        *hk[i] = malloc(sizeof(float) * pb->nk);
    }
    pb->lse = malloc(sizeof(float) * pb->nl);
    fill_rounded(r, pb->q, pb->nq); fill_rounded(r, pb->k, pb->nk);
    fill_rounded(r, pb->v, pb->nk); fill_rounded(r, pb->dout, pb->nq);
    void **dq_[] = {&pb->d_out, &pb->d_dq}, **dk_[] = {&pb->d_dk, &pb->d_dv};
    for (int i = 0; i < 2; i++) {
        CUDA_OK(cudaMalloc(dq_[i], 2 * pb->nq));
        CUDA_OK(cudaMalloc(dk_[i], 2 * pb->nk));
    }
    CUDA_OK(cudaMalloc((void **)&pb->d_lse, sizeof(float) * pb->nl));
    build_mask(pb, c);
}

static void upload_inputs(Problem *pb) {
    void **d[] = {&pb->d_q, &pb->d_k, &pb->d_v, &pb->d_dout};
    const float *h[] = {pb->q, pb->k, pb->v, pb->dout};
    const size_t n[] = {pb->nq, pb->nk, pb->nk, pb->nq};
    for (int i = 0; i < 4; i++) {
        if (*d[i]) CUDA_OK(cudaFree(*d[i]));
        *d[i] = dev_upload_bf16(h[i], n[i]);
    }
}

static void problem_free(Problem *pb) {
    float *h[] = {pb->q, pb->k, pb->v, pb->dout, pb->out, pb->lse, pb->dq, pb->dk, pb->dv};
    for (int i = 0; i < 9; i++) free(h[i]);
    void *d[] = {pb->d_q, pb->d_k, pb->d_v, pb->d_dout, pb->d_out, pb->d_dq, pb->d_dk, pb->d_dv, pb->d_lse,
                 pb->d_lists[0], pb->d_lists[1], pb->d_lists[2], pb->d_lists[3]};
    for (int i = 0; i < 13; i++) cudaFree(d[i]);
    attn_block_mask_free(&pb->m);
}

// Params of the case on the host (fp32) or device (bf16) tensors, with or without the lists.
static AttnParams params(const Problem *pb, const Case *c, Device dev, int sparse, int deterministic) {
    const int gpu = dev == DEVICE_CUDA;
    const AttnTensors host = {pb->q, pb->k, pb->v, pb->dout, pb->out, pb->dq, pb->dk, pb->dv, pb->lse};
    const AttnTensors devt = {pb->d_q, pb->d_k, pb->d_v, pb->d_dout, pb->d_out, pb->d_dq, pb->d_dk, pb->d_dv,
                              pb->d_lse};
    const AttnShape s = {c->B, c->T_q, c->T_k, c->NH, c->NKV, c->HS, c->causal, c->window};
    AttnParams p = attn_contiguous(gpu ? &devt : &host, &s);
    p.dtype = gpu ? DTYPE_BF16 : DTYPE_F32;
    p.impl = ATTN_IMPL_FLASH;
    p.deterministic = deterministic;
    if (sparse && gpu) {
        p.sparse_q_offsets = pb->d_lists[0]; p.sparse_q_blocks = pb->d_lists[1];
        p.sparse_k_offsets = pb->d_lists[2]; p.sparse_k_blocks = pb->d_lists[3];
    } else if (sparse) {
        attn_set_block_mask(&p, &pb->m);
    }
    return p;
}

// All five results of one run, host fp32.
typedef struct {
    float *out, *lse, *dq, *dk, *dv;
} Result;

static Result result_take(Problem *pb) {
    Result r = {pb->out, pb->lse, pb->dq, pb->dk, pb->dv};
    pb->out = malloc(sizeof(float) * pb->nq); pb->lse = malloc(sizeof(float) * pb->nl);
    pb->dq = malloc(sizeof(float) * pb->nq); pb->dk = malloc(sizeof(float) * pb->nk);
    pb->dv = malloc(sizeof(float) * pb->nk);
    return r;
}
static void result_free(Result *r) { free(r->out); free(r->lse); free(r->dq); free(r->dk); free(r->dv); }

static Result run_cpu(Problem *pb, const Case *c, int sparse) {
    AttnParams p = params(pb, c, DEVICE_CPU, sparse, 0);
    char err[256];
    EXPECT(attn_check(&p, DEVICE_CPU, 1, err, sizeof err) == 0, "%s: cpu: %s", c->name, err);
    attn_forward_cpu(&p);
    attn_backward_cpu(&p);
    return result_take(pb);
}

static Result run_gpu(AttnContext *ctx, Problem *pb, const Case *c, int sparse, int deterministic) {
    AttnParams p = params(pb, c, DEVICE_CUDA, sparse, deterministic);
    char err[256] = "";
    EXPECT(attn_forward(ctx, &p, err, sizeof err) == 0 && attn_backward(ctx, &p, err, sizeof err) == 0,
           "%s: gpu: %s", c->name, err);
    CUDA_OK(cudaDeviceSynchronize());
    dev_download_bf16(pb->out, pb->d_out, pb->nq);
    CUDA_OK(cudaMemcpy(pb->lse, pb->d_lse, sizeof(float) * pb->nl, cudaMemcpyDeviceToHost));
    dev_download_bf16(pb->dq, pb->d_dq, pb->nq);
    dev_download_bf16(pb->dk, pb->d_dk, pb->nk);
    dev_download_bf16(pb->dv, pb->d_dv, pb->nk);
    return result_take(pb);
}

// rms relative error; matching infinities (lse of fully masked rows) count as equal.
static double rel(const float *a, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (isinf(ref[i]) && a[i] == ref[i]) continue;
        if (!isfinite(a[i])) return INFINITY;
        num += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]);
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

typedef struct {
    double e[5];
} Errs;
static Errs errs(const Result *a, const Result *ref, const Problem *pb) {
    return (Errs){{rel(a->out, ref->out, pb->nq), rel(a->lse, ref->lse, pb->nl), rel(a->dq, ref->dq, pb->nq),
                   rel(a->dk, ref->dk, pb->nk), rel(a->dv, ref->dv, pb->nk)}};
}

static const char *WHAT[5] = {"out", "lse", "dq", "dk", "dv"};

// Sparse GPU vs the sparse CPU reference, within 2x the dense GPU's error vs the dense CPU.
static void check_pattern(AttnContext *ctx, const Case *c, Rng *r) {
    Problem pb;
    problem_make(&pb, c, r);
    upload_inputs(&pb);
    Result cpu_s = run_cpu(&pb, c, 1), cpu_d = run_cpu(&pb, c, 0);
    Result gpu_s = run_gpu(ctx, &pb, c, 1, 0), gpu_d = run_gpu(ctx, &pb, c, 0, 0);
    const Errs es = errs(&gpu_s, &cpu_s, &pb), ed = errs(&gpu_d, &cpu_d, &pb);
    for (int i = 0; i < 5; i++)
        EXPECT(es.e[i] <= 2 * ed.e[i] + NOISE, "%s: sparse %s error %.3g > 2 x dense %.3g + 1e-4 (density %.2f)",
               c->name, WHAT[i], es.e[i], ed.e[i], attn_block_mask_density(&pb.m));
    if (getenv("ATTN_TEST_VERBOSE"))
        printf("  %s density %.2f: out %.2e/%.2e dq %.2e/%.2e dk %.2e/%.2e dv %.2e/%.2e\n", c->name,
               attn_block_mask_density(&pb.m), es.e[0], ed.e[0], es.e[2], ed.e[2], es.e[3], ed.e[3], es.e[4], ed.e[4]);
    result_free(&cpu_s); result_free(&cpu_d); result_free(&gpu_s); result_free(&gpu_d);
    problem_free(&pb);
}

// max |a - b| over n values, relative to max |b|.
static double rel_diff(const float *a, const float *b, size_t n) {
    double d = 0, m = 0;
    for (size_t i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - b[i])), m = fmax(m, fabs((double)b[i]));
    return m > 0 ? d / m : d;
}

// Every block present: the same tiles in the same order as dense, so bitwise the same forward.
// (The cases keep to shapes where dense runs the feature instances' tiles: head sizes in HS 128's
// tiles. At HS 32 and 64 the sm90 forward's plain instances run three warpgroups (full rows, and
// causal rows from 4K queries) or two blocks per SM (shorter causal rows), which a block mask
// does not.)
// The deterministic backward of a mask runs the kernels' feature instances, compiled apart from
// the plain ones (their multiply-adds may contract differently), so its gradients equal dense
// within a few bf16 roundings (2^-8 each) of the largest gradient, not bitwise.
static void check_full_mask(AttnContext *ctx, const Case *c, Rng *r) {
    Problem pb;
    problem_make(&pb, c, r);
    upload_inputs(&pb);
    const double tol = 4.0 / 256;
    for (int det = 0; det < 2; det++) {
        Result s = run_gpu(ctx, &pb, c, 1, det), d = run_gpu(ctx, &pb, c, 0, det);
        EXPECT(memcmp(s.out, d.out, sizeof(float) * pb.nq) == 0 && memcmp(s.lse, d.lse, sizeof(float) * pb.nl) == 0,
               "%s (deterministic %d): full-mask forward differs from dense", c->name, det);
        if (det) {
            const double e = fmax(rel_diff(s.dq, d.dq, pb.nq), fmax(rel_diff(s.dk, d.dk, pb.nk), rel_diff(s.dv, d.dv, pb.nk)));
            EXPECT(e <= tol, "%s: full-mask deterministic gradients differ from dense by %.3g of the largest (tolerance %.3g)",
                   c->name, e, tol);
        }
        result_free(&s);
        result_free(&d);
    }
    problem_free(&pb);
}

// Key block 1 is in no list (query block qb reads key block qb, but query block 1 reads key
// block 0): NaN in its K and V must not reach any output, and its dK and dV are 0.
static void check_unread(AttnContext *ctx, const Case *c, Rng *r) {
    Problem pb;
    problem_make(&pb, c, r);
    const int n_qb = pb.m.n_qb;
    int *off = malloc(sizeof(int) * (n_qb + 1)), *blocks = malloc(sizeof(int) * n_qb);
    for (int qb = 0; qb <= n_qb; qb++) off[qb] = qb;
    for (int qb = 0; qb < n_qb; qb++) blocks[qb] = qb == 1 ? 0 : qb;  // query block 1 reads block 0
    for (int i = 0; i < 4; i++) cudaFree(pb.d_lists[i]);
    attn_block_mask_free(&pb.m);
    char err[256];
    EXPECT(attn_block_mask_from_lists(&pb.m, c->T_q, c->T_k, off, blocks, err, sizeof err) == 0, "%s", err);
    const int *host[4] = {pb.m.q_offsets, pb.m.q_blocks, pb.m.k_offsets, pb.m.k_blocks};
    const size_t n[4] = {(size_t)n_qb + 1, (size_t)pb.m.nnz, (size_t)pb.m.n_kb + 1, (size_t)pb.m.nnz};
    for (int i = 0; i < 4; i++) {
        CUDA_OK(cudaMalloc((void **)&pb.d_lists[i], sizeof(int) * n[i]));
        CUDA_OK(cudaMemcpy(pb.d_lists[i], host[i], sizeof(int) * n[i], cudaMemcpyHostToDevice));
    }
    upload_inputs(&pb);
    Result ref = run_cpu(&pb, c, 1);
    const size_t row = (size_t)c->NKV * c->HS;
    for (size_t i = ATTN_SPARSE_BLOCK * row; i < 2 * ATTN_SPARSE_BLOCK * row; i++) pb.k[i] = pb.v[i] = NAN;
    upload_inputs(&pb);
    Result g = run_gpu(ctx, &pb, c, 1, 0);
    int finite = 1, zero = 1;
    for (size_t i = 0; i < pb.nq; i++) finite &= isfinite(g.out[i]) && isfinite(g.dq[i]);
    for (size_t i = 0; i < pb.nk; i++) finite &= isfinite(g.dk[i]) && isfinite(g.dv[i]);
    for (size_t i = ATTN_SPARSE_BLOCK * row; i < 2 * ATTN_SPARSE_BLOCK * row; i++) zero &= g.dk[i] == 0 && g.dv[i] == 0;
    EXPECT(finite, "%s: a NaN of an unread key block reached the outputs", c->name);
    EXPECT(zero, "%s: dK, dV of an unread key block are not 0", c->name);
    // Bounded by bf16 output rounding (2^-9 per element) and the kernels' fp32 sums: loose 2e-2.
    EXPECT(rel(g.out, ref.out, pb.nq) < 2e-2, "%s: out vs cpu %.3g", c->name, rel(g.out, ref.out, pb.nq));
    result_free(&ref);
    result_free(&g);
    free(off);
    free(blocks);
    problem_free(&pb);
}

static AttnSparseSpec sp(AttnSparsePattern pat, int band, int global, int stride, int random) {
    return (AttnSparseSpec){pat, band, global, stride, random, 7};
}

int main(void) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("no CUDA device: the GPU tests need one\n0 passed, 1 failed\n");
        return 1;
    }
    Rng rng;
    rng_seed(&rng, 2024);
    const AttnSparseSpec LG = sp(ATTN_SPARSE_LOCAL_GLOBAL, 2, 1, 0, 0), ST = sp(ATTN_SPARSE_STRIDED, 1, 0, 3, 0),
                         BB = sp(ATTN_SPARSE_BIGBIRD, 2, 1, 0, 2), FULL = sp(ATTN_SPARSE_NONE, 0, 0, 0, 0);
    // name, B, T_q, T_k, NH, NKV, HS, causal, window, pattern
    const Case patterns[] = {
        {"local_global hs64 causal T=1000", 1, 1000, 1000, 4, 2, 64, 1, -1, LG},
        {"local_global hs128 T=777", 2, 777, 777, 2, 2, 128, 0, -1, LG},
        {"strided hs64 causal T=1537 GQA", 1, 1537, 1537, 4, 1, 64, 1, -1, ST},
        {"strided hs128 causal T=1025", 1, 1025, 1025, 2, 2, 128, 1, -1, ST},
        {"bigbird hs64 causal T=2049", 1, 2049, 2049, 2, 1, 64, 1, -1, BB},
        {"bigbird hs128 T=901 window 300", 1, 901, 901, 2, 2, 128, 0, 300, BB},
        {"bigbird hs64 causal T_q=300 T_k=1100", 2, 300, 1100, 2, 2, 64, 1, -1, BB},
        {"local_global hs64 causal T=4500 (sm90 3-wg length)", 1, 4500, 4500, 2, 2, 64, 1, -1, LG},
        {"local_global hs32 causal T=900 GQA", 1, 900, 900, 4, 2, 32, 1, -1, LG},
        {"strided hs96 T=650", 1, 650, 650, 2, 2, 96, 0, -1, ST},
        {"bigbird hs256 causal T=700 (64-key backward tiles)", 1, 700, 700, 2, 1, 256, 1, -1, BB},
    };
    const Case full[] = {
        {"full mask hs96 T=1000 GQA", 1, 1000, 1000, 2, 1, 96, 0, -1, FULL},
        {"full mask hs128 causal T=333", 2, 333, 333, 2, 2, 128, 1, -1, FULL},
    };
    const Case unread = {"unread block hs64 T=700", 1, 700, 700, 2, 1, 64, 0, -1, sp(ATTN_SPARSE_LOCAL_GLOBAL, 1, 0, 0, 0)};
    const AttnKernel kernels[2] = {ATTN_KERNEL_AUTO, ATTN_KERNEL_SM80};
    const char *fam[2] = {"auto", "sm80"};
    for (int f = 0; f < 2; f++) {
        char err[256], name[256];
        AttnContext *ctx = attn_context_create(DEVICE_CUDA, NULL, kernels[f], err, sizeof err);
        EXPECT(ctx != NULL, "context %s: %s", fam[f], err);
        if (!ctx) continue;
        for (size_t i = 0; i < sizeof patterns / sizeof patterns[0]; i++) {
            snprintf(name, sizeof name, "[%s] %s vs cpu, within 2x dense", fam[f], patterns[i].name);
            TEST_CASE(name, check_pattern(ctx, &patterns[i], &rng));
        }
        for (size_t i = 0; i < sizeof full / sizeof full[0]; i++) {
            snprintf(name, sizeof name, "[%s] %s equals dense", fam[f], full[i].name);
            TEST_CASE(name, check_full_mask(ctx, &full[i], &rng));
        }
        snprintf(name, sizeof name, "[%s] %s: never loaded", fam[f], unread.name);
        TEST_CASE(name, check_unread(ctx, &unread, &rng));
        attn_context_destroy(ctx);
    }
    return TEST_SUMMARY();
}
