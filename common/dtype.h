// dtype: the one element-type enum of the project (backends, attention, the optimizer, the
// collectives and safetensors files all use it), with its size and names; and the one enum
// for where memory lives and which engine computes.
#pragma once
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

// The first three are the compute dtypes (precision.dtype); the others appear in collectives
// (F64: host sums) and in safetensors files.
typedef enum {
    DTYPE_F32 = 0,
    DTYPE_BF16 = 1,
    DTYPE_F16 = 2,
    DTYPE_F64 = 3,
    DTYPE_I32 = 4,
    DTYPE_I64 = 5,
    DTYPE_U8 = 6,
    DTYPE_COUNT
} DType;

// Host memory and the CPU, or a CUDA GPU's memory and kernels.
typedef enum { DEVICE_CPU = 0, DEVICE_CUDA = 1 } Device;

size_t dtype_size(DType t);        // bytes per element; 0 for a value outside the enum
const char *dtype_name(DType t);   // "fp32", "bf16", "fp16" (precision.dtype's names), "fp64", ...
// 2^-p for p significand bits (fp32 24, bf16 8, fp16 11, fp64 53): the rounding error bound
// tolerances are derived from; 1 for the integer types.
double dtype_unit_roundoff(DType t);

#ifdef __cplusplus
}
#endif
