// tma: Hopper's bulk copy engine (the tensor memory accelerator) for the sm90 kernels: tensor
// maps of attention.h tensors (host) and tile copies from them into SW128 shared-memory tiles
// that complete on an mbarrier. One thread issues them; the engine moves the data (and writes
// the zeros of rows past the tensor's end) while the warps compute. Internal to attention/*.cu.
#pragma once
#include <cuda.h>
#include <cudaTypedefs.h>

#include "attention/attention.h"
#include "attention/flash_tiles.cuh"
#include "attention/wgmma.cuh"

// ---- tensor maps (host) -------------------------------------------------------------------


// Map of a (B, rows, heads, HS) tensor of 16-bit elements with element strides `st`, read in
// boxes of box_rows rows x 64 columns with the 128-byte swizzle (one SW128 column block of a
// tile); rows at or past `rows` read as zeros. attn_check guarantees the 16-byte alignment of
// the base and strides that the engine needs. A refusal of the encoder is kept in *status (the
// first one of several maps), and the launcher then launches nothing and returns it.
inline CUtensorMap sw128_tensor_map(TensorMapEncoder enc, const void *base, const AttnStrides &st, int B, int rows,
                                    int heads, int HS, int box_rows, CUresult *status) {
    const cuuint64_t dims[4] = {(cuuint64_t)HS, (cuuint64_t)rows, (cuuint64_t)heads, (cuuint64_t)B};
    const cuuint64_t strides[3] = {(cuuint64_t)st.row * 2, (cuuint64_t)st.head * 2, (cuuint64_t)st.batch * 2};
    const cuuint32_t box[4] = {64, (cuuint32_t)box_rows, 1, 1}, unit[4] = {1, 1, 1, 1};
    CUtensorMap map;
    const CUresult r = enc(&map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 4, const_cast<void *>(base), dims, strides, box, unit,
                           CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                           CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS && *status == CUDA_SUCCESS) *status = r;
    return map;
}

// The maps of p's q (boxes of q_rows rows) and k, v (kv_rows rows), as the sm90 kernels read them.
struct QkvMaps {
    CUtensorMap q, k, v;
};
inline QkvMaps qkv_tensor_maps(TensorMapEncoder enc, const AttnParams &p, int q_rows, int kv_rows, CUresult *status) {
    return {sw128_tensor_map(enc, p.q, p.q_st, p.B, p.T_q, p.NH, p.HS, q_rows, status),
            sw128_tensor_map(enc, p.k, p.k_st, p.B, p.T_k, p.NKV, p.HS, kv_rows, status),
            sw128_tensor_map(enc, p.v, p.v_st, p.B, p.T_k, p.NKV, p.HS, kv_rows, status)};
}

// ---- tile copies --------------------------------------------------------------------------

// Rows [row, row + box_rows) x columns [col, col + 64) of head h, batch row b into the SW128
// column block at shared address dst (1024-byte aligned); the copy's bytes complete_tx on bar.
__device__ __forceinline__ void tma_load_block(uint32_t dst, const CUtensorMap *map, int col, int row, int h, int b,
                                               uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4, %5}], [%6];\n"
                 ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row), "r"(h), "r"(b), "r"(bar)
                 : "memory");
}

// Rows [row, row + ROWS) of head h, batch row b (all HS columns) into the SW128 tile `tile`, one
// copy per 64-column block (the map's boxes are ROWS x 64); ROWS * HS * 2 bytes complete on bar.
template <int ROWS, int HS, typename T>
__device__ __forceinline__ void tma_load_sw128(T *tile, const CUtensorMap *map, int row, int h, int b, uint32_t bar) {
#pragma unroll
    for (int cb = 0; cb < HS / 64; cb++) tma_load_block(smem_u32(tile + cb * ROWS * 64), map, cb * 64, row, h, b, bar);
}

// ---- bulk reductions ----------------------------------------------------------------------

// dst[0 .. bytes/4) += src[...] (fp32, element-wise, done at L2): both 16-byte aligned, bytes a
// multiple of 16. Asynchronous: the writers of src fence_proxy_async and meet the issuing thread
// at a barrier first; the issuer commits, and waits (bulk_wait_read) before src is rewritten.
__device__ __forceinline__ void bulk_reduce_add_f32(float *dst, uint32_t src, uint32_t bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
                 ::"l"(dst), "r"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// This thread's committed bulk operations have read their sources (which may now be rewritten).
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
// ... and have completed (their writes are done).
__device__ __forceinline__ void bulk_wait() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
