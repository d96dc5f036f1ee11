// flash_tiles: the tile policy of the sm80 flash kernels (every tile constant lives here, with
// its shared-memory budget checked at compile time) and the launchers that attention_cuda.cu's
// one selection function dispatches to. A later Hopper family (wgmma, TMA) adds its own traits
// and launchers beside these and a case in attn_select_kernel().
#pragma once
#include <cuda_runtime.h>
#include <stddef.h>

#include "attention/attention.h"

// Shared memory one block may use on sm80 (A100: 163 KB) and sm90 (H100/H200: 227 KB).
#define SM80_SMEM_LIMIT (163 * 1024)

// Forward: each of NWARPS warps owns MT m16 tiles of query rows (BM = 16 * MT * NWARPS) and keeps
// them, with its O accumulator (16*MT x HS fp32) and its scores (16*MT x BN fp32), in registers.
// Q and two stages of K and V live in shared memory: the loads of key tile n-1 are in flight for
// the whole of tile n. MT = 2 makes every K/V fragment read from shared memory (ldmatrix.x4)
// feed 4 MMAs instead of 2. Measured on H200 (docs/PERFORMANCE.md):
//   HS 64:  MT 2, 4 warps, BM 128, BN 64, Q re-read per k-step: 244-260 TFLOP/s at 8K
//           (MT 1 x 8 warps: 160-180).
//   HS 128: MT 1, 8 warps, BM 128, BN 64, Q in registers: O already takes 64 registers; MT 2
//           (O at 128 registers, BN cut to 32 to fit) measured 10% slower.
template <int HS> struct FwdTile {
    static constexpr int MT = HS <= 64 ? 2 : 1;
    static constexpr int NWARPS = MT == 2 ? 4 : 8;
    static constexpr int BM = 16 * MT * NWARPS;
    static constexpr int BN = 64;
    static constexpr int NTHREADS = 32 * NWARPS;
    static constexpr bool Q_IN_REGS = MT == 1;
    static constexpr int MIN_BLOCKS = 1;
    static constexpr size_t SMEM = (size_t)(BM + 4 * BN) * HS * 2;
    static_assert(HS % 16 == 0 && BN % 16 == 0, "MMA k-steps of 16");
    static_assert(SMEM <= SM80_SMEM_LIMIT, "forward tile exceeds shared memory");
};

// Backward (dK/dV kernel): each warp owns MT m16 tiles of keys (BN = 16 * MT * NWARPS) and
// accumulates dK and dV (2 x 16*MT x HS fp32) in registers across all query tiles of all the
// query heads that share its KV head (GQA sums in registers, no reduction pass). Query tiles of
// BM rows stream through a two-stage Q/dO pipeline; dS goes through shared memory for dQ = dS K
// (atomics into fp32). Measured on H200 (docs/PERFORMANCE.md):
//   HS 64:  MT 2, 4 warps, BN 128, BM 32: dK+dV 128 registers, S^T and dP^T 32 each
//           (173-188 TFLOP/s at 8K; MT 1 with BM 64: 134-139).
//   HS 128: MT 1, 8 warps, BN 128, BM 64: dK+dV take 128 registers at MT 1; BM 64 reuses each
//           K/V fragment over twice the queries of BM 32 (168-175 against 154-159).
template <int HS> struct BwdTile {
    static constexpr int MT = HS <= 64 ? 2 : 1;
    static constexpr int NWARPS = MT == 2 ? 4 : 8;
    static constexpr int BN = 16 * MT * NWARPS;
    static constexpr int BM = HS <= 64 ? 32 : 64;
    static constexpr int NTHREADS = 32 * NWARPS;
    // K, V, two stages of Q and dO, dS^T (BN x BM), LSE, D and the row ranges of one query tile
    static constexpr size_t SMEM = (size_t)(2 * BN + 4 * BM) * HS * 2 + (size_t)BN * BM * 2 +
                                   2 * (size_t)BM * (4 + 4 + 8);
    // dQ = dS (BM x BN) K (BN x HS) is split over a (BM/16) x WN grid of warps.
    static constexpr int WM = BM / 16;
    static constexpr int WN = NWARPS / WM;
    static_assert(NWARPS % WM == 0 && HS % (16 * WN) == 0, "dQ warp grid must tile BM x HS");
    static_assert(BM % 16 == 0 && HS % 16 == 0, "MMA k-steps of 16");
    static_assert(SMEM <= SM80_SMEM_LIMIT, "backward tile exceeds shared memory");
};

// Deterministic dQ kernel: like the forward (warps own 16 query rows), accumulating dQ over the
// key tiles in registers instead of atomics. Q, dO, K and V tiles in shared memory.
template <int HS> struct DqTile {
    static constexpr int NWARPS = 4;
    static constexpr int BM = 16 * NWARPS;
    static constexpr int BN = 64;
    static constexpr int NTHREADS = 32 * NWARPS;
    static constexpr size_t SMEM = (size_t)(2 * BM + 2 * BN) * HS * 2;
    static_assert(SMEM <= SM80_SMEM_LIMIT, "dQ tile exceeds shared memory");
};

// Launchers (explicitly instantiated for T in {__nv_bfloat16, __half}, HS in {64, 128},
// EXTRAS = ALiBi or dropout present). `ws_f32` is the fp32 workspace (see flash_workspace_bytes).
template <typename T, int HS, bool EXTRAS> void flash_fwd_launch(const AttnParams &p, cudaStream_t s);
template <typename T, int HS, bool EXTRAS>
void flash_bwd_launch(const AttnParams &p, float *dsum, float *dq_accum, cudaStream_t s);
template <typename T, int HS, bool EXTRAS>
void flash_bwd_dq_launch(const AttnParams &p, const float *dsum, cudaStream_t s);

// Backward helpers (flash_bwd.cu): D = rowsum(dO * O) (B, NH, T_q) and, when dq_accum is not
// NULL, zeroing of dq_accum (B, NH, T_q, HS); then dQ = scale * dq_accum in the element type.
template <typename T>
void flash_bwd_preprocess(const AttnParams &p, float *dsum, float *dq_accum, cudaStream_t s);
template <typename T> void flash_bwd_convert_dq(const AttnParams &p, const float *dq_accum, cudaStream_t s);

// Naive baseline (naive_cuda.cu): materialised scores through cuBLAS.
void naive_forward_cuda(const AttnParams &p);
void naive_backward_cuda(const AttnParams &p);
size_t naive_workspace_bytes(const AttnParams &p);
