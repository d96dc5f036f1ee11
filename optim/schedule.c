// Learning-rate schedule: linear warmup, then cosine, linear or constant decay (optim.h gives
// the exact formula).
#include <math.h>
#include <string.h>

#include "optim/optim.h"

float lr_at(const Config *c, long long step, long long total) {
    const double lr = c->optim.lr, min_lr = c->optim.min_lr;
    const long long warmup = c->optim.warmup_steps;
    if (step < warmup) return (float)(lr * (double)(step + 1) / (double)warmup);
    if (c->optim.schedule == SCHEDULE_CONSTANT) return (float)lr;
    // Decay runs over steps warmup .. total-1 and reaches min_lr exactly at the last step; an
    // empty decay range (total - 1 <= warmup) counts as finished.
    const long long span = total - 1 - warmup;
    double progress = span > 0 ? (double)(step - warmup) / (double)span : 1.0;
    if (progress > 1.0) progress = 1.0;
    if (c->optim.schedule == SCHEDULE_LINEAR) return (float)(lr - (lr - min_lr) * progress);
    return (float)(min_lr + (lr - min_lr) * 0.5 * (1.0 + cos(M_PI * progress)));
}
