// rng: a small, fully serialisable random number generator (xoshiro256** seeded by splitmix64)
// for initialisation, data order and sampling. Its whole state is 4 uint64 words, saved in
// checkpoints for exact resume.
#pragma once
#include <stdint.h>

typedef struct {
    uint64_t s[4];
} Rng;

void rng_seed(Rng *r, uint64_t seed);
uint64_t rng_u64(Rng *r);
uint32_t rng_u32(Rng *r);
float rng_uniform(Rng *r);                 // [0, 1)
float rng_normal(Rng *r);                  // standard normal (Box-Muller, one draw per call)
uint64_t rng_below(Rng *r, uint64_t n);    // uniform in [0, n), unbiased
