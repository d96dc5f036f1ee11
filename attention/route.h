// route: which implementation runs a problem attn_check accepted. One table (route.c) says, per
// feature a problem may have, which paths take it: the materialised (naive) path, the flash
// kernels' plain and feature instances, and attn_decode's split-KV kernel. attn_runs_naive
// (mask.c), the CUDA kernel choice (attention_cuda.cu) and the split-KV plan (decode_plan.c)
// all read it. Internal to attention/.
#pragma once
#include "attention/attention.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int naive;    // the materialised path (CUDA: impl naive, or fp32, which no flash kernel has)
    int extras;   // flash: the feature instance (ALiBi, dropout, soft-capping, a block mask)
    int split;    // attn_decode: the split-KV kernel (CUDA only)
} AttnRoute;

// The path of p on dev. The CPU runs every problem on its reference (all fields 0 but extras,
// which only the CUDA kernels read).
AttnRoute attn_route(const AttnParams *p, Device dev);

#ifdef __cplusplus
}
#endif
