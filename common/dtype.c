// dtype: sizes, names and unit roundoffs of the element types (common/dtype.h).
#include "common/dtype.h"

typedef struct {
    size_t size;
    const char *name;
    double unit_roundoff;
} DTypeInfo;

static const DTypeInfo INFO[DTYPE_COUNT] = {
    [DTYPE_F32] = {4, "fp32", 0x1p-24}, [DTYPE_BF16] = {2, "bf16", 0x1p-8},
    [DTYPE_F16] = {2, "fp16", 0x1p-11}, [DTYPE_F64] = {8, "fp64", 0x1p-53},
    [DTYPE_I32] = {4, "int32", 1.0},    [DTYPE_I64] = {8, "int64", 1.0},
    [DTYPE_U8] = {1, "uint8", 1.0},
};

static int valid(DType t) { return (int)t >= 0 && t < DTYPE_COUNT; }

size_t dtype_size(DType t) { return valid(t) ? INFO[t].size : 0; }
const char *dtype_name(DType t) { return valid(t) ? INFO[t].name : "unknown"; }
double dtype_unit_roundoff(DType t) { return valid(t) ? INFO[t].unit_roundoff : 1.0; }
