// Philox-4x32-10 counter-based RNG (Salmon et al., SC'11), usable from C and CUDA. Dropout in
// every attention implementation and the model's dropout op draw from it, one byte per element
// (16 to a block), so a mask can be regenerated anywhere from (seed, offset, element index) alone.
#pragma once
#include <stdint.h>

#ifdef __CUDACC__
#define ATTN_HD __host__ __device__ __forceinline__
#else
#define ATTN_HD static inline
#endif

typedef struct { uint32_t x[4]; } Philox4;

// The 32 x 32 -> 64-bit product's halves. On the GPU in 32-bit operations: the 64-bit form
// compiles to a wide multiply plus an add of a zero high word per product.
ATTN_HD void philox_mul(uint32_t a, uint32_t m, uint32_t *hi, uint32_t *lo) {
#ifdef __CUDA_ARCH__
    *hi = __umulhi(a, m), *lo = a * m;
#else
    const uint64_t p = (uint64_t)a * m;
    *hi = (uint32_t)(p >> 32), *lo = (uint32_t)p;
#endif
}

ATTN_HD Philox4 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                               uint32_t k1) {
    const uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
    for (int r = 0; r < 10; r++) {
        uint32_t hi0, lo0, hi1, lo1;
        philox_mul(c0, M0, &hi0, &lo0);
        philox_mul(c2, M1, &hi1, &lo1);
        uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0; c1 = lo1; c2 = n2; c3 = lo0;
        k0 += W0; k1 += W1;
    }
    Philox4 r4 = {{c0, c1, c2, c3}};
    return r4;
}

// The Philox block `blk` under (seed, offset): 16 bytes, one draw per element for dropout.
ATTN_HD Philox4 attn_philox_block(uint64_t seed, uint64_t offset, uint64_t blk) {
    return philox4x32_10((uint32_t)blk, (uint32_t)(blk >> 32), (uint32_t)offset, (uint32_t)(offset >> 32),
                         (uint32_t)seed, (uint32_t)(seed >> 32));
}

// Byte `k` (0..15) of a block: word k / 4, bits 8 (k % 4) up.
ATTN_HD uint32_t attn_philox_byte(Philox4 r, int k) { return (r.x[k >> 2] >> (8 * (k & 3))) & 0xffu; }

// Dropout with one byte per element: the smallest byte that keeps an element is round(256 p),
// at most 255, so an element survives with probability 1 - t / 256 (the rate p to the nearest
// 1/256), and survivors are scaled by its inverse, 256 / (256 - t), so every expectation is
// exact. A rate below 1/512 rounds to 0 (callers refuse it).
ATTN_HD uint32_t attn_dropout_threshold(float p) {
    const double t = (double)p * 256.0 + 0.5;
    return t >= 255.0 ? 255u : (uint32_t)t;
}
ATTN_HD float attn_dropout_scale(float p) { return 256.0f / (float)(256u - attn_dropout_threshold(p)); }

// Element e of a flat tensor (the model's dropout): byte e % 16 of block e / 16, kept when it is
// at least attn_dropout_threshold(p).
ATTN_HD int attn_philox_keep(uint64_t seed, uint64_t offset, uint64_t e, float p) {
    return attn_philox_byte(attn_philox_block(seed, offset, e >> 4), (int)(e & 15)) >= attn_dropout_threshold(p);
}
