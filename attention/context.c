// context: AttnContext and the validated entry points of attention/attention.h (forward,
// backward, decode, the dQ accumulator's store, merge). The CPU runs the reference; CUDA runs
// through the GPU half (attention/attention_gpu.h).
#include <stdlib.h>

#include "attention/attention.h"
#include "common/check.h"
#ifdef FLASHGPT_CUDA
#include "attention/attention_gpu.h"
#endif

struct AttnContext {
    Device device;
#ifdef FLASHGPT_CUDA
    AttnGpu *gpu;   // DEVICE_CUDA only
#endif
};

AttnContext *attn_context_create(Device dev, void *stream, AttnKernel kernel, char *err, size_t errlen) {
    if (dev != DEVICE_CPU && dev != DEVICE_CUDA) {
        set_error(err, errlen, "attention: unknown device %d", (int)dev);
        return NULL;
    }
    if ((int)kernel < ATTN_KERNEL_AUTO || (int)kernel > ATTN_KERNEL_SM80) {
        set_error(err, errlen, "attention: unknown kernel family %d: use auto, sm90 or sm80", (int)kernel);
        return NULL;
    }
    AttnContext *ctx = calloc(1, sizeof *ctx);
    if (!ctx) {
        set_error(err, errlen, "attention: out of memory for a context");
        return NULL;
    }
    ctx->device = dev;
    if (dev == DEVICE_CUDA) {
#ifdef FLASHGPT_CUDA
        ctx->gpu = attn_gpu_create(stream, kernel, err, errlen);
        if (!ctx->gpu) {
            free(ctx);
            return NULL;
        }
#else
        set_error(err, errlen, "attention: this build has no CUDA kernels (nvcc was not found "
                               "when it was built)");
        free(ctx);
        return NULL;
#endif
    }
    return ctx;
}

void attn_context_destroy(AttnContext *ctx) {
    if (!ctx) return;
#ifdef FLASHGPT_CUDA
    attn_gpu_destroy(ctx->gpu);
#endif
    free(ctx);
}

static int attn_run(AttnContext *ctx, AttnParams *p, int backward, char *err, size_t errlen) {
    if (attn_check(p, ctx->device, backward, err, errlen) != 0) return -1;
#ifdef FLASHGPT_CUDA
    if (ctx->device == DEVICE_CUDA) return attn_gpu_run(ctx->gpu, p, backward, err, errlen);
#endif
    p->stream = NULL;
    if ((backward ? attn_backward_cpu(p) : attn_forward_cpu(p)) != 0)
        return set_error(err, errlen, "attention: out of memory for the cpu %s's scratch (B=%d, NH=%d, "
                                      "T_q=%d, T_k=%d%s)", backward ? "backward" : "forward", p->B,
                         p->NH, p->T_q, p->T_k,
                         p->impl == ATTN_IMPL_NAIVE ? "; naive holds T_q x T_k floats per thread: "
                                                      "impl flash needs O(T)" : "");
    return 0;
}

int attn_forward(AttnContext *ctx, AttnParams *p, char *err, size_t errlen) {
    return attn_run(ctx, p, 0, err, errlen);
}

int attn_backward(AttnContext *ctx, AttnParams *p, char *err, size_t errlen) {
    return attn_run(ctx, p, 1, err, errlen);
}

int attn_decode(AttnContext *ctx, AttnParams *p, char *err, size_t errlen) {
#ifdef FLASHGPT_CUDA
    if (ctx->device == DEVICE_CUDA) {
        if (attn_check(p, ctx->device, 0, err, errlen) != 0) return -1;
        return attn_gpu_decode(ctx->gpu, p, err, errlen);
    }
#endif
    return attn_run(ctx, p, 0, err, errlen);
}

int attn_decode_splits(const AttnContext *ctx, const AttnParams *p) {
#ifdef FLASHGPT_CUDA
    if (ctx->device == DEVICE_CUDA) return attn_gpu_decode_splits(ctx->gpu, p);
#endif
    (void)p;
    return 0;
}

int attn_backward_stream_k(const AttnContext *ctx, const AttnParams *p) {
#ifdef FLASHGPT_CUDA
    if (ctx->device == DEVICE_CUDA) return attn_gpu_backward_stream_k(ctx->gpu, p);
#endif
    (void)p;
    return 0;
}

int attn_dq_accum_store(AttnContext *ctx, const AttnParams *p, char *err, size_t errlen) {
    if (attn_check(p, ctx->device, 1, err, errlen) != 0) return -1;
    if (!p->dq_accum) return set_error(err, errlen, "attention: dq_accum_store needs dq_accum");
#ifdef FLASHGPT_CUDA
    if (ctx->device == DEVICE_CUDA) return attn_gpu_dq_accum_store(ctx->gpu, p, err, errlen);
#endif
    attn_dq_accum_store_cpu(p);
    return 0;
}

int attn_merge(AttnContext *ctx, const AttnParams *acc, const AttnParams *part, char *err,
               size_t errlen) {
    if (acc->B != part->B || acc->T_q != part->T_q || acc->NH != part->NH || acc->HS != part->HS ||
        !acc->out || !acc->lse || !part->out || !part->lse)
        return set_error(err, errlen, "attention: merge of B=%d, T_q=%d, NH=%d, HS=%d into B=%d, "
                                      "T_q=%d, NH=%d, HS=%d: the shapes must be the same and out, "
                                      "lse set", part->B, part->T_q, part->NH, part->HS, acc->B,
                         acc->T_q, acc->NH, acc->HS);
    const DType t = part->dtype;
    const int cpu = ctx->device == DEVICE_CPU;
    if (cpu ? t != DTYPE_F32 : (t != DTYPE_F32 && t != DTYPE_BF16 && t != DTYPE_F16))
        return set_error(err, errlen, "attention: merge of a part of dtype %s on %s: use fp32 on "
                                      "the cpu, fp32, bf16 or fp16 on cuda",
                         dtype_name(t), cpu ? "cpu" : "cuda");
#ifdef FLASHGPT_CUDA
    if (ctx->device == DEVICE_CUDA) return attn_gpu_merge(ctx->gpu, acc, part, err, errlen);
#endif
    attn_merge_cpu(acc, part);
    return 0;
}
