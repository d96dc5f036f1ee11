// AdamW on the CPU, fp32, in the order torch.optim.AdamW (single-tensor path) computes it, so
// the oracle tests can compare step by step.
#include <math.h>
#include <string.h>

#include "common/check.h"
#include "optim/optim.h"

// Spans shorter than this (biases, LayerNorm) update on one thread: a parallel region costs
// more than their few thousand multiply-adds.
enum { ADAMW_PARALLEL_MIN = 1 << 14 };

void adamw_init(AdamW *opt, size_t n, const OptimSpan *spans, int n_spans, const Config *c) {
    memset(opt, 0, sizeof *opt);
    opt->n = n;
    opt->m = xcalloc(n, sizeof(float));  // (n)
    opt->v = xcalloc(n, sizeof(float));  // (n)
    opt->spans = xmalloc((size_t)n_spans * sizeof(OptimSpan));
    memcpy(opt->spans, spans, (size_t)n_spans * sizeof(OptimSpan));
    opt->n_spans = n_spans;
    for (int i = 0; i < n_spans; i++) CHECK(spans[i].offset + spans[i].n <= n);
    opt->beta1 = c->optim.beta1;
    opt->beta2 = c->optim.beta2;
    opt->eps = c->optim.eps;
    opt->weight_decay = c->optim.weight_decay;
}

void adamw_free(AdamW *opt) {
    free(opt->m);
    free(opt->v);
    free(opt->spans);
    memset(opt, 0, sizeof *opt);
}

void adamw_step_cpu(AdamW *opt, float *params, const float *grads, long long t, float lr,
                    float grad_mult) {
    const float beta1 = opt->beta1, beta2 = opt->beta2, eps = opt->eps;
    // Bias corrections in double, as torch computes them from Python floats.
    const double bc1 = 1.0 - pow(beta1, (double)t);
    const float step_size = (float)((double)lr / bc1);
    const float bc2_sqrt = (float)sqrt(1.0 - pow(beta2, (double)t));
    for (int s = 0; s < opt->n_spans; s++) {
        const OptimSpan sp = opt->spans[s];
        const float decay = sp.decay ? (float)(1.0 - (double)lr * opt->weight_decay) : 1.0f;
        float *p = params + sp.offset, *m = opt->m + sp.offset, *v = opt->v + sp.offset;
        const float *g = grads + sp.offset;
#pragma omp parallel for schedule(static) if (sp.n >= ADAMW_PARALLEL_MIN)
        for (size_t i = 0; i < sp.n; i++) {
            const float gi = g[i] * grad_mult;
            const float pi = p[i] * decay;
            const float mi = beta1 * m[i] + (1.0f - beta1) * gi;
            const float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
            m[i] = mi;
            v[i] = vi;
            p[i] = pi - step_size * (mi / (sqrtf(vi) / bc2_sqrt + eps));
        }
    }
}
