// rng: a small, fully serialisable random number generator (xoshiro256** seeded by splitmix64)
// for initialisation, data order and sampling. Its whole state is 4 uint64 words, saved in
// checkpoints for exact resume.
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint64_t s[4];
} Rng;

void rng_seed(Rng *r, uint64_t seed);
uint64_t rng_u64(Rng *r);
uint32_t rng_u32(Rng *r);
float rng_uniform(Rng *r);                 // [0, 1)
float rng_normal(Rng *r);                  // standard normal (Box-Muller, one draw per call)
// x[i] = scale * rng_normal(r) for i in [0, n), the same values in the same order, faster: the
// generator's words are drawn in order a chunk at a time, and their transforms (independent of
// each other) run on every OpenMP thread.
void rng_normal_fill(Rng *r, float *x, size_t n, float scale);
uint64_t rng_below(Rng *r, uint64_t n);    // uniform in [0, n), unbiased
