#include "trainer/guard.h"

#include <math.h>

#define MEAN_WEIGHT 0.1   // of the newest good step in the running mean

void guard_init(Guard *g, const Config *c, double mean) {
    g->steps = c->train.divergence_steps;
    g->factor = c->train.divergence_factor;
    g->mean = mean;
    g->streak = 0;
    g->first_step = 0;
    g->first_data = 0;
}

int guard_observe(Guard *g, long long step, const StepStats *s, int dynamic_scale,
                  uint64_t data_before) {
    const double loss = s->loss;
    const int bad = !isfinite(loss) || (s->skipped && !dynamic_scale) ||
                    (g->mean > 0 && loss > g->factor * g->mean);
    if (!bad) {
        const double mean = g->mean > 0 ? (1 - MEAN_WEIGHT) * g->mean + MEAN_WEIGHT * loss : loss;
        if (isfinite(mean) && mean >= 0) g->mean = mean;   // a huge loss must not make it inf
        g->streak = 0;
        return 0;
    }
    if (g->streak++ == 0) {
        g->first_step = step;
        g->first_data = data_before;
    }
    return g->steps > 0 && g->streak >= g->steps;
}
