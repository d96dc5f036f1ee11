// dropout: the keep decisions of the Backend's dropout op, shared by its CPU
// (model/cpu/ops_cpu_dropout.c) and CUDA (model/cuda/ops_cuda_dropout.cu) implementations so both drop the
// same elements. Element e is kept iff attn_philox_keep(seed, offset, e, p) (attention/philox.h):
// byte e % 16 of Philox block e / 16 against round(256 p), so the ops draw once per 16 elements.
#pragma once
#include <stdint.h>

#include "attention/philox.h"

// The 16 keep decisions of block blk (bit k: element 16 blk + k) under threshold thresh
// (attn_dropout_threshold).
ATTN_HD uint32_t dropout_keep16(uint64_t seed, uint64_t offset, uint64_t blk, uint32_t thresh) {
    const Philox4 r = attn_philox_block(seed, offset, blk);
    uint32_t bits = 0;
    for (int k = 0; k < 16; k++) bits |= (uint32_t)(attn_philox_byte(r, k) >= thresh) << k;
    return bits;
}
