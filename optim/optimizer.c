// optimizer: the Optimizer interface (optim/optim.h) over the host AdamW, and the choice of the
// implementation for a device.
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "optim/optim.h"
#ifdef FLASHGPT_CUDA
#include "optim/optim_cuda.h"
#endif

// The host optimizer's state: AdamW's moments and the step count.
typedef struct {
    AdamW a;
    long long t;   // completed (non-skipped) steps
} HostAdamW;

static AdamW *host_adamw(Optimizer *o) { return &((HostAdamW *)o->ctx)->a; }

static void host_destroy(Optimizer *o) {
    adamw_free(host_adamw(o));
    free(o->ctx);
    free(o);
}

static double host_grad_sumsq(Optimizer *o, const void *grads) { return sumsq_cpu(grads, o->n); }

static void host_step(Optimizer *o, void *params, const void *grads, float lr, float grad_mult) {
    HostAdamW *h = o->ctx;
    adamw_step_cpu(&h->a, params, grads, ++h->t, lr, grad_mult);
}

static long long host_get_t(Optimizer *o) { return ((HostAdamW *)o->ctx)->t; }
static void host_set_t(Optimizer *o, long long t) { ((HostAdamW *)o->ctx)->t = t; }

static void host_get_state(Optimizer *o, float *master, float *m, float *v) {
    const AdamW *a = host_adamw(o);
    if (m) memcpy(m, a->m, o->n * sizeof(float));
    if (v) memcpy(v, a->v, o->n * sizeof(float));
}

static void host_set_state(Optimizer *o, const float *master, const float *m, const float *v) {
    AdamW *a = host_adamw(o);
    if (m) memcpy(a->m, m, o->n * sizeof(float));
    if (v) memcpy(a->v, v, o->n * sizeof(float));
}

static Optimizer *host_create(DType dtype, size_t n, const OptimSpan *spans, int n_spans,
                              const Config *c) {
    if (dtype != DTYPE_F32)
        fatal(EXIT_USAGE, "the CPU optimizer updates fp32 parameters, got %s: set "
                          "precision.dtype = fp32 on the cpu backend", dtype_name(dtype));
    Optimizer *o = xcalloc(1, sizeof *o);
    HostAdamW *h = xcalloc(1, sizeof *h);
    adamw_init(&h->a, n, spans, n_spans, c);
    *o = (Optimizer){.device = DEVICE_CPU, .n = n, .ctx = h, .destroy = host_destroy,
                     .grad_sumsq = host_grad_sumsq, .step = host_step, .get_t = host_get_t,
                     .set_t = host_set_t, .get_state = host_get_state,
                     .set_state = host_set_state};
    return o;
}

Optimizer *optimizer_create(Device device, DType dtype, void *stream, size_t n,
                            const OptimSpan *spans, int n_spans, const Config *c) {
    if (device == DEVICE_CPU) return host_create(dtype, n, spans, n_spans, c);
#ifdef FLASHGPT_CUDA
    return adamw_cuda_optimizer_create(n, spans, n_spans, c, dtype, stream);
#else
    fatal(EXIT_USAGE, "this build has no CUDA optimizer: rebuild with nvcc found, or use --device cpu");
#endif
}

// fp32 master weights and two moments per element; the chunk table and the sum-of-squares
// partials are small beside them, and 64 MiB covers them with room.
size_t optimizer_device_bytes(Device device, size_t n) {
    return device == DEVICE_CPU ? 0 : 3 * n * sizeof(float) + ((size_t)64 << 20);
}
