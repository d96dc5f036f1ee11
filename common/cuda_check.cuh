// cuda_check: the one CUDA error-check macro family of every .cu file. A failing statement is
// reported with its text, CUDA's error string, function and file:line, then the process exits
// with EXIT_RUNTIME (a runtime failure, not bad input).
#pragma once
#include <cuda_runtime.h>

extern "C" {
#include "common/check.h"
}

#define CUDA_CHECK(stmt)                                                                      \
    do {                                                                                      \
        cudaError_t cuda_err_ = (stmt);                                                       \
        if (cuda_err_ != cudaSuccess)                                                         \
            fatal(EXIT_RUNTIME, "CUDA error: %s failed: %s (%s, %s:%d)", #stmt,               \
                  cudaGetErrorString(cuda_err_), __func__, __FILE__, __LINE__);               \
    } while (0)

// After a kernel launch: reports bad launch configurations at the launch site.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
