// ops_cpu: the CPU backend (fp32, OpenMP, OpenBLAS), the reference the CUDA backend is tested
// against. This file holds its memory functions, the attention dispatch and the op table; the
// layer ops live in ops_cpu_layers.c, ops_cpu_matmul.c, ops_cpu_dropout.c and ops_cpu_rope.c.
#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "model/cpu/ops_cpu.h"

typedef struct {
    void *attn_ws;          // attention scratch, grown on demand; contents never outlive a call
    size_t attn_ws_bytes;
} CpuCtx;

// Cache-line aligned so OpenMP chunks of COL_CHUNK floats never share a line across buffers.
#define CPU_ALIGN 64

static void *cpu_alloc(Backend *be, size_t bytes) {
    void *p = NULL;
    size_t n = bytes ? bytes : 1;
    if (posix_memalign(&p, CPU_ALIGN, n) != 0)
        fatal(EXIT_RUNTIME, "cpu backend: out of memory allocating %zu bytes", bytes);
    memset(p, 0, n);
    return p;
}

static void cpu_release(Backend *be, void *p) { free(p); }
static void cpu_fill_zero(Backend *be, void *p, size_t bytes) { memset(p, 0, bytes); }
static void cpu_copy(Backend *be, void *dst, const void *src, size_t bytes) {
    memmove(dst, src, bytes);
}
static void cpu_copy_2d(Backend *be, void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                        size_t width, size_t rows) {
#pragma omp parallel for schedule(static)
    for (size_t r = 0; r < rows; r++)
        memcpy((char *)dst + r * dst_pitch, (const char *)src + r * src_pitch, width);
}
static void cpu_synchronize(Backend *be) {}

static void cpu_upload_f32(Backend *be, void *dst, const float *host, size_t n) {
    memcpy(dst, host, n * sizeof(float));
}

static void cpu_download_f32(Backend *be, float *host, const void *src, size_t n) {
    memcpy(host, src, n * sizeof(float));
}

// Fills the execution fields the model leaves to the backend and validates the problem once.
static void cpu_attention_prepare(Backend *be, AttnParams *p, int backward) {
    CpuCtx *ctx = be->ctx;
    p->dtype = DTYPE_F32;
    p->stream = NULL;
    size_t need = attn_workspace_bytes(p, DEVICE_CPU);
    if (need > ctx->attn_ws_bytes) {
        free(ctx->attn_ws);
        ctx->attn_ws = cpu_alloc(be, need);
        ctx->attn_ws_bytes = need;
    }
    p->workspace = ctx->attn_ws;
    p->workspace_bytes = ctx->attn_ws_bytes;
    char err[256];
    if (attn_check(p, DEVICE_CPU, backward, err, sizeof err) != 0) fatal(EXIT_USAGE, "attention: %s", err);
}

static void cpu_attention_forward(Backend *be, AttnParams *p) {
    cpu_attention_prepare(be, p, 0);
    attn_forward_cpu(p);
}

static void cpu_attention_backward(Backend *be, AttnParams *p) {
    cpu_attention_prepare(be, p, 1);
    attn_backward_cpu(p);
}

static void cpu_attention_merge(Backend *be, const AttnParams *acc, const AttnParams *part) {
    attn_merge_cpu(acc, part);
}

static int cpu_memory(Backend *be, size_t *free_bytes, size_t *used_bytes) {
    *free_bytes = *used_bytes = 0;
    return 0;
}

static void cpu_destroy(Backend *be) {
    CpuCtx *ctx = be->ctx;
    free(ctx->attn_ws);
    free(ctx);
    free(be);
}

Backend *backend_cpu_create(void) {
    // OpenMP threads run every op, each sgemm on its own slice (see ops_cpu_matmul.c); OpenBLAS
    // spawning a second pool of threads would fight them for the cores.
    openblas_set_num_threads(1);
    Backend *be = xcalloc(1, sizeof *be);
    be->name = "cpu";
    be->dtype = DTYPE_F32;
    be->device = DEVICE_CPU;
    be->device_name = "cpu";
    be->ctx = xcalloc(1, sizeof(CpuCtx));
    be->destroy = cpu_destroy;
    be->alloc = cpu_alloc;
    be->release = cpu_release;
    be->fill_zero = cpu_fill_zero;
    be->copy = cpu_copy;
    be->copy_2d = cpu_copy_2d;
    be->upload = cpu_copy;
    be->download = cpu_copy;
    be->upload_f32 = cpu_upload_f32;
    be->download_f32 = cpu_download_f32;
    be->synchronize = cpu_synchronize;
    be->memory = cpu_memory;
    be->embed_forward = cpu_embed_forward;
    be->embed_backward = cpu_embed_backward;
    be->layernorm_forward = cpu_layernorm_forward;
    be->layernorm_backward = cpu_layernorm_backward;
    be->matmul_forward = cpu_matmul_forward;
    be->matmul_backward = cpu_matmul_backward;
    be->add = cpu_add;
    be->attention_forward = cpu_attention_forward;
    be->attention_backward = cpu_attention_backward;
    be->attention_merge = cpu_attention_merge;
    be->softmax_xent = cpu_softmax_xent;
    be->dropout = cpu_dropout;
    be->rope_forward = cpu_rope_forward;
    be->rope_backward = cpu_rope_backward;
    return be;
}
