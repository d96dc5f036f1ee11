// Ring attention (model/ring_attention.c) in one process on the CPU backend (tests/ring_harness.h):
// every rank's output, lse and gradients (of its zigzag tokens) against one attention call over
// the whole sequence. Rings of 2, 3, 4, 6 and 8 ranks, chunks of 7, 5, 4, 3 and 33 tokens (mostly odd), causal
// with and without a sliding window (pairs neither computed nor sent: the blocks are counted),
// ALiBi, GQA; batches of 2 and 1 (where blocks of which one chunk is read travel as that
// chunk); the calls of a span kind sharing D and a dQ accumulator, and (deterministic) adding dQ
// per call. The MPI path
// is tests/test_context_parallel.py's; the CUDA one tests/gpu/test_ring_attention_gpu.c.
//
// Tolerance: the ring computes the same sums in another order (chunks merged through their
// log-sum-exp, dK/dV added over chunks), so the results differ by fp32 rounding: relative L2 at
// most 16 ulps of 2^-24 times sqrt(T) (T keys in the longest sum).
#include <omp.h>

#include "ring_harness.h"

static Backend *cpu_one_thread(DType dtype) {
    CHECK(dtype == DTYPE_F32);
    omp_set_num_threads(1);
    return backend_cpu_create();
}

static void run_ring(int P, int c, int B, int window, int alibi, int det) {
    RingCase rc = {.P = P, .c = c, .B = B, .window = window, .alibi = alibi, .deterministic = det,
                   .make_backend = cpu_one_thread};
    ring_inputs(&rc, NULL, 11 + (uint64_t)(P * 100 + c));
    const int sent = ring_results(&rc), all = 3 * P * (P - 1);
    Backend *be = backend_cpu_create();
    RingWhole w = ring_whole(&rc, be);
    be->destroy(be);
    const RingErr e = ring_err(&rc, &w);
    const double tol = 16.0 * 0x1p-24 * sqrt((double)rc.T);
    EXPECT(e.out <= tol && e.lse <= tol && e.dqkv <= tol,
           "P=%d, chunks of %d, B %d, window %d, alibi %d: rel err out %.2g, lse %.2g, dqkv %.2g > %.2g",
           P, c, B, window, alibi, e.out, e.lse, e.dqkv, tol);
    // A window shorter than a chunk: each rank needs at most its two neighbours' chunks.
    if (window >= 0 && window < c)
        EXPECT(sent < all, "P=%d, window %d < chunk %d: %d blocks sent, as many as without a window",
               P, window, c, sent);
    else
        EXPECT(window >= 0 || sent == all, "P=%d causal: %d blocks sent, expected %d", P, sent, all);
    ring_free(&rc, &w, 1);
}

int main(void) {
    TEST_CASE("2 ranks, chunks of 7, causal", run_ring(2, 7, 2, -1, 0, 0));
    TEST_CASE("3 ranks, chunks of 5, causal", run_ring(3, 5, 2, -1, 0, 0));
    TEST_CASE("4 ranks, chunks of 3, causal", run_ring(4, 3, 2, -1, 0, 0));
    TEST_CASE("4 ranks, chunks of 5, causal, batch 1", run_ring(4, 5, 1, -1, 0, 0));
    TEST_CASE("3 ranks, chunks of 5, window 4 (pairs skipped)", run_ring(3, 5, 2, 4, 0, 0));
    TEST_CASE("3 ranks, chunks of 7, window 9, batch 1", run_ring(3, 7, 1, 9, 0, 0));
    TEST_CASE("4 ranks, chunks of 7, window 9, alibi", run_ring(4, 7, 2, 9, 1, 0));
    TEST_CASE("4 ranks, chunks of 8, window 3 (blocks not sent)", run_ring(4, 8, 2, 3, 0, 0));
    TEST_CASE("8 ranks, chunks of 3, causal, batch 1 (dK/dV chains of 4 and 3 visits)",
              run_ring(8, 3, 1, -1, 0, 0));
    TEST_CASE("8 ranks, chunks of 5, causal", run_ring(8, 5, 2, -1, 0, 0));
    TEST_CASE("8 ranks, chunks of 4, window 3 (chains cut: segments back early)", run_ring(8, 4, 2, 3, 0, 0));
    TEST_CASE("6 ranks, chunks of 5, window 7, batch 1", run_ring(6, 5, 1, 7, 0, 0));
    TEST_CASE("2 ranks, chunks of 33 (tiles of 64 split), window 40", run_ring(2, 33, 2, 40, 0, 0));
    TEST_CASE("4 ranks, chunks of 5, causal, deterministic (dQ added per call)",
              run_ring(4, 5, 2, -1, 0, 1));
    TEST_CASE("3 ranks, chunks of 7, window 9, deterministic", run_ring(3, 7, 2, 9, 0, 1));
    return TEST_SUMMARY();
}
