// Loss scaler: its initial state from precision.* (its update, scaler_update, is in
// optim/optim.h, shared with the GPU).
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
