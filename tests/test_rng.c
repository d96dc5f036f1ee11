// rng: rng_normal_fill gives the values of rng_normal drawn one by one, bit for bit and in the
// same order, and leaves the generator where they leave it: over lengths around its chunk of
// 65,536 draws and its threading threshold, with and without a scale, on 1, 2 and 4 threads.
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/rng.h"
#include "tests/testlib.h"

static void fill_matches(size_t n, float scale, int threads) {
    omp_set_num_threads(threads);
    Rng a, b;
    rng_seed(&a, 1337 + n);
    b = a;
    float *want = xmalloc((n + 1) * sizeof *want), *got = xmalloc((n + 1) * sizeof *got);
    for (size_t i = 0; i < n; i++) want[i] = scale * rng_normal(&a);
    got[n] = want[n] = 12345.0f;  // a sentinel past the end
    rng_normal_fill(&b, got, n, scale);
    EXPECT(memcmp(got, want, (n + 1) * sizeof *got) == 0, "n %zu, scale %g, %d threads: values differ", n,
           scale, threads);
    EXPECT(memcmp(&a, &b, sizeof a) == 0, "n %zu: the generator's state differs", n);
    EXPECT(rng_u64(&a) == rng_u64(&b), "n %zu: the next draw differs", n);
    free(want);
    free(got);
}

static void fill_is_normal(void) {
    // The draws are N(0, 1): mean and variance of 2^20 of them within 5 standard errors.
    const size_t n = 1 << 20;
    float *x = xmalloc(n * sizeof *x);
    Rng r;
    rng_seed(&r, 7);
    rng_normal_fill(&r, x, n, 1.0f);
    double s = 0, s2 = 0;
    for (size_t i = 0; i < n; i++) s += x[i], s2 += (double)x[i] * x[i];
    const double mean = s / n, var = s2 / n - mean * mean;
    EXPECT(fabs(mean) < 5.0 / sqrt((double)n), "mean %g", mean);
    EXPECT(fabs(var - 1.0) < 5.0 * sqrt(2.0 / n), "variance %g", var);
    free(x);
}

int main(void) {
    const size_t lengths[] = {0, 1, 4095, 4096, 65535, 65536, 65537, 200003};
    for (size_t i = 0; i < sizeof lengths / sizeof *lengths; i++)
        for (int t = 1; t <= 4; t *= 2) {
            char name[96];
            snprintf(name, sizeof name, "fill of %zu, %d threads", lengths[i], t);
            TEST_CASE(name, fill_matches(lengths[i], i % 2 ? 0.02f : 1.0f, t));
        }
    TEST_CASE("fill draws N(0, 1)", fill_is_normal());
    return TEST_SUMMARY();
}
