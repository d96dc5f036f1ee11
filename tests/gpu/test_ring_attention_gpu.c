// Ring attention on the CUDA backend, several ranks in one process on one GPU
// (tests/ring_harness.h: a thread and a stream per rank): the ring's GPU parts (partial forward
// with lse over chunk pairs at explicit positions, the merge into fp32, the partial backward from
// the global lse accumulating fp32 dQ/dK/dV, the fp32 store) against the unsplit kernel on the
// whole sequence, both judged by the CPU reference (fp32) on the same rounded inputs.
//
// Tolerance: the unsplit kernel's relative L2 error e against the CPU reference measures what the
// dtype costs on this problem; the ring rounds each chunk pair's output once more before its
// fp32 merge, and sums dK/dV over chunks in fp32, so it may be at most 2 e + 2^-8 (one more
// rounding of a 16-bit value).
#define RING_HS 64
#include "../ring_harness.h"

static Backend *cuda_rank(DType dtype) { return backend_cuda_create(dtype, 0, ATTN_KERNEL_AUTO); }

static void run_ring(DType dt, int P, int c, int B, int window, int alibi, int det) {
    RingCase rc = {.P = P, .c = c, .B = B, .window = window, .alibi = alibi, .deterministic = det,
                   .make_backend = cuda_rank, .dtype = dt};
    Backend *gpu = backend_cuda_create(dt, 0, ATTN_KERNEL_AUTO), *cpu = backend_cpu_create();
    ring_inputs(&rc, gpu, 23 + (uint64_t)(P * 1000 + c));
    ring_results(&rc);
    RingWhole w[2] = {ring_whole(&rc, cpu), ring_whole(&rc, gpu)};
    const RingErr e_ring = ring_err(&rc, &w[0]);
    // The unsplit kernel against the reference: the same comparison over all of one "rank".
    RingCase whole = rc;
    whole.P = 1;
    whole.out[0] = w[1].out;
    whole.dqkv[0] = w[1].dqkv;
    whole.lse[0] = xmalloc(sizeof(float) * B * RNH * rc.T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < RNH; h++)
            for (int t = 0; t < rc.T; t++)
                whole.lse[0][((size_t)b * RNH + h) * rc.T + t] = w[1].lse_t[((size_t)b * rc.T + t) * RNH + h];
    const RingErr e_one = ring_err(&whole, &w[0]);
    free(whole.lse[0]);
    const double slack = 0x1p-8;
    printf("  %s P=%d c=%d B=%d window %d alibi %d det %d: ring/unsplit rel err out %.2e/%.2e lse %.2e/%.2e dqkv %.2e/%.2e\n",
           dtype_name(dt), P, c, B, window, alibi, det, e_ring.out, e_one.out, e_ring.lse, e_one.lse, e_ring.dqkv,
           e_one.dqkv);
    EXPECT(e_ring.out <= 2 * e_one.out + slack, "out %.3e > 2 x %.3e + 2^-8", e_ring.out, e_one.out);
    EXPECT(e_ring.lse <= 2 * e_one.lse + slack, "lse %.3e > 2 x %.3e + 2^-8", e_ring.lse, e_one.lse);
    EXPECT(e_ring.dqkv <= 2 * e_one.dqkv + slack, "dqkv %.3e > 2 x %.3e + 2^-8", e_ring.dqkv, e_one.dqkv);
    ring_free(&rc, w, 2);
    gpu->destroy(gpu);
    cpu->destroy(cpu);
}

int main(void) {
    TEST_CASE("bf16, 2 ranks, chunks of 37, causal", run_ring(DTYPE_BF16, 2, 37, 2, -1, 0, 0));
    TEST_CASE("bf16, 3 ranks, chunks of 65, causal", run_ring(DTYPE_BF16, 3, 65, 2, -1, 0, 0));
    TEST_CASE("bf16, 4 ranks, chunks of 96, causal, batch 1", run_ring(DTYPE_BF16, 4, 96, 1, -1, 0, 0));
    TEST_CASE("bf16, 4 ranks, chunks of 50, window 70", run_ring(DTYPE_BF16, 4, 50, 2, 70, 0, 0));
    TEST_CASE("bf16, 4 ranks, chunks of 40, window 20 (blocks not sent)", run_ring(DTYPE_BF16, 4, 40, 2, 20, 0, 0));
    TEST_CASE("bf16, 8 ranks, chunks of 72, causal, batch 1 (dK/dV chains)", run_ring(DTYPE_BF16, 8, 72, 1, -1, 0, 0));
    TEST_CASE("bf16, 8 ranks, chunks of 40, window 30 (chains cut)", run_ring(DTYPE_BF16, 8, 40, 2, 30, 0, 0));
    TEST_CASE("bf16, 2 ranks, chunks of 64, alibi", run_ring(DTYPE_BF16, 2, 64, 2, -1, 1, 0));
    TEST_CASE("fp16, 3 ranks, chunks of 129, causal", run_ring(DTYPE_F16, 3, 129, 2, -1, 0, 0));
    TEST_CASE("bf16, 4 ranks, chunks of 70, causal, deterministic (dQ added per call)",
              run_ring(DTYPE_BF16, 4, 70, 2, -1, 0, 1));
    TEST_CASE("bf16, 3 ranks, chunks of 50, window 60, deterministic", run_ring(DTYPE_BF16, 3, 50, 2, 60, 0, 1));
    return TEST_SUMMARY();
}
