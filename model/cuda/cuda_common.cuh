// cuda_common: what the CUDA backend's source files (model/cuda/ops_cuda*.cu) share: the error-check
// macros, the backend context, element-type traits with the run-time dtype switch, and the
// launchers each file exports to the op table in ops_cuda.cu. Not a public interface: the model
// reaches these ops only through the Backend table of backend_cuda_create.
#pragma once
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <initializer_list>
#include <type_traits>

#include "common/cuda_check.cuh"

extern "C" {
#include "common/check.h"
#include "model/backend.h"
}
#include "model/dropout.h"


// The backend's private state (Backend.ctx): no globals, everything a call needs is here.
typedef struct {
    int device;
    cudaDeviceProp prop;
    cudaStream_t stream;          // every op is asynchronous on this one stream, in program order
    cublasLtHandle_t lt;
    void *lt_ws;                  // cuBLASLt workspace (lt_ws_bytes)
    size_t lt_ws_bytes;
    void *scratch;                // op scratch (reduction partials, sort buffers, conversion
    size_t scratch_bytes;         // staging); contents never outlive one op
    uint64_t scratch_epoch;       // times scratch moved (a graph that recorded it is stale)
    cudaEvent_t fence[2];         // upload_async's fences
} CudaCtx;

static inline CudaCtx *cuda_ctx(Backend *be) { return (CudaCtx *)be->ctx; }

// Op scratch of at least `bytes`, valid until the next call. Growing frees the old buffer;
// cudaFree waits for the device, so kernels still reading it have finished.
void *cuda_scratch(CudaCtx *ctx, size_t bytes);


// Offset of the next 256-byte aligned slot after `bytes` (scratch carving).
static inline size_t align256(size_t bytes) { return (bytes + 255) & ~(size_t)255; }

// ---- element types: one template per kernel, instantiated for the three compute dtypes ----

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }

// Round-to-nearest-even conversion from fp32 (the single rounding of every op's result).
template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half from_f32<__half>(float x) {
    return __float2half_rn(x);
}

// ---- vector access: VEC consecutive elements as fp32, one 16-byte transaction when
// VEC * sizeof(T) == 16 (the caller guarantees the alignment), element by element otherwise ----

template <typename T, int VEC>
__device__ __forceinline__ void load_f32(float (&v)[VEC], const T *p) {
    if constexpr (VEC * sizeof(T) == 16) {
        const uint4 raw = *reinterpret_cast<const uint4 *>(p);
        const T *e = reinterpret_cast<const T *>(&raw);
#pragma unroll
        for (int i = 0; i < VEC; i++) v[i] = to_f32(e[i]);
    } else {
#pragma unroll
        for (int i = 0; i < VEC; i++) v[i] = to_f32(p[i]);
    }
}

template <typename T, int VEC>
__device__ __forceinline__ void store_f32(T *p, const float (&v)[VEC]) {
    if constexpr (VEC * sizeof(T) == 16) {
        uint4 raw;
        T *e = reinterpret_cast<T *>(&raw);
#pragma unroll
        for (int i = 0; i < VEC; i++) e[i] = from_f32<T>(v[i]);
        *reinterpret_cast<uint4 *>(p) = raw;
    } else if constexpr (VEC * sizeof(T) == 8) {
        uint2 raw;
        T *e = reinterpret_cast<T *>(&raw);
#pragma unroll
        for (int i = 0; i < VEC; i++) e[i] = from_f32<T>(v[i]);
        *reinterpret_cast<uint2 *>(p) = raw;
    } else {
#pragma unroll
        for (int i = 0; i < VEC; i++) p[i] = from_f32<T>(v[i]);
    }
}

// The vector width for rows of `row_len` elements of T starting at the given pointers: 16 bytes
// when every row start is 16-byte aligned, else 1 element (row_len 0: one flat range, only the
// pointers count). Calls f(std::integral_constant<int, VEC>{}) so kernels take VEC as a
// template parameter.
template <typename T, typename F>
void dispatch_vec(size_t row_len, std::initializer_list<const void *> ptrs, F &&f) {
    constexpr int W = 16 / sizeof(T);
    bool ok = (row_len * sizeof(T)) % 16 == 0;
    for (const void *p : ptrs) ok = ok && ((uintptr_t)p % 16 == 0);
    if (ok) f(std::integral_constant<int, W>{});
    else f(std::integral_constant<int, 1>{});
}

// Where the CUDA backend's run-time dtype becomes a template parameter:
//   dispatch_dtype(be->dtype, [&](auto tag) { using T = decltype(tag); launch<T>(...); });
template <typename F> void dispatch_dtype(DType dtype, F &&f) {
    switch (dtype) {
    case DTYPE_F32: f(float{}); return;
    case DTYPE_BF16: f(__nv_bfloat16{}); return;
    case DTYPE_F16: f(__half{}); return;
    }
    fatal(EXIT_RUNTIME, "cuda backend: unknown dtype %d", (int)dtype);
}

// GELU, tanh approximation as GPT-2 and the CPU backend (model/cpu/ops_cpu_matmul.c).
#define GELU_K 0.7978845608028654f  // sqrt(2 / pi)
#define GELU_A 0.044715f

__device__ __forceinline__ float gelu_f32(float x) {
    return 0.5f * x * (1.0f + tanhf(GELU_K * (x + GELU_A * x * x * x)));
}

__device__ __forceinline__ float gelu_grad_f32(float x) {
    float t = tanhf(GELU_K * (x + GELU_A * x * x * x));
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * GELU_K * (1.0f + 3.0f * GELU_A * x * x);
}

// ---- the dropout op's mask inside other ops (Backend's DropMask) ----

// A DropMask as kernels take it, by value; on == false applies nothing.
struct DropArgs {
    bool on;
    uint32_t thresh;   // attn_dropout_threshold(p)
    float scale;       // attn_dropout_scale(p)
    uint64_t seed, offset;
    const uint64_t *offset_dev;   // NULL, or added to offset when the kernel runs
};
// The kernels' form of d (ops_cuda_dropout.cu): off for NULL or p == 0; p must be below 1.
DropArgs drop_args(const DropMask *d);

// The keep bits of Philox block blk under d (bit k: element 16 blk + k).
__device__ __forceinline__ uint32_t drop_keep16(const DropArgs &d, uint64_t blk) {
    return dropout_keep16(d.seed, d.offset + (d.offset_dev ? *d.offset_dev : 0), blk, d.thresh);
}

// v, the VEC values of T at flat indices e0 .. e0 + VEC - 1 (VEC divides 16 and e0, so they
// share a Philox block), as the dropout op would leave them: times the scale when kept, 0 when
// dropped, rounded to T.
template <typename T, int VEC>
__device__ __forceinline__ void drop_apply(const DropArgs &d, size_t e0, float (&v)[VEC]) {
    if (!d.on) return;
    const uint32_t keep = drop_keep16(d, e0 / 16) >> (e0 % 16);
#pragma unroll
    for (int i = 0; i < VEC; i++)   // __fmul_rn: rounded on its own, never fused into a later add
        v[i] = to_f32(from_f32<T>(__fmul_rn(v[i], keep >> i & 1 ? d.scale : 0.0f)));
}

// ---- launchers shared between the backend's files ----

// ops_cuda_layers.cu: deterministic column sums. Adds the column sums of the (N, C) fp32
// partial table `partial` (n_chunks, C), in chunk order, into out (C) of the compute dtype.
void cuda_colsum_finish(Backend *be, void *out, const float *partial, int n_chunks, int C);
// Rows per chunk of the column-sum partial tables: each (chunk, 32-column) tile is one block.
#define COLSUM_ROWS 128
void cuda_embed_forward(Backend *be, void *out, const int *tokens, const int *pos, const void *wte,
                        const void *wpe, int B, int T, int C);
void cuda_layernorm_forward(Backend *be, void *out, float *mean, float *rstd, const void *inp,
                            const void *w, const void *b, int N, int C);
void cuda_layernorm_backward(Backend *be, void *dinp, void *dcopy, void *dw, void *db,
                             const void *dout, const void *inp, const void *w, const float *mean,
                             const float *rstd, int N, int C, const DropMask *dcopy_drop);
void cuda_add_layernorm_forward(Backend *be, void *res, void *out, float *mean, float *rstd,
                                const void *a, const void *b, const void *w, const void *bias,
                                int N, int C, const DropMask *b_drop);
void cuda_add(Backend *be, void *out, const void *a, const void *b, size_t n, const DropMask *b_drop);
void cuda_add_f32(Backend *be, float *acc, const float *x, size_t n);
void cuda_store_f32(Backend *be, void *dst, size_t dst_pitch, const float *src, const float *add,
                    size_t src_pitch, size_t width, size_t rows);
void cuda_gelu_forward(Backend *be, void *out, const void *pre, size_t n);
// dout (N, OC) *= gelu'(pre) in place when pre != NULL; dbias (OC) += column sums of the result
// when dbias != NULL.
void cuda_bias_gelu_backward(Backend *be, void *dbias, void *dout, const void *pre, int N, int OC);
void cuda_convert_f32_to(Backend *be, void *dst, const float *src, size_t n);    // f32 -> dtype
void cuda_convert_to_f32(Backend *be, float *dst, const void *src, size_t n);    // dtype -> f32

// ops_cuda_embed.cu
void cuda_embed_backward(Backend *be, void *dwte, void *dwpe, const void *dout, const int *tokens,
                         const int *pos, int B, int T, int C, int V, int P);

// ops_cuda_xent.cu
void cuda_softmax_xent(Backend *be, void *logits, float *losses, float *lse, const int *targets,
                       int N, int V, int Vp, float dscale);

// ops_cuda_matmul.cu
void cuda_matmul_forward(Backend *be, void *out, void *pre, const void *inp, const void *w,
                         const void *bias, int N, int C, int OC, Epilogue epi);
void cuda_matmul_backward(Backend *be, void *dinp, void *dw, void *dbias, void *dout,
                          const void *pre, const void *inp, const void *w, int N, int C, int OC,
                          Epilogue epi);

// ops_cuda_dropout.cu
void cuda_dropout(Backend *be, void *x, size_t n, const DropMask *d);
// out = a + (x through d's mask) over n elements (out may alias a or x); d->p > 0.
void cuda_dropout_add(Backend *be, void *out, const void *a, const void *x, size_t n, const DropMask *d);

// ops_cuda_async.cu
void *cuda_host_alloc(Backend *be, size_t bytes);
void cuda_host_release(Backend *be, void *p);
void cuda_upload_async(Backend *be, void *dst, const void *host, size_t bytes, int slot);
void cuda_upload_wait(Backend *be, int slot);
void cuda_loss_mean_add(Backend *be, double *acc, const float *losses, const int *targets, int N,
                        int n_valid);
void cuda_set_u64(Backend *be, uint64_t *p, uint64_t value);
int cuda_capture_begin(Backend *be, char *err, size_t errlen);
void *cuda_capture_end(Backend *be, char *err, size_t errlen);
int cuda_graph_launch(Backend *be, void *graph);
void cuda_graph_free(Backend *be, void *graph);

// ops_cuda_rope.cu
void cuda_rope_forward(Backend *be, void *qkv, const float *table, const int *pos, int N, int T,
                       int NH, int NKV, int HS);
void cuda_rope_backward(Backend *be, void *dqkv, const float *table, const int *pos, int N, int T,
                        int NH, int NKV, int HS);
