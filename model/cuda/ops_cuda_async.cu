// ops_cuda_async: what a training step without host waits needs from the CUDA backend:
// page-locked host memory and asynchronous uploads behind two fences, the device sum of a
// micro-batch's losses, the write of a per-step number a graph reads, and CUDA graphs (capture
// of the stream's ops, replay).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/cuda/cuda_common.cuh"

// One block sums a micro-batch's losses: each thread a strided share in double, then a fixed
// tree, so the result never depends on timing.
#define LOSS_THREADS 1024

void *cuda_host_alloc(Backend *be, size_t bytes) {
    void *p = NULL;
    const size_t n = bytes ? bytes : 1;
    if (cudaMallocHost(&p, n) != cudaSuccess) {
        cudaGetLastError();
        fatal(EXIT_RUNTIME, "cuda backend: cannot allocate %zu bytes of page-locked host memory", n);
    }
    memset(p, 0, n);
    return p;
}

void cuda_host_release(Backend *be, void *p) { CUDA_CHECK(cudaFreeHost(p)); }

void cuda_upload_async(Backend *be, void *dst, const void *host, size_t bytes, int slot) {
    CudaCtx *ctx = cuda_ctx(be);
    CHECK(slot == 0 || slot == 1);
    CUDA_CHECK(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, ctx->stream));
    CUDA_CHECK(cudaEventRecord(ctx->fence[slot], ctx->stream));
}

void cuda_upload_wait(Backend *be, int slot) {
    CHECK(slot == 0 || slot == 1);
    CUDA_CHECK(cudaEventSynchronize(cuda_ctx(be)->fence[slot]));
}

__global__ void loss_mean_add_kernel(double *acc, const float *losses, const int *targets, int N,
                                     int n_valid) {
    __shared__ double sh[LOSS_THREADS];
    double s = 0.0;
    for (int i = threadIdx.x; i < N; i += LOSS_THREADS)
        if (targets[i] >= 0) s += (double)losses[i];
    sh[threadIdx.x] = s;
    __syncthreads();
    for (int o = LOSS_THREADS / 2; o > 0; o >>= 1) {
        if (threadIdx.x < o) sh[threadIdx.x] += sh[threadIdx.x + o];
        __syncthreads();
    }
    if (threadIdx.x == 0) *acc += (double)(float)(sh[0] / (double)n_valid);
}

void cuda_loss_mean_add(Backend *be, double *acc, const float *losses, const int *targets, int N,
                        int n_valid) {
    if (n_valid == 0) return;
    loss_mean_add_kernel<<<1, LOSS_THREADS, 0, cuda_ctx(be)->stream>>>(acc, losses, targets, N,
                                                                       n_valid);
    CUDA_CHECK(cudaGetLastError());
}

// The value travels as the kernel's argument, so the host needs no memory that outlives the call.
__global__ void set_u64_kernel(uint64_t *p, uint64_t value) { *p = value; }

void cuda_set_u64(Backend *be, uint64_t *p, uint64_t value) {
    set_u64_kernel<<<1, 1, 0, cuda_ctx(be)->stream>>>(p, value);
    CUDA_CHECK(cudaGetLastError());
}

// A captured step and the scratch it recorded: the op scratch grows on demand (cuda_scratch),
// and a graph whose scratch has moved since must be captured again.
typedef struct {
    cudaGraphExec_t exec;
    uint64_t scratch_epoch;
} CudaGraph;

// Thread-local capture: a call of this thread that would wait for the stream (a synchronising
// copy, a cudaFree) fails instead of silently breaking the graph.
int cuda_capture_begin(Backend *be, char *err, size_t errlen) {
    const cudaError_t e =
        cudaStreamBeginCapture(cuda_ctx(be)->stream, cudaStreamCaptureModeThreadLocal);
    if (e == cudaSuccess) return 0;
    cudaGetLastError();
    snprintf(err, errlen, "cuda backend: cannot start a graph capture: %s", cudaGetErrorString(e));
    return -1;
}

void *cuda_capture_end(Backend *be, char *err, size_t errlen) {
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(cuda_ctx(be)->stream, &graph);
    cudaGraphExec_t exec = NULL;
    if (e == cudaSuccess) e = cudaGraphInstantiate(&exec, graph, 0);
    if (graph) CUDA_CHECK(cudaGraphDestroy(graph));
    if (e == cudaSuccess) {
        CudaGraph *g = (CudaGraph *)xcalloc(1, sizeof *g);
        g->exec = exec;
        g->scratch_epoch = cuda_ctx(be)->scratch_epoch;
        return g;
    }
    cudaGetLastError();
    snprintf(err, errlen, "cuda backend: the captured step does not make a graph: %s",
             cudaGetErrorString(e));
    return NULL;
}

int cuda_graph_launch(Backend *be, void *graph) {
    const CudaGraph *g = (const CudaGraph *)graph;
    if (g->scratch_epoch != cuda_ctx(be)->scratch_epoch) return -1;
    CUDA_CHECK(cudaGraphLaunch(g->exec, cuda_ctx(be)->stream));
    return 0;
}

void cuda_graph_free(Backend *be, void *graph) {
    CudaGraph *g = (CudaGraph *)graph;
    if (!g) return;
    CUDA_CHECK(cudaGraphExecDestroy(g->exec));
    free(g);
}
