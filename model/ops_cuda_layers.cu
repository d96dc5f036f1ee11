// ops_cuda_layers: the CUDA backend's element-wise and row-wise ops: embedding forward,
// LayerNorm forward/backward (fp32 statistics), residual add, GELU, the bias/GELU backward of the
// linear layer, dtype conversions, and the deterministic column sums that parameter gradients
// (LayerNorm weight/bias, linear bias) are reduced with.
//
// Column sums never use atomics: each (row chunk, 32-column tile) block writes its fp32 partial
// sums, then one thread per column adds the chunks in order and into the gradient. The result
// is bitwise the same on every run.
#include "model/cuda_common.cuh"

#define ELT_THREADS 256   // element-wise kernels: one thread per element
#define LN_WARPS 8        // LayerNorm: one warp per row, 8 rows per block
#define COL_TILE 32       // column-sum tiles: 32 columns (one warp wide) x COL_ROWS_PAR rows
#define COL_ROWS_PAR 8

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// ---- embedding forward ----

template <typename T>
__global__ void embed_forward_kernel(T *out, const int *tokens, const int *pos, const T *wte,
                                     const T *wpe, int N, int T_, int C) {
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)N * C) return;
    const int i = (int)(idx / C), c = (int)(idx % C);
    float v = to_f32(wte[(size_t)tokens[i] * C + c]);
    if (wpe) v += to_f32(wpe[(size_t)(pos ? pos[i] : i % T_) * C + c]);
    out[idx] = from_f32<T>(v);
}

void cuda_embed_forward(Backend *be, void *out, const int *tokens, const int *pos, const void *wte,
                        const void *wpe, int B, int T, int C) {
    const int N = B * T;
    dispatch_dtype(be->dtype, [&](auto tag) {
        using E = decltype(tag);
        embed_forward_kernel<E><<<cdiv((long long)N * C, ELT_THREADS), ELT_THREADS, 0,
                                  cuda_ctx(be)->stream>>>(
            (E *)out, tokens, pos, (const E *)wte, (const E *)wpe, N, T, C);
    });
    CUDA_CHECK_LAUNCH();
}

// ---- LayerNorm ----

template <typename T>
__global__ void layernorm_forward_kernel(T *out, float *mean, float *rstd, const T *inp, const T *w,
                                         const T *b, int N, int C) {
    const int row = blockIdx.x * LN_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const T *x = inp + (size_t)row * C;   // (C)
    T *o = out + (size_t)row * C;         // (C)
    float s = 0.0f;
    for (int c = lane; c < C; c += 32) s += to_f32(x[c]);
    const float m = warp_sum(s) / C;
    // Variance from the centred values (two passes): no cancellation for rows with a large mean.
    float v = 0.0f;
    for (int c = lane; c < C; c += 32) {
        const float d = to_f32(x[c]) - m;
        v += d * d;
    }
    const float r = 1.0f / sqrtf(warp_sum(v) / C + 1e-5f);
    for (int c = lane; c < C; c += 32)
        o[c] = from_f32<T>((to_f32(x[c]) - m) * r * to_f32(w[c]) + to_f32(b[c]));
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

void cuda_layernorm_forward(Backend *be, void *out, float *mean, float *rstd, const void *inp,
                            const void *w, const void *b, int N, int C) {
    dispatch_dtype(be->dtype, [&](auto tag) {
        using E = decltype(tag);
        layernorm_forward_kernel<E><<<cdiv(N, LN_WARPS), LN_WARPS * 32, 0, cuda_ctx(be)->stream>>>(
            (E *)out, mean, rstd, (const E *)inp, (const E *)w, (const E *)b, N, C);
    });
    CUDA_CHECK_LAUNCH();
}

// dinp += rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)), dnorm = dout * w.
template <typename T>
__global__ void layernorm_backward_dinp_kernel(T *dinp, const T *dout, const T *inp, const T *w,
                                               const float *mean, const float *rstd, int N, int C) {
    const int row = blockIdx.x * LN_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const T *x = inp + (size_t)row * C, *d = dout + (size_t)row * C;  // (C)
    T *di = dinp + (size_t)row * C;                                    // (C)
    const float m = mean[row], s = rstd[row];
    float sum_dn = 0.0f, sum_dn_n = 0.0f;
    for (int c = lane; c < C; c += 32) {
        const float dn = to_f32(d[c]) * to_f32(w[c]);
        sum_dn += dn;
        sum_dn_n += dn * ((to_f32(x[c]) - m) * s);
    }
    const float a = warp_sum(sum_dn) / C, bb = warp_sum(sum_dn_n) / C;
    for (int c = lane; c < C; c += 32) {
        const float dn = to_f32(d[c]) * to_f32(w[c]);
        const float xn = (to_f32(x[c]) - m) * s;
        di[c] = from_f32<T>(to_f32(di[c]) + s * (dn - a - xn * bb));
    }
}

// Sums the 8 row-phase accumulators of a column tile in a fixed order into partial[c].
__device__ __forceinline__ void tile_store(float (*sh)[COL_TILE + 1], float acc, float *partial,
                                           int c, int C) {
    sh[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float s = 0.0f;
        for (int k = 0; k < COL_ROWS_PAR; k++) s += sh[k][threadIdx.x];
        partial[c] = s;
    }
}

// partial (2, n_chunks, C): [0] sums of dout * norm (for dw), [1] sums of dout (for db).
template <typename T>
__global__ void layernorm_backward_dwdb_kernel(float *partial, const T *dout, const T *inp,
                                               const float *mean, const float *rstd, int N, int C) {
    __shared__ float sh_w[COL_ROWS_PAR][COL_TILE + 1], sh_b[COL_ROWS_PAR][COL_TILE + 1];
    const int c = blockIdx.x * COL_TILE + threadIdx.x, chunk = blockIdx.y;
    const int r_end = min((chunk + 1) * COLSUM_ROWS, N);
    float aw = 0.0f, ab = 0.0f;
    if (c < C)
        for (int r = chunk * COLSUM_ROWS + threadIdx.y; r < r_end; r += COL_ROWS_PAR) {
            const size_t i = (size_t)r * C + c;
            const float d = to_f32(dout[i]);
            aw += d * ((to_f32(inp[i]) - mean[r]) * rstd[r]);
            ab += d;
        }
    tile_store(sh_w, aw, partial + (size_t)chunk * C, c, C);
    tile_store(sh_b, ab, partial + ((size_t)gridDim.y + chunk) * C, c, C);
}

void cuda_layernorm_backward(Backend *be, void *dinp, void *dw, void *db, const void *dout,
                             const void *inp, const void *w, const float *mean, const float *rstd,
                             int N, int C) {
    cudaStream_t st = cuda_ctx(be)->stream;
    const int n_chunks = cdiv(N, COLSUM_ROWS);
    float *partial = (float *)cuda_scratch(cuda_ctx(be), 2 * (size_t)n_chunks * C * sizeof(float));
    dispatch_dtype(be->dtype, [&](auto tag) {
        using E = decltype(tag);
        layernorm_backward_dinp_kernel<E><<<cdiv(N, LN_WARPS), LN_WARPS * 32, 0, st>>>(
            (E *)dinp, (const E *)dout, (const E *)inp, (const E *)w, mean, rstd, N, C);
        CUDA_CHECK_LAUNCH();
        layernorm_backward_dwdb_kernel<E><<<dim3(cdiv(C, COL_TILE), n_chunks),
                                            dim3(COL_TILE, COL_ROWS_PAR), 0, st>>>(
            partial, (const E *)dout, (const E *)inp, mean, rstd, N, C);
        CUDA_CHECK_LAUNCH();
    });
    cuda_colsum_finish(be, dw, partial, n_chunks, C);
    cuda_colsum_finish(be, db, partial + (size_t)n_chunks * C, n_chunks, C);
}

// ---- column sums ----

template <typename T>
__global__ void colsum_finish_kernel(T *out, const float *partial, int n_chunks, int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float s = 0.0f;
    for (int k = 0; k < n_chunks; k++) s += partial[(size_t)k * C + c];
    out[c] = from_f32<T>(to_f32(out[c]) + s);
}

void cuda_colsum_finish(Backend *be, void *out, const float *partial, int n_chunks, int C) {
    dispatch_dtype(be->dtype, [&](auto tag) {
        using E = decltype(tag);
        colsum_finish_kernel<E><<<cdiv(C, ELT_THREADS), ELT_THREADS, 0, cuda_ctx(be)->stream>>>(
            (E *)out, partial, n_chunks, C);
    });
    CUDA_CHECK_LAUNCH();
}

// ---- linear layer helpers: bias gradient and GELU ----

// With pre: dout = round(dout * gelu'(pre)) in place. With partial: per-chunk column sums of the
// (rounded) result, the values the weight-gradient matmul sees, into partial (n_chunks, OC).
template <typename T>
__global__ void bias_gelu_backward_kernel(float *partial, T *dout, const T *pre, int N, int OC) {
    __shared__ float sh[COL_ROWS_PAR][COL_TILE + 1];
    const int c = blockIdx.x * COL_TILE + threadIdx.x, chunk = blockIdx.y;
    const int r_end = min((chunk + 1) * COLSUM_ROWS, N);
    float acc = 0.0f;
    if (c < OC)
        for (int r = chunk * COLSUM_ROWS + threadIdx.y; r < r_end; r += COL_ROWS_PAR) {
            const size_t i = (size_t)r * OC + c;
            T d = dout[i];
            if (pre) {
                d = from_f32<T>(to_f32(d) * gelu_grad_f32(to_f32(pre[i])));
                dout[i] = d;
            }
            acc += to_f32(d);
        }
    if (partial) tile_store(sh, acc, partial + (size_t)chunk * OC, c, OC);
}

void cuda_bias_gelu_backward(Backend *be, void *dbias, void *dout, const void *pre, int N, int OC) {
    const int n_chunks = cdiv(N, COLSUM_ROWS);
    float *partial =
        dbias ? (float *)cuda_scratch(cuda_ctx(be), (size_t)n_chunks * OC * sizeof(float)) : NULL;
    dispatch_dtype(be->dtype, [&](auto tag) {
        using E = decltype(tag);
        bias_gelu_backward_kernel<E><<<dim3(cdiv(OC, COL_TILE), n_chunks),
                                       dim3(COL_TILE, COL_ROWS_PAR), 0, cuda_ctx(be)->stream>>>(
            partial, (E *)dout, (const E *)pre, N, OC);
    });
    CUDA_CHECK_LAUNCH();
    if (dbias) cuda_colsum_finish(be, dbias, partial, n_chunks, OC);
}

template <typename T> __global__ void gelu_forward_kernel(T *out, const T *pre, size_t n) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = from_f32<T>(gelu_f32(to_f32(pre[i])));
}

void cuda_gelu_forward(Backend *be, void *out, const void *pre, size_t n) {
    dispatch_dtype(be->dtype, [&](auto tag) {
        using E = decltype(tag);
        gelu_forward_kernel<E><<<cdiv((long long)n, ELT_THREADS), ELT_THREADS, 0,
                                 cuda_ctx(be)->stream>>>((E *)out, (const E *)pre, n);
    });
    CUDA_CHECK_LAUNCH();
}

// ---- element-wise ----

template <typename T> __global__ void add_kernel(T *out, const T *a, const T *b, size_t n) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = from_f32<T>(to_f32(a[i]) + to_f32(b[i]));
}

void cuda_add(Backend *be, void *out, const void *a, const void *b, size_t n) {
    if (n == 0) return;
    dispatch_dtype(be->dtype, [&](auto tag) {
        using E = decltype(tag);
        add_kernel<E><<<cdiv((long long)n, ELT_THREADS), ELT_THREADS, 0, cuda_ctx(be)->stream>>>(
            (E *)out, (const E *)a, (const E *)b, n);
    });
    CUDA_CHECK_LAUNCH();
}

template <typename T> __global__ void convert_from_f32_kernel(T *dst, const float *src, size_t n) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = from_f32<T>(src[i]);
}

template <typename T> __global__ void convert_to_f32_kernel(float *dst, const T *src, size_t n) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = to_f32(src[i]);
}

void cuda_convert_f32_to(Backend *be, void *dst, const float *src, size_t n) {
    if (n == 0) return;
    dispatch_dtype(be->dtype, [&](auto tag) {
        using E = decltype(tag);
        convert_from_f32_kernel<E><<<cdiv((long long)n, ELT_THREADS), ELT_THREADS, 0,
                                     cuda_ctx(be)->stream>>>((E *)dst, src, n);
    });
    CUDA_CHECK_LAUNCH();
}

void cuda_convert_to_f32(Backend *be, float *dst, const void *src, size_t n) {
    if (n == 0) return;
    dispatch_dtype(be->dtype, [&](auto tag) {
        using E = decltype(tag);
        convert_to_f32_kernel<E><<<cdiv((long long)n, ELT_THREADS), ELT_THREADS, 0,
                                   cuda_ctx(be)->stream>>>(dst, (const E *)src, n);
    });
    CUDA_CHECK_LAUNCH();
}
