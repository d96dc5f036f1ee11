// train_step: one optimizer step over grad_accum micro-batches. The cpu backend updates its fp32
// host parameters with adamw_step_cpu; the cuda backend keeps fp32 master weights and moments in
// AdamWCuda, whose fused step writes the compute-dtype parameters the model reads. Both take the
// global norm from a deterministic sum of squares that turns inf/NaN on a non-finite gradient.
#include "model/train_step.h"

#include <math.h>
#include <string.h>

#include "common/check.h"
#ifdef FLASHGPT_CUDA
#include "optim/optim_cuda.h"
#endif

struct Trainer {
    GPT *m;
    Config c;
    int on_gpu;             // cuda backend: AdamWCuda; otherwise the host AdamW
    AdamW opt;              // cpu
#ifdef FLASHGPT_CUDA
    AdamWCuda gopt;         // cuda
#endif
    OptimState view;        // checkpoint views (trainer_optim_state)
    float *host_state;      // (3, n) cuda: host copies of master, m, v behind the views
    LossScaler scaler;
    int B, T;
    int *inputs, *targets;  // (B, T) host, the current micro-batch
};

#ifdef FLASHGPT_CUDA
// The optimizer state (fp32 master weights and two moments, 12 bytes per parameter) is the last
// large allocation of a run: check it fits, so a full GPU is a message, not a crash.
static void gpu_optimizer_create(Trainer *t, const OptimSpan *spans, int n_spans) {
    Backend *be = gpt_backend(t->m);
    const size_t n = gpt_num_params(t->m);
    size_t free_b, used_b;
    backend_cuda_memory(be, &free_b, &used_b);
    const size_t need = 3 * n * sizeof(float) + ((size_t)64 << 20);  // + 64 MiB for the tables
    if (free_b < need)
        fatal(EXIT_USAGE, "cuda: the optimizer state (fp32 master weights and AdamW moments of "
                          "%zu parameters) needs %.0f MiB, but only %.0f MiB of GPU memory are "
                          "free after the model and its activations (%.0f MiB): lower "
                          "train.batch_size or set train.recompute = attn_gelu or block",
              n, need / 1048576.0, free_b / 1048576.0, used_b / 1048576.0);
    adamw_cuda_init(&t->gopt, n, spans, n_spans, &t->c, (OptimDtype)be->dtype,
                    backend_cuda_stream(be));
    // The model's current parameters become the master weights.
    float *host = xmalloc(n * sizeof(float));  // (n)
    gpt_get_params_f32(t->m, host);
    adamw_cuda_upload(&t->gopt, host, NULL, NULL);
    free(host);
}
#endif

Trainer *trainer_create(GPT *m, const Config *c) {
    Backend *be = gpt_backend(m);
    Trainer *t = xcalloc(1, sizeof *t);
    t->m = m;
    t->c = *c;
    t->on_gpu = strcmp(be->name, "cuda") == 0;
    if (!t->on_gpu && be->dtype != DTYPE_F32)
        fatal(EXIT_USAGE, "training on the %s backend needs fp32, got %s", be->name,
              dtype_name(be->dtype));
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
#ifdef FLASHGPT_CUDA
    if (t->on_gpu) gpu_optimizer_create(t, spans, n);
#endif
    if (!t->on_gpu) adamw_init(&t->opt, gpt_num_params(m), spans, n, c);
    free(spans);
    // fp16 gradients underflow without a loss scale; bf16 (fp32's exponent range) and fp32 need
    // none, but the scaler still detects non-finite steps.
    scaler_init(&t->scaler, c, be->dtype == DTYPE_F16);
    return t;
}

void trainer_free(Trainer *t) {
    if (!t) return;
#ifdef FLASHGPT_CUDA
    if (t->on_gpu) adamw_cuda_free(&t->gopt);
#endif
    if (!t->on_gpu) adamw_free(&t->opt);
    free(t->host_state);
    free(t->inputs);
    free(t->targets);
    free(t);
}

AdamW *trainer_optimizer(Trainer *t) { return t->on_gpu ? NULL : &t->opt; }
LossScaler *trainer_scaler(Trainer *t) { return &t->scaler; }

void trainer_set_weights_f32(Trainer *t, const float *host) {
    gpt_set_params_f32(t->m, host);
#ifdef FLASHGPT_CUDA
    if (t->on_gpu) adamw_cuda_upload(&t->gopt, host, NULL, NULL);
#endif
}

OptimState *trainer_optim_state(Trainer *t) {
    const size_t n = gpt_num_params(t->m);
    if (!t->on_gpu) {
        t->view = (OptimState){.n = n, .master = NULL, .m = t->opt.m, .v = t->opt.v, .t = t->opt.t};
        return &t->view;
    }
#ifdef FLASHGPT_CUDA
    if (!t->host_state) t->host_state = xmalloc(3 * n * sizeof(float));
    float *master = t->host_state, *mom = master + n, *vel = mom + n;
    adamw_cuda_download(&t->gopt, master, mom, vel);
    t->view = (OptimState){.n = n, .master = master, .m = mom, .v = vel, .t = t->gopt.t};
#endif
    return &t->view;
}

void trainer_optim_state_commit(Trainer *t) {
    if (!t->on_gpu) {
        t->opt.t = t->view.t;   // the moments were written in place
        return;
    }
#ifdef FLASHGPT_CUDA
    adamw_cuda_upload(&t->gopt, t->view.master, t->view.m, t->view.v);
    t->gopt.t = t->view.t;
    // The same round-to-nearest-even as the AdamW kernel's write: the parameters are bitwise
    // those the saving run computed with.
    gpt_set_params_f32(t->m, t->view.master);
#endif
}

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
        // Dropout masks from the step number alone: a resumed run draws the same ones.
        gpt_set_rng_step(m, (uint64_t)step * (uint64_t)accum + (uint64_t)k);
        loss_sum += gpt_forward(m, t->inputs, t->targets, t->B, t->T);
        // Each micro-batch's mean loss weighs 1/accum, so the step's gradient is that of the
        // mean over micro-batches, multiplied by the loss scale.
        gpt_backward(m, st.loss_scale / (float)accum);
    }
    st.loss = (float)(loss_sum / accum);

    void *params = gpt_params(m), *grads = gpt_grads(m);  // (n_params) backend memory, dtype
    const size_t n = gpt_num_params(m);
#ifdef FLASHGPT_CUDA
    const double sumsq = t->on_gpu ? adamw_cuda_grad_sumsq(&t->gopt, grads) : sumsq_cpu(grads, n);
#else
    const double sumsq = sumsq_cpu(grads, n);
#endif
    const double norm = sqrt(sumsq) / st.loss_scale;
    st.grad_norm = (float)norm;
    st.skipped = scaler_update(&t->scaler, isfinite(norm));
    if (st.skipped) return st;
    const float mult = grad_multiplier(norm, t->c.optim.grad_clip, st.loss_scale);
#ifdef FLASHGPT_CUDA
    if (t->on_gpu) {
        adamw_cuda_step(&t->gopt, params, grads, st.lr, mult);
        return st;
    }
#endif
    adamw_step_cpu(&t->opt, params, grads, st.lr, mult);
    return st;
}
