// The global gradient sum of squares on the host (grad_multiplier is in optim/optim.h).
#include <math.h>

#include "common/check.h"
#include "optim/optim.h"

// Fixed-size blocks summed in a fixed order: the result does not depend on the thread count,
// so a resumed run reproduces the norm (and everything after it) bitwise.
enum { SUMSQ_BLOCK = 1 << 16 };

double sumsq_cpu(const float *x, size_t n) {
    const size_t nblocks = (n + SUMSQ_BLOCK - 1) / SUMSQ_BLOCK;
    double *partial = xcalloc(nblocks ? nblocks : 1, sizeof(double));  // (nblocks)
#pragma omp parallel for schedule(static)
    for (size_t b = 0; b < nblocks; b++) {
        const size_t end = (b + 1) * SUMSQ_BLOCK < n ? (b + 1) * SUMSQ_BLOCK : n;
        double s = 0;
        for (size_t i = b * SUMSQ_BLOCK; i < end; i++) s += (double)x[i] * (double)x[i];
        partial[b] = s;
    }
    // A non-finite element makes its square inf or NaN, which survives the sum (squares are
    // never negative, so inf cannot cancel): the caller tests the result with isfinite().
    double total = 0;
    for (size_t b = 0; b < nblocks; b++) total += partial[b];
    free(partial);
    return total;
}
