// Loss scaler: dynamic fp16 loss scaling (grow x2 after a window of clean steps, back off x0.5
// on overflow), a fixed scale, or none; every mode skips steps with non-finite gradients.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "optim/optim.h"

void scaler_init(LossScaler *s, const Config *c, int use_scaling) {
    memset(s, 0, sizeof *s);
    s->scale = 1.0f;
    s->window = c->precision.loss_scale_window;
    if (!use_scaling) return;
    if (strcmp(c->precision.loss_scale, "dynamic") == 0) {
        s->dynamic = 1;
        s->scale = c->precision.initial_loss_scale;
    } else {
        s->scale = strtof(c->precision.loss_scale, NULL);  // validated positive by the config
    }
}

int scaler_update(LossScaler *s, int grads_finite) {
    if (!grads_finite) {
        s->skipped++;
        s->clean_steps = 0;
        if (s->dynamic) s->scale *= 0.5f;
        return 1;
    }
    s->clean_steps++;
    if (s->dynamic && s->clean_steps >= s->window) {
        // The scale stops growing where doubling would overflow fp32 (a run that never
        // overflows fp16 would otherwise reach inf after ~100 windows).
        if (isfinite(s->scale * 2.0f)) s->scale *= 2.0f;
        s->clean_steps = 0;
    }
    return 0;
}
