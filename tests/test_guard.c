// guard: the divergence guard's decisions (trainer/guard.h). A streak of divergence_steps bad
// steps fires it, and a good step resets the streak; non-finite losses are bad, non-finite
// gradients are bad unless fp16's dynamic loss scale explains them, a loss above factor x the
// running mean is a spike; the running mean follows good steps only; the first step and data
// position of the streak are kept for the skip; an off guard never fires.
#include <math.h>
#include <string.h>

#include "common/config.h"
#include "trainer/guard.h"
#include "tests/testlib.h"

static Guard make(int steps, double factor, double mean) {
    Config c;
    config_defaults(&c);
    c.train.divergence_steps = steps;
    c.train.divergence_factor = (float)factor;
    Guard g;
    guard_init(&g, &c, mean);
    return g;
}

static StepStats stats(float loss, int skipped) {
    StepStats s;
    memset(&s, 0, sizeof s);
    s.loss = loss;
    s.skipped = skipped;
    return s;
}

static int observe(Guard *g, long long step, float loss, int skipped, int dynamic) {
    StepStats s = stats(loss, skipped);
    return guard_observe(g, step, &s, dynamic, (uint64_t)(100 * step));
}

static void test_streak_fires_and_resets(void) {
    Guard g = make(3, 3.0, 0);
    EXPECT(!observe(&g, 1, 2.0f, 0, 0) && g.mean == 2.0, "the first good step starts the mean: %g", g.mean);
    EXPECT(!observe(&g, 2, NAN, 0, 0) && g.streak == 1 && g.first_step == 2 && g.first_data == 200,
           "streak %d from step %lld at %llu", g.streak, g.first_step, (unsigned long long)g.first_data);
    EXPECT(!observe(&g, 3, INFINITY, 0, 0) && g.streak == 2, "streak %d", g.streak);
    EXPECT(!observe(&g, 4, 2.1f, 0, 0) && g.streak == 0, "a good step resets the streak: %d", g.streak);
    EXPECT(!observe(&g, 5, 7.0f, 0, 0) && !observe(&g, 6, NAN, 0, 0), "two bad steps do not fire");
    EXPECT(observe(&g, 7, 1.0f, 1, 0), "the third (a non-finite gradient, no dynamic scale) fires");
    EXPECT(g.first_step == 5 && g.first_data == 500 && g.streak == 3, "the streak began at step %lld",
           g.first_step);
}

static void test_spike_threshold_and_mean(void) {
    Guard g = make(1, 3.0, 1.0);   // a mean carried over from a checkpoint
    EXPECT(!observe(&g, 1, 2.9f, 0, 0), "below 3 x the mean is good");
    const double expect = 0.9 * 1.0 + 0.1 * 2.9f;
    EXPECT(fabs(g.mean - expect) < 1e-12, "the mean moves a tenth of the way: %.12g vs %.12g", g.mean, expect);
    const double before = g.mean;
    EXPECT(observe(&g, 2, (float)(3.0 * before * 1.01), 0, 0), "above 3 x the mean is a spike");
    EXPECT(g.mean == before, "a bad step leaves the mean alone: %g vs %g", g.mean, before);
}

static void test_fp16_overflow_is_not_divergence(void) {
    Guard g = make(1, 3.0, 0);
    EXPECT(!observe(&g, 1, 5.0f, 1, 1), "a skipped step under a dynamic loss scale is calibration");
    EXPECT(observe(&g, 2, NAN, 1, 1), "a non-finite loss is bad whatever the scale");
}

static void test_off_never_fires(void) {
    Guard g = make(0, 3.0, 0);
    int fired = 0;
    for (int s = 1; s <= 10; s++) fired |= observe(&g, s, NAN, 1, 0);
    EXPECT(!fired && g.streak == 10, "off: fired %d, streak %d", fired, g.streak);
}

int main(void) {
    TEST_CASE("a streak of bad steps fires the guard, a good one resets it", test_streak_fires_and_resets());
    TEST_CASE("spikes against the running mean of good steps", test_spike_threshold_and_mean());
    TEST_CASE("fp16 overflow under a dynamic scale is not divergence", test_fp16_overflow_is_not_divergence());
    TEST_CASE("divergence_steps 0: never fires", test_off_never_fires());
    return TEST_SUMMARY();
}
