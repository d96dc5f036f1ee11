// Philox-4x32-10 counter-based RNG (Salmon et al., SC'11), usable from C and CUDA. Dropout in
// every attention implementation draws from it, so a mask can be regenerated anywhere from
// (seed, offset, element index) alone.
#pragma once
#include <stdint.h>

#ifdef __CUDACC__
#define ATTN_HD __host__ __device__ __forceinline__
#else
#define ATTN_HD static inline
#endif

typedef struct { uint32_t x[4]; } Philox4;

ATTN_HD Philox4 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                               uint32_t k1) {
    const uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)M0 * c0, p1 = (uint64_t)M1 * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0; c1 = lo1; c2 = n2; c3 = lo0;
        k0 += W0; k1 += W1;
    }
    Philox4 r4 = {{c0, c1, c2, c3}};
    return r4;
}

// The Philox block of draw `blk`: its 4 outputs are the draws of elements 4 blk .. 4 blk + 3
// of the (B, NH, T_q, T_k) probability tensor, so a kernel holding 4 consecutive elements draws
// once for them.
ATTN_HD Philox4 attn_philox_block(uint64_t seed, uint64_t offset, uint64_t blk) {
    return philox4x32_10((uint32_t)blk, (uint32_t)(blk >> 32), (uint32_t)offset, (uint32_t)(offset >> 32),
                         (uint32_t)seed, (uint32_t)(seed >> 32));
}

// Uniform 32-bit draw for element `e` of the (B, NH, T_q, T_k) probability tensor: one Philox
// block serves 4 consecutive elements.
ATTN_HD uint32_t attn_philox_u32(uint64_t seed, uint64_t offset, uint64_t e) {
    return attn_philox_block(seed, offset, e >> 2).x[e & 3];
}

// The smallest draw that keeps an element under dropout probability p: p * 2^32, clamped.
ATTN_HD uint32_t attn_philox_threshold(float p) {
    return (uint32_t)((double)p * 4294967296.0 >= 4294967295.0 ? 4294967295u : (double)p * 4294967296.0);
}

// Keep when the draw is at or above p * 2^32.
ATTN_HD int attn_philox_keep(uint64_t seed, uint64_t offset, uint64_t e, float p) {
    return attn_philox_u32(seed, offset, e) >= attn_philox_threshold(p);
}
