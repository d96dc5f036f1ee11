// dtype: sizes, names and unit roundoffs of the element types a backend computes in.
#include "model/backend.h"

size_t dtype_size(DType t) {
    switch (t) {
    case DTYPE_F32: return 4;
    case DTYPE_BF16: return 2;
    case DTYPE_F16: return 2;
    }
    return 0;
}

const char *dtype_name(DType t) {
    switch (t) {
    case DTYPE_F32: return "fp32";
    case DTYPE_BF16: return "bf16";
    case DTYPE_F16: return "fp16";
    }
    return "unknown";
}

double dtype_unit_roundoff(DType t) {
    switch (t) {
    case DTYPE_F32: return 0x1p-24;
    case DTYPE_BF16: return 0x1p-8;
    case DTYPE_F16: return 0x1p-11;
    }
    return 1.0;
}
