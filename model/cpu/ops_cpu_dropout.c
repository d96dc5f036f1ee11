// ops_cpu_dropout: the CPU backend's dropout (Backend.dropout) in fp32, alone or on the way into
// a residual add (cpu_dropout_add: the DropMask of Backend.add and add_layernorm_forward). Each
// element's keep decision depends only on (seed, offset, its index), so the result is the same
// for any thread count, and the same op on a gradient is the backward.
#include "common/check.h"
#include "model/dropout.h"
#include "model/cpu/ops_cpu.h"

// out = a + dropout(x), or dropout(x) without a (NULL), over n elements (out may alias a or x).
void cpu_dropout_add(void *out_, const void *a_, const void *x_, size_t n, const DropMask *d) {
    float *out = out_;
    const float *a = a_, *x = x_;   // (n)
    const float p = d->p;
    const uint64_t seed = d->seed, offset = d->offset + (d->offset_dev ? *d->offset_dev : 0);
    if (!(p < 1.0f)) fatal(EXIT_RUNTIME, "cpu dropout: p = %g must be below 1", (double)p);
    const uint32_t thresh = attn_dropout_threshold(p);
    const float scale = attn_dropout_scale(p);
    const long n_blk = (long)((n + 15) / 16);   // one Philox block per 16 elements
    #pragma omp parallel for schedule(static) if (n >= CPU_PAR_MIN)
    for (long b = 0; b < n_blk; b++) {
        const uint32_t keep = dropout_keep16(seed, offset, (uint64_t)b, thresh);
        const size_t e0 = (size_t)b * 16;
        for (size_t j = 0; j < 16 && e0 + j < n; j++) {
            const float v = x[e0 + j] * (keep >> j & 1 ? scale : 0.0f);   // NaN stays NaN, as in PyTorch
            out[e0 + j] = a ? a[e0 + j] + v : v;
        }
    }
}

void cpu_dropout(Backend *be, void *x, size_t n, const DropMask *d) {
    if (d && d->p > 0.0f) cpu_dropout_add(x, NULL, x, n, d);
}
