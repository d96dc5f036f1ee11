// Minimal test harness shared by the C tests: EXPECT records a failure with file:line and goes
// on; each test binary ends with TEST_SUMMARY(), which prints "N passed, N failed" and returns
// the exit code. run_tests.sh adds these lines up.
#pragma once
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static int tl_passed, tl_failed;

#define EXPECT(cond, ...)                                                  \
    do {                                                                   \
        if (cond) {                                                        \
            tl_passed++;                                                   \
        } else {                                                           \
            tl_failed++;                                                   \
            printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);        \
            printf(__VA_ARGS__);                                           \
            printf("\n");                                                  \
        }                                                                  \
    } while (0)

// One named case: prints "ok <name>" or "FAIL <name>" depending on failures inside it.
#define TEST_CASE(name, body)                                               \
    do {                                                                    \
        int tl_before = tl_failed;                                          \
        body;                                                               \
        printf("%s %s\n", tl_failed == tl_before ? "ok  " : "FAIL", name); \
        fflush(stdout);                                                     \
    } while (0)

#define TEST_SUMMARY() (printf("%d passed, %d failed\n", tl_passed, tl_failed), tl_failed ? 1 : 0)

// Relative error ||a - b|| / ||b|| over n floats (double accumulation).
static inline double rel_err_f32(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * (double)b[i];
    }
    if (den == 0) return sqrt(num);
    return sqrt(num / den);
}
