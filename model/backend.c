// backend: what every backend shares: running attention through its context, and telling the
// attention module's refusals in the terms of flashgpt's config.
#include "model/backend.h"

#include "common/check.h"
#include "common/config.h"

_Static_assert(ATTN_IMPL_FLASH == 0 && ATTN_IMPL_NAIVE == 1 && ATTN_KERNEL_AUTO == 0 &&
                   ATTN_KERNEL_SM90 == 1 && ATTN_KERNEL_SM80 == 2,
               "attention.impl and attention.kernel store these values (common/config.c)");

// attention.h names its own parameters; these are the config keys behind them.
#define ATTN_KEYS_HINT                                                                          \
    "in the config: HS is model.n_embd / model.n_head, NH and NKV are model.n_head and "        \
    "model.n_kv_head, T_q and T_k are train.seq_len, window is attention.window, impl is "      \
    "attention.impl, kernel is attention.kernel, dtype is precision.dtype"

static void attention_fail(const char *err) {
    fatal(EXIT_USAGE, "%s\n  (%s)", err, ATTN_KEYS_HINT);
}

void backend_attention(Backend *be, AttnParams *p, int backward) {
    char err[ERR_LEN];
    p->dtype = be->dtype;
    const int rc = backward ? attn_backward(be->attn, p, err, sizeof err)
                            : attn_forward(be->attn, p, err, sizeof err);
    if (rc != 0) attention_fail(err);
}

void backend_attention_decode(Backend *be, AttnParams *p) {
    char err[ERR_LEN];
    p->dtype = be->dtype;
    if (attn_decode(be->attn, p, err, sizeof err) != 0) attention_fail(err);
}

void backend_attention_merge(Backend *be, const AttnParams *acc, const AttnParams *part) {
    char err[ERR_LEN];
    if (attn_merge(be->attn, acc, part, err, sizeof err) != 0) attention_fail(err);
}

void backend_attention_dq_store(Backend *be, const AttnParams *p) {
    char err[ERR_LEN];
    AttnParams a = *p;
    a.dtype = be->dtype;
    if (attn_dq_accum_store(be->attn, &a, err, sizeof err) != 0) attention_fail(err);
}

AttnContext *backend_attention_context(Device dev, void *stream, AttnKernel kernel) {
    char err[ERR_LEN];
    AttnContext *ctx = attn_context_create(dev, stream, kernel, err, sizeof err);
    if (!ctx) attention_fail(err);
    return ctx;
}
