// attention_gpu: the CUDA half of an AttnContext (attention/attention_cuda.cu), behind
// attention/context.c. Internal to attention/.
#pragma once
#include "attention/attention.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct AttnGpu AttnGpu;

// Reads the current device's architecture and what this binary holds for it. NULL with err set
// when `kernel` asks for a family the GPU or binary cannot run.
AttnGpu *attn_gpu_create(void *stream, AttnKernel kernel, char *err, size_t errlen);
void attn_gpu_destroy(AttnGpu *g);
// Runs p (already accepted by attn_check) on the GPU. Returns 0, or -1 with err set.
int attn_gpu_run(AttnGpu *g, AttnParams *p, int backward, char *err, size_t errlen);
// attn_decode on the GPU, on params attn_check accepted: the split-KV kernel
// (attention/decode_cuda.cu) where it applies, else attn_gpu_run's forward. Returns 0, or -1
// with err set.
int attn_gpu_decode(AttnGpu *g, AttnParams *p, char *err, size_t errlen);
// The split count attn_gpu_decode would run p with, 0 for attn_gpu_run's forward.
int attn_gpu_decode_splits(const AttnGpu *g, const AttnParams *p);
// Whether attn_gpu_run's backward would run p with the sm90 stream-K instance.
int attn_gpu_backward_stream_k(const AttnGpu *g, const AttnParams *p);
// attn_dq_accum_store on the GPU, on params attn_check accepted (dq_accum set). Returns 0, or -1
// with err set.
int attn_gpu_dq_accum_store(AttnGpu *g, const AttnParams *p, char *err, size_t errlen);
// The stream the context's work is queued on.
void *attn_gpu_stream(const AttnGpu *g);
// attn_merge on the GPU (attention/merge_cuda.cu), on params the context checked. Returns 0, or
// -1 with err set.
int attn_gpu_merge(AttnGpu *g, const AttnParams *acc, const AttnParams *part, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
