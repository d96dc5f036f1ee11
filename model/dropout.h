// dropout: the keep decisions of the Backend's dropout op, shared by its CPU
// (model/cpu/ops_cpu_dropout.c) and CUDA (model/cuda/ops_cuda_dropout.cu) implementations so both drop the
// same elements. Element e is kept iff attn_philox_keep(seed, offset, e, p): the draws are those
// of attention/philox.h, but one Philox block decides 4 consecutive elements, so the ops draw
// once per block instead of once per element.
#pragma once
#include <stdint.h>

#include "attention/philox.h"

// A draw at or above this keeps its element (attn_philox_keep's threshold, p * 2^32 clamped).
ATTN_HD uint32_t dropout_threshold(float p) {
    const double t = (double)p * 4294967296.0;
    return t >= 4294967295.0 ? 4294967295u : (uint32_t)t;
}

// The draws of elements 4 blk .. 4 blk + 3 (attn_philox_u32's counter and key layout).
ATTN_HD Philox4 dropout_block(uint64_t seed, uint64_t offset, uint64_t blk) {
    return philox4x32_10((uint32_t)blk, (uint32_t)(blk >> 32), (uint32_t)offset,
                         (uint32_t)(offset >> 32), (uint32_t)seed, (uint32_t)(seed >> 32));
}
