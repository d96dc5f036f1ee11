// cuda_check: the CUDA and cuBLAS error-check macros of every .cu file, and cdiv. A failing statement is
// reported with its text, CUDA's error string, function and file:line, then the process exits
// with EXIT_RUNTIME (a runtime failure, not bad input).
#pragma once
#include <cublas_api.h>
#include <cuda_runtime.h>

extern "C" {
#include "common/check.h"
}

// The family's one body: stmt returns a status of type T, ok is success, to_string names a
// status and lib the library in the message; text is the statement as written (#stmt of the
// macro the caller used, so macros inside it are shown unexpanded).
#define STATUS_CHECK_(T, ok, to_string, lib, stmt, text)                                      \
    do {                                                                                      \
        T status_ = (stmt);                                                                   \
        if (status_ != (ok))                                                                  \
            fatal(EXIT_RUNTIME, lib " error: %s failed: %s (%s, %s:%d)", text,                \
                  to_string(status_), __func__, __FILE__, __LINE__);                          \
    } while (0)

#define CUDA_CHECK(stmt)                                                                      \
    STATUS_CHECK_(cudaError_t, cudaSuccess, cudaGetErrorString, "CUDA", stmt, #stmt)

// After a kernel launch: reports bad launch configurations at the launch site.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

// cuBLAS and cuBLASLt calls (both return cublasStatus_t).
#define CUBLAS_CHECK(stmt)                                                                    \
    STATUS_CHECK_(cublasStatus_t, CUBLAS_STATUS_SUCCESS, cublasGetStatusString, "cuBLAS", stmt,   \
                  #stmt)

// Blocks of b covering a items, in the wider of the two integer types.
template <typename A, typename B> __host__ __device__ __forceinline__ auto cdiv(A a, B b) -> decltype(a + b) {
    return (a + b - 1) / b;
}
