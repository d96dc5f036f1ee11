// decode_cuda: the split-KV decode attention (FlashDecoding) behind attn_decode
// (attention/decode_cuda.cu). Internal to attention/.
#pragma once
#include <stddef.h>

#include "attention/attention.h"

// Key splits the split-KV kernel runs the checked problem p with on a GPU of sms
// multiprocessors, or 0 when p is not one it takes (attention.h, attn_decode).
int decode_splits(const AttnParams &p, int sms);
// Workspace bytes it needs on that GPU with any cache length: per split and query row a partial
// output (HS floats) and its log-sum-exp.
size_t decode_workspace_bytes(const AttnParams &p, int sms);
// Queues the split kernel and the merge on p.stream; p.workspace holds
// decode_workspace_bytes(p, sms). Returns 0, or -1 with CUDA's launch error in err.
int decode_run_cuda(const AttnParams &p, int splits, char *err, size_t errlen);
