// train_step: one optimizer step over grad_accum micro-batches on the CPU backend (fp32 host
// parameters and gradients). The CUDA path arrives with the CUDA AdamW in a later issue.
#include "model/train_step.h"

#include <math.h>
#include <string.h>

#include "common/check.h"

struct Trainer {
    GPT *m;
    Config c;
    AdamW opt;
    LossScaler scaler;
    int B, T;
    int *inputs, *targets;  // (B, T) host, the current micro-batch
};

Trainer *trainer_create(GPT *m, const Config *c) {
    Backend *be = gpt_backend(m);
    if (strcmp(be->name, "cpu") != 0 || be->dtype != DTYPE_F32)
        fatal(EXIT_USAGE, "training on the %s backend (%s) is not implemented yet: use --device cpu",
              be->name, dtype_name(be->dtype));
    Trainer *t = xcalloc(1, sizeof *t);
    t->m = m;
    t->c = *c;
    t->B = c->train.batch_size;
    t->T = c->train.seq_len;
    t->inputs = xmalloc((size_t)t->B * t->T * sizeof(int));
    t->targets = xmalloc((size_t)t->B * t->T * sizeof(int));
    // One optimizer span per parameter tensor; the model decides which ones decay.
    const int n = gpt_num_tensors(m);
    OptimSpan *spans = xmalloc((size_t)n * sizeof(OptimSpan));
    for (int i = 0; i < n; i++) {
        const ParamTensor *p = gpt_tensor(m, i);
        spans[i] = (OptimSpan){.offset = p->offset, .n = p->numel, .decay = p->decay};
    }
    adamw_init(&t->opt, gpt_num_params(m), spans, n, c);
    free(spans);
    // fp32 gradients cannot underflow the way fp16 ones do: no scaling, but the scaler still
    // detects non-finite steps.
    scaler_init(&t->scaler, c, 0);
    return t;
}

void trainer_free(Trainer *t) {
    if (!t) return;
    adamw_free(&t->opt);
    free(t->inputs);
    free(t->targets);
    free(t);
}

AdamW *trainer_optimizer(Trainer *t) { return &t->opt; }
LossScaler *trainer_scaler(Trainer *t) { return &t->scaler; }

StepStats trainer_step(Trainer *t, long long step, NextBatchFn next, void *ctx) {
    GPT *m = t->m;
    const int accum = t->c.train.grad_accum;
    StepStats st;
    memset(&st, 0, sizeof st);
    st.loss_scale = t->scaler.scale;
    st.lr = lr_at(&t->c, step, t->c.train.steps);

    gpt_zero_grad(m);
    double loss_sum = 0;
    for (int k = 0; k < accum; k++) {
        next(ctx, t->inputs, t->targets);
        loss_sum += gpt_forward(m, t->inputs, t->targets, t->B, t->T);
        // Each micro-batch's mean loss weighs 1/accum, so the step's gradient is that of the
        // mean over micro-batches, multiplied by the loss scale.
        gpt_backward(m, st.loss_scale / (float)accum);
    }
    st.loss = (float)(loss_sum / accum);

    float *params = gpt_params(m), *grads = gpt_grads(m);  // (n_params) host fp32 on the cpu backend
    const size_t n = gpt_num_params(m);
    const double norm = sqrt(sumsq_cpu(grads, n)) / st.loss_scale;
    st.grad_norm = (float)norm;
    st.skipped = scaler_update(&t->scaler, isfinite(norm));
    if (st.skipped) return st;
    const float mult = grad_multiplier(norm, t->c.optim.grad_clip, st.loss_scale);
    adamw_step_cpu(&t->opt, params, grads, st.lr, mult);
    return st;
}
