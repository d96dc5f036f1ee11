// naive_cuda: standard attention with the scores materialised, (B, NH, T_q, T_k), through cuBLAS:
// S = scale Q K^T, a row softmax kernel (soft-cap, masks, ALiBi, LSE, dropout), O = P V; backward
// recomputes P from the scores and the LSE and runs dV = P^T dO, dP = dO V^T,
// dS = P (dP - D) (times the cap's derivative), dQ = scale dS K, dK = scale dS^T Q. It is the
// memory and speed baseline (`attention.impl = naive`), the path for fp32 and head sizes the
// flash kernels do not cover, and for the features they lack (mask.c's cuda_flash_lacks).
// Matrices are row-major in our terms; cuBLAS sees each as its column-major transpose.
#include <cublas_v2.h>
#include <stdio.h>

#include "attention/flash_common.cuh"
#include "attention/flash_mask.cuh"
#include "attention/flash_tiles.cuh"
#include "attention/naive_cuda.cuh"

#define NAIVE_THREADS 256

// Workspace, in floats from p.workspace (its size is attn_workspace_bytes, attention/mask.c):
// [D or dQ accumulator: rows_q * (HS + 1)] [GQA dK, dV: 2 * B*NH*T_k*HS when NKV < NH]
// [S / P fp32: rows_q * T_k] [P_drop, then dP fp32 / dS: rows_q * T_k]
struct NaiveBuffers {
    float *dk_acc, *dv_acc;  // (B, NKV, T_k, HS) fp32, GQA only
    float *s;                // (B, NH, T_q, T_k) scores, then P (undropped)
    void *pd;                // (B, NH, T_q, T_k) P_drop in the element type; in backward dP / dS
};

static NaiveBuffers naive_buffers(const AttnParams &p) {
    const size_t rows_q = (size_t)p.B * p.NH * p.T_q, rows_k = (size_t)p.B * p.NH * p.T_k;
    float *w = static_cast<float *>(p.workspace) + rows_q * ((size_t)p.HS + 1);
    NaiveBuffers nb = {};
    if (p.NKV < p.NH) {
        nb.dk_acc = w;
        nb.dv_acc = w + rows_k * p.HS;
        w += 2 * rows_k * p.HS;
    }
    nb.s = w;
    nb.pd = w + rows_q * p.T_k;
    return nb;
}

static cudaDataType_t cuda_type(DType t) {
    return t == DTYPE_BF16 ? CUDA_R_16BF : t == DTYPE_F16 ? CUDA_R_16F : CUDA_R_32F;
}

// The first failure of a pass (a cuBLAS status or a kernel launch error): once one is set the
// remaining steps are not queued, and the entry point turns it into the caller's message.
struct NaiveStatus {
    cublasStatus_t blas;
    cudaError_t cuda;
    bool ok() const { return blas == CUBLAS_STATUS_SUCCESS && cuda == cudaSuccess; }
};

// After a kernel launch: its configuration error, if any, becomes the pass's status.
static void launched(NaiveStatus *st) {
    const cudaError_t e = cudaGetLastError();
    if (st->ok()) st->cuda = e;
}

// C (m x n, column-major, ldc) = alpha op(A) op(B) + beta C for `batch` matrices, fp32 accumulation.
struct Gemm {
    cublasHandle_t h;
    cublasOperation_t ta, tb;
    int m, n, k;
    const void *a; cudaDataType_t at; int64_t lda, sa;
    const void *b; cudaDataType_t bt; int64_t ldb, sb;
    void *c; cudaDataType_t ct; int64_t ldc, sc;
    int batch;
    float alpha, beta;
};
static void gemm_run(const Gemm &g, NaiveStatus *st) {
    if (!st->ok()) return;
    st->blas = cublasGemmStridedBatchedEx(g.h, g.ta, g.tb, g.m, g.n, g.k, &g.alpha, g.a, g.at, (int)g.lda,
                                          g.sa, g.b, g.bt, (int)g.ldb, g.sb, &g.beta, g.c, g.ct, (int)g.ldc,
                                          g.sc, g.batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

template <typename T> __device__ __forceinline__ T st_f(float x) { return ElemTraits<T>::from_float(x); }

__device__ __forceinline__ float block_reduce(float v, bool is_max, float *scratch) {
    for (int off = 16; off > 0; off >>= 1) {
        float o = __shfl_xor_sync(0xffffffffu, v, off);
        v = is_max ? fmaxf(v, o) : v + o;
    }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads();  // scratch may still be read from a previous reduction
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = scratch[0];
    for (int w = 1; w < NAIVE_THREADS / 32; w++) v = is_max ? fmaxf(v, scratch[w]) : v + scratch[w];
    return v;
}

// Score row (b, h, i) of the (B, NH, T_q, T_k) matrices, block row = (b * NH + h) * T_q + i: its
// visible keys, the ALiBi slope and the query's position.
struct NaiveRow {
    int64_t row;
    int b, h, i, pos;
    RowRange rr;
    float slope;
};
__device__ __forceinline__ NaiveRow naive_row(const AttnParams &p) {
    NaiveRow r;
    r.row = blockIdx.x;
    r.i = (int)(r.row % p.T_q);
    r.h = (int)((r.row / p.T_q) % p.NH);
    r.b = (int)(r.row / ((int64_t)p.T_q * p.NH));
    r.pos = r.i + (int)attn_query_shift(&p);
    r.rr = row_range(p, r.b, r.i);
    r.slope = p.alibi_slopes ? attn_alibi_slope(&p, r.b, r.h) : 0.f;
    return r;
}

// Capped, biased, masked score of element j of a row from its raw score x (scale already
// applied by the GEMM).
__device__ __forceinline__ float naive_score(const AttnParams &p, const NaiveRow &r, float x, int j) {
    if (j < r.rr.lo || j >= r.rr.hi) return -INFINITY;
    if (p.softcap > 0.f) x = attn_softcap(p.softcap, x);
    if (p.alibi_slopes) x += attn_alibi_bias(r.slope, r.pos, j);
    return x;
}

// One block per row (b, h, i): P_drop in the element type and, in the forward, the LSE and
// P = softmax(S) in place (fp32). With `from_lse` (backward) the LSE saved by the forward is used
// instead of recomputing it, and S keeps the raw scores that naive_dsoftmax_kernel reads.
template <typename T> __global__ void naive_softmax_kernel(const AttnParams p, float *s, T *pd, bool from_lse) {
    __shared__ float scratch[NAIVE_THREADS / 32];
    const NaiveRow r = naive_row(p);
    float *srow = s + r.row * p.T_k;
    T *prow = pd + r.row * p.T_k;
    float lse;
    if (from_lse) {
        lse = p.lse[attn_lse_offset(&p, r.b, r.h) + r.i];
    } else {
        float mx = -INFINITY;
        for (int j = threadIdx.x; j < p.T_k; j += NAIVE_THREADS) mx = fmaxf(mx, naive_score(p, r, srow[j], j));
        mx = block_reduce(mx, true, scratch);
        const float m_use = mx == -INFINITY ? 0.f : mx;
        float sum = 0.f;
        for (int j = threadIdx.x; j < p.T_k; j += NAIVE_THREADS) sum += expf(naive_score(p, r, srow[j], j) - m_use);
        sum = block_reduce(sum, false, scratch);
        lse = sum > 0.f ? m_use + logf(sum) : INFINITY;  // fully masked row: P = 0, LSE +inf
        if (threadIdx.x == 0 && p.lse) p.lse[attn_lse_offset(&p, r.b, r.h) + r.i] = lse;
    }
    const float keep_scale = p.dropout_p > 0.f ? attn_dropout_scale(p.dropout_p) : 1.f;
    const uint64_t keep_offset = p.dropout_p > 0.f ? attn_dropout_offset(&p) : 0;
    for (int j = threadIdx.x; j < p.T_k; j += NAIVE_THREADS) {
        const float pr = expf(naive_score(p, r, srow[j], j) - lse);
        if (!from_lse) srow[j] = pr;
        const bool keep = p.dropout_p <= 0.f || attn_dropout_keep_at(&p, keep_offset, r.b, r.h, r.i, j);
        prow[j] = st_f<T>(keep ? pr * keep_scale : 0.f);
    }
}

// dS = P * (dP_drop - D) * cap'(S) with D = sum_j P_drop dP; row (b, h, i). P is recomputed from
// the raw scores s and the saved LSE; dP (fp32) is read from `dp` and dS is written over it in
// the element type at the same row start (row stride ld_ds elements); the chunked
// read-barrier-write keeps the in-place narrowing race-free.
template <typename T> __global__ void naive_dsoftmax_kernel(const AttnParams p, const float *s, float *dp, int64_t ld_ds) {
    __shared__ float scratch[NAIVE_THREADS / 32];
    const NaiveRow r = naive_row(p);
    const float *srow = s + r.row * p.T_k;
    const float lse = p.lse[attn_lse_offset(&p, r.b, r.h) + r.i];
    float *dprow = dp + r.row * p.T_k;
    T *dsrow = reinterpret_cast<T *>(dp) + r.row * ld_ds;
    const float keep_scale = p.dropout_p > 0.f ? attn_dropout_scale(p.dropout_p) : 1.f;
    const uint64_t keep_offset = p.dropout_p > 0.f ? attn_dropout_offset(&p) : 0;
    auto prob = [&](int j) { return expf(naive_score(p, r, srow[j], j) - lse); };  // +inf lse: 0
    auto dp_eff = [&](int j) {  // dL/dP (undropped) = dL/dP_drop * keep / (1 - p)
        if (p.dropout_p <= 0.f) return dprow[j];
        return attn_dropout_keep_at(&p, keep_offset, r.b, r.h, r.i, j) ? dprow[j] * keep_scale : 0.f;
    };
    float d = 0.f;
    for (int j = threadIdx.x; j < p.T_k; j += NAIVE_THREADS) d += prob(j) * dp_eff(j);
    d = block_reduce(d, false, scratch);
    for (int j0 = 0; j0 < p.T_k; j0 += NAIVE_THREADS) {
        const int j = j0 + threadIdx.x;
        float v = j < p.T_k ? prob(j) * (dp_eff(j) - d) : 0.f;
        if (j < p.T_k && p.softcap > 0.f && v != 0.f) v *= attn_softcap_grad(p.softcap, srow[j]);
        __syncthreads();  // every thread has read its dP of this chunk before anyone narrows it
        if (j < p.T_k) dsrow[j] = st_f<T>(v);
    }
}

template <typename T> __global__ void naive_convert_kernel(const AttnParams p, const float *acc, void *dst, AttnStrides st) {
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;  // over (B, NKV, T_k, HS)
    if (idx >= (int64_t)p.B * p.NKV * p.T_k * p.HS) return;
    const int c = (int)(idx % p.HS);
    const int64_t r = idx / p.HS;
    const int j = (int)(r % p.T_k), g = (int)((r / p.T_k) % p.NKV), b = (int)(r / ((int64_t)p.T_k * p.NKV));
    static_cast<T *>(dst)[b * st.batch + (int64_t)j * st.row + g * st.head + c] = st_f<T>(acc[idx]);
}

// What both passes derive from p: the workspace's buffers, the query heads per KV head (G),
// the element type as cuBLAS names it (dt) and its size (eb), the size of one (T_q, T_k) score
// matrix (tt) and the number of score rows (B * NH * T_q, the softmax kernels' grid).
struct NaivePass {
    NaiveBuffers nb;
    int G;
    cudaDataType_t dt;
    size_t eb;
    int64_t tt;
    unsigned rows;
};
static NaivePass naive_pass_of(const AttnParams &p) {
    return {naive_buffers(p), p.NH / p.NKV, cuda_type(p.dtype), dtype_size(p.dtype), (int64_t)p.T_q * p.T_k,
            (unsigned)((int64_t)p.B * p.NH * p.T_q)};
}

// The scaled scores S = scale Q K^T (B, NH, T_q, T_k) fp32 into nb.s: one batched GEMM per
// (batch row, KV head) over the G query heads that share it.
static void naive_scores(const AttnParams &p, const NaivePass &w, cublasHandle_t h, NaiveStatus *st) {
    for (int b = 0; b < p.B; b++)
        for (int g = 0; g < p.NKV; g++) {
            const int h0 = g * w.G;
            const char *q = (const char *)p.q + (b * p.q_st.batch + h0 * p.q_st.head) * w.eb;
            const char *k = (const char *)p.k + (b * p.k_st.batch + g * p.k_st.head) * w.eb;
            float *sc = w.nb.s + ((int64_t)b * p.NH + h0) * w.tt;
            // S^T (T_k x T_q) = K (T_k x HS) Q^T: col-major C = op(A)=K^T^T, B = Q^T
            gemm_run({h, CUBLAS_OP_T, CUBLAS_OP_N, p.T_k, p.T_q, p.HS, k, w.dt, p.k_st.row, 0, q, w.dt, p.q_st.row,
                      p.q_st.head, sc, CUDA_R_32F, p.T_k, w.tt, w.G, p.scale, 0.f}, st);
        }
}

template <typename T> static NaiveStatus naive_forward_t(const AttnParams &p, cublasHandle_t h, cudaStream_t s) {
    NaiveStatus st = {CUBLAS_STATUS_SUCCESS, cudaSuccess};
    const NaivePass w = naive_pass_of(p);
    naive_scores(p, w, h, &st);
    naive_softmax_kernel<T><<<w.rows, NAIVE_THREADS, 0, s>>>(p, w.nb.s, static_cast<T *>(w.nb.pd), false);
    launched(&st);
    for (int b = 0; b < p.B; b++)
        for (int g = 0; g < p.NKV; g++) {
            const int h0 = g * w.G;
            const char *v = (const char *)p.v + (b * p.v_st.batch + g * p.v_st.head) * w.eb;
            const char *pd = (const char *)w.nb.pd + ((int64_t)b * p.NH + h0) * w.tt * w.eb;
            char *o = (char *)p.out + (b * p.o_st.batch + h0 * p.o_st.head) * w.eb;
            // O^T (HS x T_q) = V^T (HS x T_k) P^T (T_k x T_q)
            gemm_run({h, CUBLAS_OP_N, CUBLAS_OP_N, p.HS, p.T_q, p.T_k, v, w.dt, p.v_st.row, 0, pd, w.dt, p.T_k, w.tt, o,
                      w.dt, p.o_st.row, p.o_st.head, w.G, 1.f, 0.f}, &st);
        }
    return st;
}

template <typename T> static NaiveStatus naive_backward_t(const AttnParams &p, cublasHandle_t h, cudaStream_t s) {
    NaiveStatus st = {CUBLAS_STATUS_SUCCESS, cudaSuccess};
    const NaivePass w = naive_pass_of(p);
    const int64_t ld_ds = p.T_k * (int64_t)(4 / w.eb);  // dS rows keep dP's byte stride
    const bool gqa = w.G > 1;
    naive_scores(p, w, h, &st);
    naive_softmax_kernel<T><<<w.rows, NAIVE_THREADS, 0, s>>>(p, w.nb.s, static_cast<T *>(w.nb.pd), true);
    launched(&st);
    // dV (T_k x HS) = P_drop^T dO: col-major dV^T (HS x T_k) = dO^T (HS x T_q) P_drop (T_q x T_k)
    for (int b = 0; b < p.B; b++)
        for (int hh = 0; hh < p.NH; hh++) {
            const int g = hh / w.G;
            const char *dO = (const char *)p.dout + (b * p.do_st.batch + hh * p.do_st.head) * w.eb;
            const char *pd = (const char *)w.nb.pd + ((int64_t)b * p.NH + hh) * w.tt * w.eb;
            if (gqa)
                gemm_run({h, CUBLAS_OP_N, CUBLAS_OP_T, p.HS, p.T_k, p.T_q, dO, w.dt, p.do_st.row, 0, pd, w.dt, p.T_k, 0,
                          w.nb.dv_acc + ((int64_t)b * p.NKV + g) * p.T_k * p.HS, CUDA_R_32F, p.HS, 0, 1, 1.f,
                          hh % w.G == 0 ? 0.f : 1.f}, &st);
            else
                gemm_run({h, CUBLAS_OP_N, CUBLAS_OP_T, p.HS, p.T_k, p.T_q, dO, w.dt, p.do_st.row, 0, pd, w.dt, p.T_k, 0,
                          (char *)p.dv + (b * p.dv_st.batch + g * p.dv_st.head) * w.eb, w.dt, p.dv_st.row, 0, 1,
                          1.f, 0.f}, &st);
        }
    // dP^T (T_k x T_q) = V dO^T, fp32, over P_drop (dead now)
    float *dp = static_cast<float *>(w.nb.pd);
    for (int b = 0; b < p.B; b++)
        for (int g = 0; g < p.NKV; g++) {
            const int h0 = g * w.G;
            const char *dO = (const char *)p.dout + (b * p.do_st.batch + h0 * p.do_st.head) * w.eb;
            const char *v = (const char *)p.v + (b * p.v_st.batch + g * p.v_st.head) * w.eb;
            gemm_run({h, CUBLAS_OP_T, CUBLAS_OP_N, p.T_k, p.T_q, p.HS, v, w.dt, p.v_st.row, 0, dO, w.dt, p.do_st.row,
                      p.do_st.head, dp + ((int64_t)b * p.NH + h0) * w.tt, CUDA_R_32F, p.T_k, w.tt, w.G, 1.f, 0.f}, &st);
        }
    naive_dsoftmax_kernel<T><<<w.rows, NAIVE_THREADS, 0, s>>>(p, w.nb.s, dp, ld_ds);
    launched(&st);
    const T *ds = reinterpret_cast<const T *>(dp);  // (B, NH, T_q, T_k) with row stride ld_ds
    for (int b = 0; b < p.B; b++)
        for (int g = 0; g < p.NKV; g++) {
            const int h0 = g * w.G;
            const T *dsg = ds + ((int64_t)b * p.NH + h0) * p.T_q * ld_ds;
            const char *k = (const char *)p.k + (b * p.k_st.batch + g * p.k_st.head) * w.eb;
            char *dq = (char *)p.dq + (b * p.dq_st.batch + h0 * p.dq_st.head) * w.eb;
            // dQ^T (HS x T_q) = K^T (HS x T_k) dS^T (T_k x T_q)
            gemm_run({h, CUBLAS_OP_N, CUBLAS_OP_N, p.HS, p.T_q, p.T_k, k, w.dt, p.k_st.row, 0, dsg, w.dt, ld_ds,
                      p.T_q * ld_ds, dq, w.dt, p.dq_st.row, p.dq_st.head, w.G, p.scale, 0.f}, &st);
        }
    // dK (T_k x HS) = scale dS^T Q: col-major dK^T (HS x T_k) = Q^T (HS x T_q) dS (T_q x T_k)
    for (int b = 0; b < p.B; b++)
        for (int hh = 0; hh < p.NH; hh++) {
            const int g = hh / w.G;
            const char *q = (const char *)p.q + (b * p.q_st.batch + hh * p.q_st.head) * w.eb;
            const T *dsh = ds + ((int64_t)b * p.NH + hh) * p.T_q * ld_ds;
            if (gqa)
                gemm_run({h, CUBLAS_OP_N, CUBLAS_OP_T, p.HS, p.T_k, p.T_q, q, w.dt, p.q_st.row, 0, dsh, w.dt, ld_ds, 0,
                          w.nb.dk_acc + ((int64_t)b * p.NKV + g) * p.T_k * p.HS, CUDA_R_32F, p.HS, 0, 1, p.scale,
                          hh % w.G == 0 ? 0.f : 1.f}, &st);
            else
                gemm_run({h, CUBLAS_OP_N, CUBLAS_OP_T, p.HS, p.T_k, p.T_q, q, w.dt, p.q_st.row, 0, dsh, w.dt, ld_ds, 0,
                          (char *)p.dk + (b * p.dk_st.batch + g * p.dk_st.head) * w.eb, w.dt, p.dk_st.row, 0, 1,
                          p.scale, 0.f}, &st);
        }
    if (gqa) {
        const int64_t n = (int64_t)p.B * p.NKV * p.T_k * p.HS;
        const unsigned blocks = (unsigned)((n + 255) / 256);
        naive_convert_kernel<T><<<blocks, 256, 0, s>>>(p, w.nb.dk_acc, p.dk, p.dk_st);
        naive_convert_kernel<T><<<blocks, 256, 0, s>>>(p, w.nb.dv_acc, p.dv, p.dv_st);
        launched(&st);
    }
    return st;
}

// The pass's status as attention.h's: 0, or -1 with the failing library's message.
static int naive_result(NaiveStatus st, char *err, size_t errlen) {
    if (st.blas != CUBLAS_STATUS_SUCCESS)
        snprintf(err, errlen, "attention: cuBLAS failed in the naive path: %s", cublasGetStatusString(st.blas));
    else if (st.cuda != cudaSuccess)
        snprintf(err, errlen, "attention: a naive-path kernel launch failed: %s", cudaGetErrorString(st.cuda));
    return st.ok() ? 0 : -1;
}

template <typename T>
static NaiveStatus naive_pass(const AttnParams &p, cublasHandle_t h, int backward, cudaStream_t s) {
    return backward ? naive_backward_t<T>(p, h, s) : naive_forward_t<T>(p, h, s);
}

int naive_run_cuda(const AttnParams &p, cublasHandle_t h, int backward, char *err, size_t errlen) {
    cudaStream_t s = static_cast<cudaStream_t>(p.stream);
    NaiveStatus st = {cublasSetStream(h, s), cudaSuccess};
    if (st.ok()) {
        if (p.dtype == DTYPE_BF16) st = naive_pass<__nv_bfloat16>(p, h, backward, s);
        else if (p.dtype == DTYPE_F16) st = naive_pass<__half>(p, h, backward, s);
        else st = naive_pass<float>(p, h, backward, s);
    }
    return naive_result(st, err, errlen);
}
