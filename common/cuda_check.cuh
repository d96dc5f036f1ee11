// cuda_check: the CUDA and cuBLAS error-check macros of every .cu file, and cdiv. A failing statement is
// reported with its text, CUDA's error string, function and file:line, then the process exits
// with EXIT_RUNTIME (a runtime failure, not bad input).
#pragma once
#include <cublas_api.h>
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

// cuBLAS and cuBLASLt calls (both return cublasStatus_t).
#define CUBLAS_CHECK(stmt)                                                                    \
    do {                                                                                      \
        cublasStatus_t cublas_st_ = (stmt);                                                   \
        if (cublas_st_ != CUBLAS_STATUS_SUCCESS)                                              \
            fatal(EXIT_RUNTIME, "cuBLAS error: %s failed: %s (%s, %s:%d)", #stmt,             \
                  cublasGetStatusString(cublas_st_), __func__, __FILE__, __LINE__);           \
    } while (0)

// Blocks of b covering a items, in the wider of the two integer types.
template <typename A, typename B> __host__ __device__ __forceinline__ auto cdiv(A a, B b) -> decltype(a + b) {
    return (a + b - 1) / b;
}
