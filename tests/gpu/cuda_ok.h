// cuda_ok: what the GPU tests share: CUDA_OK, the check of a CUDA runtime call (prints the call,
// the error and the place, then exits 1: a failing call leaves nothing worth testing), and
// cuda_device_present.
#pragma once
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CUDA_OK(stmt)                                                                             \
    do {                                                                                          \
        cudaError_t e_ = (stmt);                                                                  \
        if (e_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "CUDA error: %s: %s (%s:%d)\n", #stmt, cudaGetErrorString(e_),        \
                    __FILE__, __LINE__);                                                          \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

// Whether this machine has a CUDA device; without one, prints the summary line of a suite that
// had nothing to run.
static inline int cuda_device_present(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0) return 1;
    printf("no CUDA device: skipped\n0 passed, 0 failed\n");
    return 0;
}
