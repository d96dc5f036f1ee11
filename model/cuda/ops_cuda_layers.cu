// ops_cuda_layers: the CUDA backend's element-wise and row-wise ops: embedding forward,
// LayerNorm forward (alone or fused with the residual add before it and the branch's dropout)
// and backward (fp32 statistics; optionally also writing a copy of the residual gradient through
// a dropout mask), residual add, GELU, the bias/GELU backward of the
// linear layer, dtype conversions, and the deterministic column sums that parameter gradients
// (LayerNorm weight/bias, linear bias) are reduced with.
//
// Column sums never use atomics: each block writes the fp32 partial sums of its chunk of rows,
// then colsum_finish adds the chunks in a fixed order into the gradient. The result is bitwise
// the same on every run.
#include "model/cuda/cuda_common.cuh"

#define ELT_THREADS 256   // element-wise kernels: one thread per element
#define LN_WARPS 8        // LayerNorm: one warp per row, 8 rows per block
#define COL_TILE 32       // column-sum tiles: 32 columns (one warp wide) x COL_ROWS_PAR rows
#define COL_ROWS_PAR 8
#define LN_BWD_ROWS 8     // LayerNorm backward: rows per warp (column sums per block of 8 x 8 rows)

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

// One warp per row; lane l owns the VEC-element groups starting at (l + 32 k) VEC. With res
// (the fused residual add), the row is first res = inp + drop(add), rounded to T and stored;
// the lane then reads back only what it wrote itself.
template <typename T, int VEC>
__global__ void layernorm_forward_kernel(T *out, float *mean, float *rstd, T *res, const T *inp,
                                         const T *add, DropArgs drop, const T *w, const T *b, int N,
                                         int C) {
    const int row = blockIdx.x * LN_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const T *x = (res ? res : inp) + (size_t)row * C;   // (C)
    T *o = out + (size_t)row * C;                       // (C)
    float v[VEC], s = 0.0f;
    for (int c = lane * VEC; c < C; c += 32 * VEC) {
        if (res) {
            float y[VEC];
            load_f32<T, VEC>(v, inp + (size_t)row * C + c);
            load_f32<T, VEC>(y, add + (size_t)row * C + c);
            drop_apply<T, VEC>(drop, (size_t)row * C + c, y);
#pragma unroll
            for (int i = 0; i < VEC; i++) v[i] = to_f32(from_f32<T>(v[i] + y[i]));
            store_f32<T, VEC>(res + (size_t)row * C + c, v);
        } else {
            load_f32<T, VEC>(v, x + c);
        }
#pragma unroll
        for (int i = 0; i < VEC; i++) s += v[i];
    }
    const float m = warp_sum(s) / C;
    // Variance from the centred values (two passes): no cancellation for rows with a large mean.
    float var = 0.0f;
    for (int c = lane * VEC; c < C; c += 32 * VEC) {
        load_f32<T, VEC>(v, x + c);
#pragma unroll
        for (int i = 0; i < VEC; i++) var += (v[i] - m) * (v[i] - m);
    }
    const float r = 1.0f / sqrtf(warp_sum(var) / C + 1e-5f);
    for (int c = lane * VEC; c < C; c += 32 * VEC) {
        float wv[VEC], bv[VEC];
        load_f32<T, VEC>(v, x + c);
        load_f32<T, VEC>(wv, w + c);
        load_f32<T, VEC>(bv, b + c);
#pragma unroll
        for (int i = 0; i < VEC; i++) v[i] = (v[i] - m) * r * wv[i] + bv[i];
        store_f32<T, VEC>(o + c, v);
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

// LayerNorm of inp, or with res of res = inp + drop(add).
static void launch_layernorm_forward(Backend *be, void *out, float *mean, float *rstd, void *res,
                                     const void *inp, const void *add, const DropMask *drop,
                                     const void *w, const void *b, int N, int C) {
    const DropArgs d = drop_args(drop);
    dispatch_dtype(be->dtype, [&](auto tag) {
        using E = decltype(tag);
        dispatch_vec<E>(C, {out, res, inp, add, w, b}, [&](auto vec) {
            constexpr int V = decltype(vec)::value;
            layernorm_forward_kernel<E, V><<<cdiv(N, LN_WARPS), LN_WARPS * 32, 0,
                                                 cuda_ctx(be)->stream>>>(
                (E *)out, mean, rstd, (E *)res, (const E *)inp, (const E *)add, d, (const E *)w,
                (const E *)b, N, C);
        });
    });
    CUDA_CHECK_LAUNCH();
}

void cuda_layernorm_forward(Backend *be, void *out, float *mean, float *rstd, const void *inp,
                            const void *w, const void *b, int N, int C) {
    launch_layernorm_forward(be, out, mean, rstd, NULL, inp, NULL, NULL, w, b, N, C);
}

void cuda_add_layernorm_forward(Backend *be, void *res, void *out, float *mean, float *rstd,
                                const void *a, const void *b, const void *w, const void *bias,
                                int N, int C, const DropMask *b_drop) {
    launch_layernorm_forward(be, out, mean, rstd, res, a, b, b_drop, w, bias, N, C);
}

// Asks L2 to fetch the line holding p (no register, no wait).
__device__ __forceinline__ void prefetch_l2(const void *p) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// The whole backward in one pass over each row (one warp per row, LN_BWD_ROWS rows per warp):
//   dinp += rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)),  dnorm = dout * w,
// and the block's column sums of dout * norm (for dw) and dout (for db), accumulated per warp
// in shared memory (each lane touches only its own columns: no atomics), then added over the
// warps in a fixed order into partial (2, gridDim.x, C). Deterministic. Column c = g VEC + i is
// kept at i G + g (G = C / VEC groups), so the 32 lanes of a warp, which hold adjacent groups,
// hit 32 different banks. dcopy gets dinp's new values through `drop`.
template <typename T, int VEC>
__global__ void layernorm_backward_kernel(T *dinp, T *dcopy, DropArgs drop, float *partial, const T *dout,
                                          const T *inp, const T *w, const float *mean,
                                          const float *rstd, int N, int C) {
    extern __shared__ float sh_acc[];   // (warps, 2, VEC, G)
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    const int G = C / VEC;
    float *acc_w = sh_acc + (size_t)warp * 2 * C, *acc_b = acc_w + C;
    for (int g = lane; g < G; g += 32)
#pragma unroll
        for (int i = 0; i < VEC; i++) acc_w[i * G + g] = acc_b[i * G + g] = 0.0f;
    const int row0 = blockIdx.x * warps * LN_BWD_ROWS;
    for (int k = 0; k < LN_BWD_ROWS; k++) {
        const int row = row0 + k * warps + warp;
        if (row >= N) break;
        const T *x = inp + (size_t)row * C, *d = dout + (size_t)row * C;  // (C)
        T *di = dinp + (size_t)row * C;                                    // (C)
        const float m = mean[row], s = rstd[row];
        float sum_dn = 0.0f, sum_dn_n = 0.0f;
        // The warp's rows follow one another: while this one's sums are taken, L2 fetches what
        // the second pass reads of it (dinp) and the next row's first pass (inp, dout).
        const int next = row + warps;
        for (int c = lane * VEC; c < C; c += 32 * VEC) {
            prefetch_l2(di + c);
            if (k + 1 < LN_BWD_ROWS && next < N) prefetch_l2(x + (size_t)warps * C + c), prefetch_l2(d + (size_t)warps * C + c);
            float xv[VEC], dv[VEC], wv[VEC];
            load_f32<T, VEC>(xv, x + c);
            load_f32<T, VEC>(dv, d + c);
            load_f32<T, VEC>(wv, w + c);
#pragma unroll
            for (int i = 0; i < VEC; i++) {
                const float xn = (xv[i] - m) * s, dn = dv[i] * wv[i];
                sum_dn += dn;
                sum_dn_n += dn * xn;
                acc_w[i * G + c / VEC] += dv[i] * xn;
                acc_b[i * G + c / VEC] += dv[i];
            }
        }
        const float a = warp_sum(sum_dn) / C, bb = warp_sum(sum_dn_n) / C;
        for (int c = lane * VEC; c < C; c += 32 * VEC) {
            float xv[VEC], dv[VEC], wv[VEC], out[VEC];
            load_f32<T, VEC>(xv, x + c);
            load_f32<T, VEC>(dv, d + c);
            load_f32<T, VEC>(wv, w + c);
            load_f32<T, VEC>(out, di + c);
#pragma unroll
            for (int i = 0; i < VEC; i++)
                out[i] += s * (dv[i] * wv[i] - a - (xv[i] - m) * s * bb);
            store_f32<T, VEC>(di + c, out);
            if (dcopy) {
#pragma unroll
                for (int i = 0; i < VEC; i++) out[i] = to_f32(from_f32<T>(out[i]));   // dinp's value
                drop_apply<T, VEC>(drop, (size_t)row * C + c, out);
                store_f32<T, VEC>(dcopy + (size_t)row * C + c, out);
            }
        }
    }
    __syncthreads();
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        const int at = (c % VEC) * G + c / VEC;
        float sw = 0.0f, sb = 0.0f;
        for (int k = 0; k < warps; k++) {
            sw += sh_acc[(size_t)k * 2 * C + at];
            sb += sh_acc[(size_t)k * 2 * C + C + at];
        }
        partial[(size_t)blockIdx.x * C + c] = sw;
        partial[((size_t)gridDim.x + blockIdx.x) * C + c] = sb;
    }
}

void cuda_layernorm_backward(Backend *be, void *dinp, void *dcopy, void *dw, void *db,
                             const void *dout, const void *inp, const void *w, const float *mean,
                             const float *rstd, int N, int C, const DropMask *dcopy_drop) {
    CudaCtx *ctx = cuda_ctx(be);
    const DropArgs drop = drop_args(dcopy_drop);
    // As many warps as the per-warp column sums leave room for: 8 up to C = 768 within the
    // default 48 KB of shared memory, fewer (and the opt-in maximum) for wider rows.
    const size_t per_warp = 2 * (size_t)C * sizeof(float);
    const size_t smem_max = per_warp * LN_WARPS <= 48 * 1024 ? 48 * 1024
                                                             : (size_t)ctx->prop.sharedMemPerBlockOptin;
    const int warps = (int)(smem_max / per_warp < LN_WARPS ? smem_max / per_warp : LN_WARPS);
    if (warps < 1)
        fatal(EXIT_RUNTIME, "layernorm backward: C = %d needs %zu bytes of shared memory per warp, "
              "the GPU has %zu per block", C, per_warp, smem_max);
    const size_t smem = per_warp * warps;
    const int blocks = cdiv(N, warps * LN_BWD_ROWS);
    float *partial = (float *)cuda_scratch(ctx, 2 * (size_t)blocks * C * sizeof(float));
    dispatch_dtype(be->dtype, [&](auto tag) {
        using E = decltype(tag);
        dispatch_vec<E>(C, {dinp, dcopy, dout, inp, w}, [&](auto vec) {
            constexpr int V = decltype(vec)::value;
            auto kernel = layernorm_backward_kernel<E, V>;
            if (smem > 48 * 1024)
                CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                (int)smem));
            kernel<<<blocks, warps * 32, smem, ctx->stream>>>(
                (E *)dinp, (E *)dcopy, drop, partial, (const E *)dout, (const E *)inp, (const E *)w, mean,
                rstd, N, C);
        });
    });
    CUDA_CHECK_LAUNCH();
    cuda_colsum_finish(be, dw, partial, blocks, C);
    cuda_colsum_finish(be, db, partial + (size_t)blocks * C, blocks, C);
}

// ---- column sums ----

// Block (32, COL_ROWS_PAR) per 32 columns: thread (x, y) adds chunks y, y + COL_ROWS_PAR, ... of
// column x in order, then row 0 adds the COL_ROWS_PAR results in order: a fixed order for any
// launch, so the sums are bitwise reproducible. The loop is unrolled so that its loads are in
// flight together ahead of the (still sequential) adds.
template <typename T>
__global__ void colsum_finish_kernel(T *out, const float *partial, int n_chunks, int C) {
    __shared__ float sh[COL_ROWS_PAR][COL_TILE + 1];
    const int c = blockIdx.x * COL_TILE + threadIdx.x;
    float s = 0.0f;
    if (c < C)
#pragma unroll 8
        for (int k = threadIdx.y; k < n_chunks; k += COL_ROWS_PAR) s += partial[(size_t)k * C + c];
    sh[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float t = 0.0f;
        for (int k = 0; k < COL_ROWS_PAR; k++) t += sh[k][threadIdx.x];
        out[c] = from_f32<T>(to_f32(out[c]) + t);
    }
}

void cuda_colsum_finish(Backend *be, void *out, const float *partial, int n_chunks, int C) {
    dispatch_dtype(be->dtype, [&](auto tag) {
        using E = decltype(tag);
        colsum_finish_kernel<E><<<cdiv(C, COL_TILE), dim3(COL_TILE, COL_ROWS_PAR), 0,
                                  cuda_ctx(be)->stream>>>((E *)out, partial, n_chunks, C);
    });
    CUDA_CHECK_LAUNCH();
}

// ---- linear layer helpers: bias gradient and GELU ----

// With pre: dout = round(dout * gelu'(pre)) in place. With partial: per-chunk column sums of the
// (rounded) result, the values the weight-gradient matmul sees, into partial (n_chunks, OC).
// Block (32, COL_ROWS_PAR) per chunk of COLSUM_ROWS rows and 32 VEC columns: thread (x, y) reads
// VEC adjacent columns of rows y, y + COL_ROWS_PAR, ...; the row phases are added in order.
template <typename T, int VEC>
__global__ void bias_gelu_backward_kernel(float *partial, T *dout, const T *pre, int N, int OC) {
    __shared__ float sh[COL_ROWS_PAR][COL_TILE * VEC + 1];
    const int c = (blockIdx.x * COL_TILE + threadIdx.x) * VEC, chunk = blockIdx.y;
    const int r_end = min((chunk + 1) * COLSUM_ROWS, N);
    float acc[VEC] = {};
    if (c < OC)
        for (int r = chunk * COLSUM_ROWS + threadIdx.y; r < r_end; r += COL_ROWS_PAR) {
            const size_t i = (size_t)r * OC + c;
            float d[VEC];
            load_f32<T, VEC>(d, dout + i);
            if (pre) {
                float p[VEC];
                load_f32<T, VEC>(p, pre + i);
#pragma unroll
                for (int k = 0; k < VEC; k++) d[k] = to_f32(from_f32<T>(d[k] * gelu_grad_f32(p[k])));
                store_f32<T, VEC>(dout + i, d);
            }
#pragma unroll
            for (int k = 0; k < VEC; k++) acc[k] += d[k];
        }
    if (!partial) return;
#pragma unroll
    for (int k = 0; k < VEC; k++) sh[threadIdx.y][threadIdx.x * VEC + k] = acc[k];
    __syncthreads();
    for (int j = threadIdx.y * COL_TILE + threadIdx.x; j < COL_TILE * VEC; j += COL_TILE * COL_ROWS_PAR) {
        const int col = blockIdx.x * COL_TILE * VEC + j;
        if (col >= OC) continue;
        float s = 0.0f;
        for (int k = 0; k < COL_ROWS_PAR; k++) s += sh[k][j];
        partial[(size_t)chunk * OC + col] = s;
    }
}

void cuda_bias_gelu_backward(Backend *be, void *dbias, void *dout, const void *pre, int N, int OC) {
    const int n_chunks = cdiv(N, COLSUM_ROWS);
    float *partial =
        dbias ? (float *)cuda_scratch(cuda_ctx(be), (size_t)n_chunks * OC * sizeof(float)) : NULL;
    dispatch_dtype(be->dtype, [&](auto tag) {
        using E = decltype(tag);
        dispatch_vec<E>(OC, {dout, pre}, [&](auto vec) {
            constexpr int V = decltype(vec)::value;
            bias_gelu_backward_kernel<E, V><<<dim3(cdiv(OC, COL_TILE * V), n_chunks),
                                                  dim3(COL_TILE, COL_ROWS_PAR), 0,
                                                  cuda_ctx(be)->stream>>>(
                partial, (E *)dout, (const E *)pre, N, OC);
        });
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

// One thread per VEC elements; a ragged tail (n % VEC) is left to the element-wise launch.
template <typename T, int VEC>
__global__ void add_kernel(T *out, const T *a, const T *b, size_t n) {
    const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * VEC;
    if (i + VEC > n) return;
    float x[VEC], y[VEC];
    load_f32<T, VEC>(x, a + i);
    load_f32<T, VEC>(y, b + i);
#pragma unroll
    for (int k = 0; k < VEC; k++) x[k] += y[k];
    store_f32<T, VEC>(out + i, x);
}

// out = a + b over n elements of E, vectorised where the pointers allow.
template <typename E>
static void add_launch(cudaStream_t st, E *out, const E *a, const E *b, size_t n) {
    dispatch_vec<E>(0, {out, a, b}, [&](auto vec) {   // flat: the tail goes element-wise
        constexpr int V = decltype(vec)::value;
        const size_t bulk = n / V * V;
        if (bulk)
            add_kernel<E, V><<<cdiv((long long)(bulk / V), ELT_THREADS), ELT_THREADS, 0, st>>>(
                out, a, b, bulk);
        if (bulk < n)
            add_kernel<E, 1><<<1, ELT_THREADS, 0, st>>>(out + bulk, a + bulk, b + bulk, n - bulk);
    });
}

void cuda_add(Backend *be, void *out, const void *a, const void *b, size_t n, const DropMask *b_drop) {
    if (b_drop && b_drop->p > 0.0f) {
        cuda_dropout_add(be, out, a, b, n, b_drop);
        return;
    }
    if (n == 0) return;
    dispatch_dtype(be->dtype, [&](auto tag) {
        using E = decltype(tag);
        add_launch<E>(cuda_ctx(be)->stream, (E *)out, (const E *)a, (const E *)b, n);
    });
    CUDA_CHECK_LAUNCH();
}

void cuda_add_f32(Backend *be, float *acc, const float *x, size_t n) {
    if (n == 0) return;
    add_launch<float>(cuda_ctx(be)->stream, acc, acc, x, n);
    CUDA_CHECK_LAUNCH();
}

// dst (rows, width; every dst_pitch elements) = src (fp32, every src_pitch elements) + add (the
// same layout; none when NULL); n = rows * width. One thread per VEC elements of a row (VEC
// divides width and both pitches).
template <typename T, int VEC>
__global__ void store_f32_kernel(T *dst, size_t dst_pitch, const float *src, const float *add, size_t src_pitch,
                                 size_t width, size_t n) {
    const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * VEC;
    if (i >= n) return;
    const size_t r = i / width, w = i % width;
    float v[VEC];
    load_f32<float, VEC>(v, src + r * src_pitch + w);
    if (add) {
        float a[VEC];
        load_f32<float, VEC>(a, add + r * src_pitch + w);
#pragma unroll
        for (int k = 0; k < VEC; k++) v[k] += a[k];
    }
    store_f32<T, VEC>(dst + r * dst_pitch + w, v);
}

template <typename T> __global__ void convert_to_f32_kernel(float *dst, const T *src, size_t n) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = to_f32(src[i]);
}

void cuda_store_f32(Backend *be, void *dst, size_t dst_pitch, const float *src, const float *add,
                    size_t src_pitch, size_t width, size_t rows) {
    const size_t n = width * rows;
    if (n == 0) return;
    dispatch_dtype(be->dtype, [&](auto tag) {
        using E = decltype(tag);
        const bool by4 = width % 4 == 0 && dst_pitch % 4 == 0 && src_pitch % 4 == 0 &&
                         (uintptr_t)src % 16 == 0 && (uintptr_t)add % 16 == 0 &&
                         (uintptr_t)dst % (4 * sizeof(E)) == 0;
        cudaStream_t st = cuda_ctx(be)->stream;
        if (by4)
            store_f32_kernel<E, 4><<<cdiv((long long)(n / 4), ELT_THREADS), ELT_THREADS, 0, st>>>(
                (E *)dst, dst_pitch, src, add, src_pitch, width, n);
        else
            store_f32_kernel<E, 1><<<cdiv((long long)n, ELT_THREADS), ELT_THREADS, 0, st>>>(
                (E *)dst, dst_pitch, src, add, src_pitch, width, n);
    });
    CUDA_CHECK_LAUNCH();
}

void cuda_convert_f32_to(Backend *be, void *dst, const float *src, size_t n) {
    cuda_store_f32(be, dst, n, src, NULL, n, n, 1);
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
