// CUDA_OK: the GPU tests' check of a CUDA runtime call (prints the call, the error and the
// place, then exits 1: a failing call leaves nothing worth testing).
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
