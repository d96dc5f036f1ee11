// ops_cuda: the CUDA backend (bf16 / fp16 / fp32 chosen at run time). This file holds its
// context (stream, cuBLASLt handle, workspaces, device properties), the memory functions, the
// attention dispatch and the op table; the ops live in ops_cuda_layers.cu (embedding forward,
// LayerNorm, add, GELU, conversions, deterministic column sums), ops_cuda_embed.cu (embedding
// backward), ops_cuda_xent.cu (fused softmax cross-entropy), ops_cuda_matmul.cu (cuBLASLt) and
// ops_cuda_dropout.cu (dropout), ops_cuda_rope.cu (rotary position embedding) and
// ops_cuda_async.cu (page-locked uploads, the device loss sum, CUDA graphs).
//
// Every op is asynchronous on the context's one stream; download, download_f32 and synchronize
// wait for it. The stream is a blocking stream, so work queued on the legacy default stream
// (stream NULL, e.g. the CUDA AdamW of optim/optim_cuda.h) is ordered with it.
#include "model/cuda/cuda_common.cuh"

// cuBLASLt workspace: 32 MiB is what NVIDIA recommends for Hopper (cuBLAS docs,
// "cublasSetWorkspace").
#define LT_WORKSPACE_BYTES ((size_t)32 << 20)
// Host<->device conversions go through an fp32 staging buffer in pieces of this many elements
// (64 MiB), so loading a large model never needs a second full-size fp32 copy on the GPU.
#define STAGE_ELEMS ((size_t)1 << 24)

void *cuda_scratch(CudaCtx *ctx, size_t bytes) {
    if (bytes <= ctx->scratch_bytes) return ctx->scratch;
    CUDA_CHECK(cudaFree(ctx->scratch));
    ctx->scratch = NULL;
    CUDA_CHECK(cudaMalloc(&ctx->scratch, bytes));
    ctx->scratch_bytes = bytes;
    ctx->scratch_epoch++;
    return ctx->scratch;
}

// ---- memory ----

static void *cu_alloc(Backend *be, size_t bytes) {
    CudaCtx *ctx = cuda_ctx(be);
    void *p = NULL;
    size_t n = bytes ? bytes : 1;
    cudaError_t err = cudaMalloc(&p, n);
    if (err == cudaErrorMemoryAllocation) {
        size_t free_b = 0, total_b = 0;
        cudaGetLastError();  // clear the allocation error so later checks do not report it
        cudaMemGetInfo(&free_b, &total_b);
        fatal(EXIT_USAGE, "cuda backend: out of GPU memory allocating %.1f MiB (%.1f MiB free of "
                          "%.1f MiB on device %d): lower train.batch_size (or train.seq_len), or "
                          "set train.recompute to save activation memory",
              bytes / 1048576.0, free_b / 1048576.0, total_b / 1048576.0, ctx->device);
    }
    CUDA_CHECK(err);
    CUDA_CHECK(cudaMemsetAsync(p, 0, n, ctx->stream));
    return p;
}

static void cu_release(Backend *be, void *p) { CUDA_CHECK(cudaFree(p)); }

static void cu_fill_zero(Backend *be, void *p, size_t bytes) {
    CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, cuda_ctx(be)->stream));
}

static void cu_copy(Backend *be, void *dst, const void *src, size_t bytes) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cuda_ctx(be)->stream));
}

// copy_2d in 16-byte pieces, one per thread (i over rows x vecs pieces of a row).
__global__ void copy_2d_kernel(uint4 *dst, size_t dst_pitch, const uint4 *src, size_t src_pitch, size_t vecs,
                               size_t n) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const size_t r = i / vecs, c = i % vecs;
    dst[r * dst_pitch + c] = src[r * src_pitch + c];
}

// Rows of at least 1 KiB whose addresses and lengths are multiples of 16 bytes (the ring's K/V
// blocks) go through a copy kernel: faster than cudaMemcpy2DAsync there (docs/PERFORMANCE.md).
static void cu_copy_2d(Backend *be, void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                       size_t width, size_t rows) {
    cudaStream_t st = cuda_ctx(be)->stream;
    if (((uintptr_t)dst | (uintptr_t)src | dst_pitch | src_pitch | width) % 16 != 0 || width < 1024) {
        CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows, cudaMemcpyDeviceToDevice, st));
        return;
    }
    const size_t n = width / 16 * rows;
    if (n == 0) return;
    const int threads = 256;
    copy_2d_kernel<<<(unsigned)((n + threads - 1) / threads), threads, 0, st>>>(
        (uint4 *)dst, dst_pitch / 16, (const uint4 *)src, src_pitch / 16, width / 16, n);
    CUDA_CHECK_LAUNCH();
}

static void cu_synchronize(Backend *be) { CUDA_CHECK(cudaStreamSynchronize(cuda_ctx(be)->stream)); }

// The caller may reuse `host` as soon as this returns, so the copy is waited for.
static void cu_upload(Backend *be, void *dst, const void *host, size_t bytes) {
    CudaCtx *ctx = cuda_ctx(be);
    CUDA_CHECK(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, ctx->stream));
    CUDA_CHECK(cudaStreamSynchronize(ctx->stream));
}

static void cu_download(Backend *be, void *host, const void *src, size_t bytes) {
    CudaCtx *ctx = cuda_ctx(be);
    CUDA_CHECK(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, ctx->stream));
    CUDA_CHECK(cudaStreamSynchronize(ctx->stream));
}

// fp32 host values to and from the backend's dtype, through a device staging buffer of at most
// STAGE_ELEMS floats (converted on the GPU) unless the dtype is fp32 itself.
typedef enum { TO_DEVICE, TO_HOST } CopyDirection;

static void copy_f32(Backend *be, void *dev, float *host, size_t n, CopyDirection dir) {
    if (be->dtype == DTYPE_F32) {
        if (dir == TO_DEVICE) cu_upload(be, dev, host, n * sizeof(float));
        else cu_download(be, host, dev, n * sizeof(float));
        return;
    }
    CudaCtx *ctx = cuda_ctx(be);
    const size_t ds = dtype_size(be->dtype);
    for (size_t i0 = 0; i0 < n; i0 += STAGE_ELEMS) {
        const size_t m = n - i0 < STAGE_ELEMS ? n - i0 : STAGE_ELEMS;
        float *stage = (float *)cuda_scratch(ctx, m * sizeof(float));  // (m)
        char *d = (char *)dev + i0 * ds;
        if (dir == TO_DEVICE) {
            cu_upload(be, stage, host + i0, m * sizeof(float));
            cuda_convert_f32_to(be, d, stage, m);
        } else {
            cuda_convert_to_f32(be, stage, d, m);
            cu_download(be, host + i0, stage, m * sizeof(float));
        }
    }
}

static void cu_upload_f32(Backend *be, void *dst, const float *host, size_t n) {
    copy_f32(be, dst, (float *)host, n, TO_DEVICE);   // host is only read
}

static void cu_download_f32(Backend *be, float *host, const void *src, size_t n) {
    copy_f32(be, (void *)src, host, n, TO_HOST);      // src is only read
}

// ---- lifetime ----

static void cu_destroy(Backend *be) {
    CudaCtx *ctx = cuda_ctx(be);
    CUDA_CHECK(cudaStreamSynchronize(ctx->stream));
    attn_context_destroy(be->attn);
    for (int i = 0; i < 2; i++) CUDA_CHECK(cudaEventDestroy(ctx->fence[i]));
    CUDA_CHECK(cudaFree(ctx->scratch));
    CUDA_CHECK(cudaFree(ctx->lt_ws));
    CUBLAS_CHECK(cublasLtDestroy(ctx->lt));
    CUDA_CHECK(cudaStreamDestroy(ctx->stream));
    free(ctx);
    free(be);
}

// Bad input (no GPU, a device index that does not exist, a GPU without bf16 support) exits with
// EXIT_USAGE and says what to do, before any memory is taken.
static void cu_select_device(CudaCtx *ctx, DType dtype, int device) {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0)
        fatal(EXIT_USAGE, "cuda backend: no CUDA GPU found (%s): use --device cpu",
              err != cudaSuccess ? cudaGetErrorString(err) : "device count is 0");
    if (device < 0 || device >= count)
        fatal(EXIT_USAGE, "cuda backend: device %d does not exist (%d GPU%s found)", device, count,
              count == 1 ? "" : "s");
    CUDA_CHECK(cudaSetDevice(device));
    CUDA_CHECK(cudaGetDeviceProperties(&ctx->prop, device));
    ctx->device = device;
    // The kernels use bf16 conversions and cuBLASLt bf16 matmuls: Ampere (sm_80) or newer.
    if (ctx->prop.major < 8)
        fatal(EXIT_USAGE, "cuda backend: %s is compute capability %d.%d; flashgpt needs 8.0 "
                          "(Ampere) or newer: use --device cpu",
              ctx->prop.name, ctx->prop.major, ctx->prop.minor);
    if (dtype != DTYPE_F32 && dtype != DTYPE_BF16 && dtype != DTYPE_F16)
        fatal(EXIT_USAGE, "cuda backend: unknown dtype %d", (int)dtype);
}

int backend_cuda_device_count(void) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        cudaGetLastError();  // no driver or no device: clear the error, report none
        return 0;
    }
    return count;
}

static int cu_memory(Backend *be, size_t *free_bytes, size_t *used_bytes) {
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    *free_bytes = free_b;
    *used_bytes = total_b - free_b;
    return 1;
}

static void *cu_mark_create(Backend *be) {
    cudaEvent_t e;
    CUDA_CHECK(cudaEventCreate(&e));
    return (void *)e;
}
static void cu_mark_record(Backend *be, void *mark) {
    CUDA_CHECK(cudaEventRecord((cudaEvent_t)mark, cuda_ctx(be)->stream));
}
static double cu_mark_elapsed_ms(Backend *be, void *a, void *b) {
    float ms = 0.f;
    CUDA_CHECK(cudaEventSynchronize((cudaEvent_t)b));
    CUDA_CHECK(cudaEventElapsedTime(&ms, (cudaEvent_t)a, (cudaEvent_t)b));
    return ms;
}
static void cu_mark_free(Backend *be, void *mark) { CUDA_CHECK(cudaEventDestroy((cudaEvent_t)mark)); }

#define FILL_THREADS 256  // one thread per element

__global__ void fill_f32_kernel(float *p, float value, size_t n) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = value;
}

static void cuda_fill_f32(Backend *be, float *p, float value, size_t n) {
    if (n == 0) return;
    fill_f32_kernel<<<cdiv((long long)n, FILL_THREADS), FILL_THREADS, 0, cuda_ctx(be)->stream>>>(
        p, value, n);
    CUDA_CHECK_LAUNCH();
}

Backend *backend_cuda_create(DType dtype, int device, AttnKernel kernel) {
    CudaCtx *ctx = (CudaCtx *)xcalloc(1, sizeof *ctx);
    cu_select_device(ctx, dtype, device);
    CUDA_CHECK(cudaStreamCreate(&ctx->stream));
    CUBLAS_CHECK(cublasLtCreate(&ctx->lt));
    ctx->lt_ws_bytes = LT_WORKSPACE_BYTES;
    CUDA_CHECK(cudaMalloc(&ctx->lt_ws, ctx->lt_ws_bytes));
    for (int i = 0; i < 2; i++)
        CUDA_CHECK(cudaEventCreateWithFlags(&ctx->fence[i], cudaEventDisableTiming));

    Backend *be = (Backend *)xcalloc(1, sizeof *be);
    be->name = "cuda";
    be->dtype = dtype;
    be->device = DEVICE_CUDA;
    be->stream = (void *)ctx->stream;
    be->attn = backend_attention_context(DEVICE_CUDA, be->stream, kernel);
    be->device_name = ctx->prop.name;
    be->compute_capability = 10 * ctx->prop.major + ctx->prop.minor;
    be->ctx = ctx;
    be->destroy = cu_destroy;
    be->alloc = cu_alloc;
    be->release = cu_release;
    be->fill_zero = cu_fill_zero;
    be->copy = cu_copy;
    be->copy_2d = cu_copy_2d;
    be->upload = cu_upload;
    be->download = cu_download;
    be->upload_f32 = cu_upload_f32;
    be->download_f32 = cu_download_f32;
    be->synchronize = cu_synchronize;
    be->memory = cu_memory;
    be->embed_forward = cuda_embed_forward;
    be->embed_backward = cuda_embed_backward;
    be->layernorm_forward = cuda_layernorm_forward;
    be->layernorm_backward = cuda_layernorm_backward;
    be->matmul_forward = cuda_matmul_forward;
    be->matmul_backward = cuda_matmul_backward;
    be->add = cuda_add;
    be->add_f32 = cuda_add_f32;
    be->store_f32 = cuda_store_f32;
    be->softmax_xent = cuda_softmax_xent;
    be->dropout = cuda_dropout;
    be->rope_forward = cuda_rope_forward;
    be->rope_backward = cuda_rope_backward;
    be->fill_f32 = cuda_fill_f32;
    be->host_alloc = cuda_host_alloc;
    be->host_release = cuda_host_release;
    be->upload_async = cuda_upload_async;
    be->upload_wait = cuda_upload_wait;
    be->loss_mean_add = cuda_loss_mean_add;
    be->set_u64 = cuda_set_u64;
    be->capture_begin = cuda_capture_begin;
    be->capture_end = cuda_capture_end;
    be->graph_launch = cuda_graph_launch;
    be->graph_free = cuda_graph_free;
    be->add_layernorm_forward = cuda_add_layernorm_forward;
    be->mark_create = cu_mark_create;
    be->mark_record = cu_mark_record;
    be->mark_elapsed_ms = cu_mark_elapsed_ms;
    be->mark_free = cu_mark_free;
    return be;
}
