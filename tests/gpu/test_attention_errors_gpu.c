// GPU attention errors: a CUDA launch failure inside the flash kernels' launchers (flash_launch,
// the backward's helpers) comes back as attn_forward's and attn_backward's -1 with CUDA's
// message; the process keeps running and the same context serves the next, valid, call. The
// failure is a grid CUDA cannot launch: the sm80 kernels put the batch on the grid's z axis,
// whose limit is 65535 blocks, so B = 65536 rows of one token each cannot run there.
//
// Usage: test_attention_errors_gpu [--quick]   (--quick, for compute-sanitizer, which counts the
// intended launch failure as an API error: only the valid calls)
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

#include "attention/attention.h"
#include "common/check.h"
#include "tests/testlib.h"
#include "tests/gpu/cuda_ok.h"

enum { NH = 1, HS = 64, BIG_B = 65536 };

typedef struct {
    void *qkv, *out, *dqkv, *dout;
    float *lse;
} Buffers;

// Zeroed bf16 buffers of a (B, 1, 3 NH HS) fused QKV problem and its gradients.
static Buffers buffers(int B) {
    Buffers b;
    const size_t qkv = (size_t)B * 3 * NH * HS * 2, out = (size_t)B * NH * HS * 2;
    CUDA_OK(cudaMalloc(&b.qkv, qkv));
    CUDA_OK(cudaMalloc(&b.dqkv, qkv));
    CUDA_OK(cudaMalloc(&b.out, out));
    CUDA_OK(cudaMalloc(&b.dout, out));
    CUDA_OK(cudaMalloc((void **)&b.lse, (size_t)B * NH * sizeof(float)));
    CUDA_OK(cudaMemset(b.qkv, 0, qkv));
    CUDA_OK(cudaMemset(b.out, 0, out));
    CUDA_OK(cudaMemset(b.dout, 0, out));
    CUDA_OK(cudaMemset(b.lse, 0, (size_t)B * NH * sizeof(float)));
    return b;
}

static void buffers_free(Buffers *b) {
    cudaFree(b->qkv);
    cudaFree(b->dqkv);
    cudaFree(b->out);
    cudaFree(b->dout);
    cudaFree(b->lse);
}

static AttnParams params(const Buffers *b, int B) {
    AttnParams p;
    memset(&p, 0, sizeof p);
    attn_fused_qkv(&p, b->qkv, b->out, B, 1, NH, NH, HS, 2);
    attn_fused_qkv_grads(&p, b->dqkv, b->dout, 2);
    p.lse = b->lse;
    p.causal = 1;
    p.window_left = p.window_right = -1;
    p.dtype = DTYPE_BF16;
    p.impl = ATTN_IMPL_FLASH;
    return p;
}

// A valid forward and backward on ctx succeed and the device is healthy after them.
static void expect_valid_calls(AttnContext *ctx, const char *when) {
    Buffers b = buffers(2);
    AttnParams p = params(&b, 2);
    char err[ERR_LEN] = "";
    EXPECT(attn_forward(ctx, &p, err, sizeof err) == 0, "%s: forward: %s", when, err);
    EXPECT(attn_backward(ctx, &p, err, sizeof err) == 0, "%s: backward: %s", when, err);
    EXPECT(cudaDeviceSynchronize() == cudaSuccess, "%s: the device is in an error state", when);
    buffers_free(&b);
}

static void test_launch_failure_is_returned(AttnContext *ctx) {
    Buffers b = buffers(BIG_B);
    AttnParams p = params(&b, BIG_B);
    char err[ERR_LEN] = "";
    EXPECT(attn_forward(ctx, &p, err, sizeof err) == -1 && strstr(err, "launch failed"),
           "forward of a grid too large: expected -1 naming the launch, got '%s'", err);
    printf("  forward: %s\n", err);
    err[0] = '\0';
    EXPECT(attn_backward(ctx, &p, err, sizeof err) == -1 && strstr(err, "launch failed"),
           "backward of a grid too large: expected -1 naming the launch, got '%s'", err);
    printf("  backward: %s\n", err);
    EXPECT(cudaGetLastError() == cudaSuccess, "CUDA's error state is cleared after the failures");
    buffers_free(&b);
    expect_valid_calls(ctx, "after the failures");
}

int main(int argc, char **argv) {
    const int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    if (!cuda_device_present()) return 0;
    char err[ERR_LEN];
    AttnContext *ctx = attn_context_create(DEVICE_CUDA, NULL, ATTN_KERNEL_SM80, err, sizeof err);
    CHECK(ctx);
    TEST_CASE("valid calls on the sm80 family", expect_valid_calls(ctx, "before"));
    if (!quick)
        TEST_CASE("a launch failure returns -1 with CUDA's message, and the context serves the next call",
                  test_launch_failure_is_returned(ctx));
    attn_context_destroy(ctx);
    return TEST_SUMMARY();
}
