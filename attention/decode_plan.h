// decode_plan: how attn_decode's split-KV kernel (attention/decode_cuda.cu) cuts a problem:
// query rows per block, the split of the visible key range, and the workspace it needs. Plain C
// (no CUDA), so that attn_workspace_bytes counts the workspace in every build. Internal to
// attention/.
#pragma once
#include <stddef.h>

#include "attention/attention.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
    DECODE_WARPS = 4,           // warps per block, each with its own partial result
    DECODE_KEYS = 32,           // keys per warp step: one per lane
    DECODE_MIN_SPLIT = 256,     // fewest keys a split is given: two steps for each warp
    DECODE_BLOCKS_PER_SM = 8,   // blocks per multiprocessor the split count aims at
    // The most multiprocessors the split count is made for (an H200 has 132): the workspace
    // bound of attn_workspace_bytes holds on any GPU without asking which one it is.
    DECODE_MAX_SMS = 256,
};

typedef struct {
    int splits;           // key splits, >= 1; 0: the problem does not take the split kernel
    int keys_per_split;   // a multiple of DECODE_KEYS
    int k_begin, k_end;   // the keys some query row sees (the union of the rows' ranges)
    int rows;             // query rows per block: 1, 4 or 8 (the kernel's template)
    int row_chunks;       // blocks per (batch row, KV head) along the group's query rows
} DecodePlan;

// The plan of p (accepted by attn_check) on a GPU of sms multiprocessors.
DecodePlan decode_plan(const AttnParams *p, int sms);
// Workspace bytes the split kernel needs for p on any GPU and at any cache length: per split
// and query row a partial output (HS floats) and its log-sum-exp, for the most splits
// decode_plan gives with any T_k and sms. 0 when p does not take the split kernel.
size_t decode_workspace_bytes(const AttnParams *p);

#ifdef __cplusplus
}
#endif
