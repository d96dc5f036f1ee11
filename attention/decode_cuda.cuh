// decode_cuda: the split-KV decode attention (FlashDecoding) behind attn_decode
// (attention/decode_cuda.cu). Internal to attention/.
#pragma once
#include <stddef.h>

#include "attention/attention.h"
#include "attention/decode_plan.h"

// Queues the split kernel and the merge of the checked problem p, cut by plan d (decode_plan,
// d.splits >= 1), on p.stream; p.workspace holds decode_workspace_bytes(p). Returns 0, or -1
// with CUDA's launch error in err.
int decode_run_cuda(const AttnParams &p, const DecodePlan &d, char *err, size_t errlen);
