// ops_cpu: the CPU backend (fp32, OpenMP, OpenBLAS), the reference the CUDA backend is tested
// against. This file holds its memory functions, the attention dispatch and the op table; the
// layer ops live in ops_cpu_layers.c, ops_cpu_matmul.c, ops_cpu_dropout.c and ops_cpu_rope.c.
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/timer.h"
#include "model/cpu/ops_cpu.h"

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
static void cpu_add_f32(Backend *be, float *acc, const float *x, size_t n) {
    cpu_add(be, acc, acc, x, n, NULL);
}
static void cpu_store_f32(Backend *be, void *dst, size_t dst_pitch, const float *src, const float *add,
                          size_t src_pitch, size_t width, size_t rows) {
    if (!add) {
        cpu_copy_2d(be, dst, dst_pitch * sizeof(float), src, src_pitch * sizeof(float),
                    width * sizeof(float), rows);
        return;
    }
#pragma omp parallel for schedule(static)
    for (size_t r = 0; r < rows; r++)
        for (size_t w = 0; w < width; w++)
            ((float *)dst)[r * dst_pitch + w] = src[r * src_pitch + w] + add[r * src_pitch + w];
}

static void cpu_upload_f32(Backend *be, void *dst, const float *host, size_t n) {
    memcpy(dst, host, n * sizeof(float));
}

static void cpu_download_f32(Backend *be, float *host, const void *src, size_t n) {
    memcpy(host, src, n * sizeof(float));
}

static int cpu_memory(Backend *be, size_t *free_bytes, size_t *used_bytes) {
    *free_bytes = *used_bytes = 0;
    return 0;
}

// Host memory is what the CPU computes on: the "asynchronous" copy is a copy, its fences are
// passed at once, and there are no graphs.
static void cpu_upload_async(Backend *be, void *dst, const void *host, size_t bytes, int slot) {
    memcpy(dst, host, bytes);
}
static void cpu_upload_wait(Backend *be, int slot) {}

static void cpu_loss_mean_add(Backend *be, double *acc, const float *losses, const int *targets,
                              int N, int n_valid) {
    if (n_valid == 0) return;
    double sum = 0;
    for (int i = 0; i < N; i++)
        if (targets[i] >= 0) sum += losses[i];
    *acc += (float)(sum / n_valid);
}

static int cpu_capture_begin(Backend *be, char *err, size_t errlen) {
    snprintf(err, errlen, "the cpu backend has no CUDA graphs");
    return -1;
}
static void *cpu_capture_end(Backend *be, char *err, size_t errlen) {
    snprintf(err, errlen, "the cpu backend has no CUDA graphs");
    return NULL;
}
static int cpu_graph_launch(Backend *be, void *graph) { return -1; }
static void cpu_graph_free(Backend *be, void *graph) {}

static void *cpu_mark_create(Backend *be) { return xcalloc(1, sizeof(double)); }
static void cpu_mark_record(Backend *be, void *mark) { *(double *)mark = now_seconds(); }
static double cpu_mark_elapsed_ms(Backend *be, void *a, void *b) {
    return 1e3 * (*(const double *)b - *(const double *)a);
}
static void cpu_mark_free(Backend *be, void *mark) { free(mark); }

static void cpu_destroy(Backend *be) {
    attn_context_destroy(be->attn);
    free(be);
}

static void cpu_fill_f32(Backend *be, float *p, float value, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = value;
}

static void cpu_set_u64(Backend *be, uint64_t *p, uint64_t value) { *p = value; }

Backend *backend_cpu_create(void) {
    // OpenMP threads run every op, each sgemm on its own slice (see ops_cpu_matmul.c); OpenBLAS
    // spawning a second pool of threads would fight them for the cores.
    openblas_set_num_threads(1);
    Backend *be = xcalloc(1, sizeof *be);
    be->name = "cpu";
    be->dtype = DTYPE_F32;
    be->device = DEVICE_CPU;
    be->device_name = "cpu";
    be->attn = backend_attention_context(DEVICE_CPU, NULL, ATTN_KERNEL_AUTO);
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
    be->add_f32 = cpu_add_f32;
    be->store_f32 = cpu_store_f32;
    be->softmax_xent = cpu_softmax_xent;
    be->dropout = cpu_dropout;
    be->rope_forward = cpu_rope_forward;
    be->rope_backward = cpu_rope_backward;
    be->fill_f32 = cpu_fill_f32;
    be->host_alloc = cpu_alloc;
    be->host_release = cpu_release;
    be->upload_async = cpu_upload_async;
    be->upload_wait = cpu_upload_wait;
    be->loss_mean_add = cpu_loss_mean_add;
    be->set_u64 = cpu_set_u64;
    be->capture_begin = cpu_capture_begin;
    be->capture_end = cpu_capture_end;
    be->graph_launch = cpu_graph_launch;
    be->graph_free = cpu_graph_free;
    be->add_layernorm_forward = cpu_add_layernorm_forward;
    be->mark_create = cpu_mark_create;
    be->mark_record = cpu_mark_record;
    be->mark_elapsed_ms = cpu_mark_elapsed_ms;
    be->mark_free = cpu_mark_free;
    return be;
}
