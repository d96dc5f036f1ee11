#include "common/rng.h"

#include <math.h>
#include <stdlib.h>

#include "common/check.h"

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void rng_seed(Rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t rng_u64(Rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

uint32_t rng_u32(Rng *r) { return (uint32_t)(rng_u64(r) >> 32); }

float rng_uniform(Rng *r) { return (float)(rng_u64(r) >> 40) * (1.0f / 16777216.0f); }

// Box-Muller on two words of the generator: u1 in (0, 1] so the log is finite.
static float normal_of(uint64_t a, uint64_t b) {
    const double u1 = ((double)(a >> 11) + 1.0) * (1.0 / 9007199254740992.0);
    const double u2 = (double)(b >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

float rng_normal(Rng *r) {
    const uint64_t a = rng_u64(r), b = rng_u64(r);
    return normal_of(a, b);
}

void rng_normal_fill(Rng *r, float *x, size_t n, float scale) {
    enum { CHUNK = 1 << 16 };
    uint64_t *w = xmalloc(2 * (size_t)CHUNK * sizeof *w);
    for (size_t off = 0; off < n; off += CHUNK) {
        const size_t m = n - off < CHUNK ? n - off : CHUNK;
        for (size_t i = 0; i < 2 * m; i++) w[i] = rng_u64(r);
#pragma omp parallel for schedule(static) if (m >= 4096)
        for (size_t i = 0; i < m; i++) x[off + i] = scale * normal_of(w[2 * i], w[2 * i + 1]);
    }
    free(w);
}

uint64_t rng_below(Rng *r, uint64_t n) {
    if (n <= 1) return 0;
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do x = rng_u64(r);
    while (x >= limit);
    return x % n;
}
