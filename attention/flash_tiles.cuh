// flash_tiles: the tile policy of both flash kernel families, sm80 (mma.sync) and sm90 (wgmma):
// every tile constant lives here, with each kernel's shared storage (one struct per kernel, whose
// size flash_launch checks against the architecture's budget at compile time), and the launchers
// that attention_cuda.cu's one selection function dispatches to.
#pragma once
#include <cuda_runtime.h>
#include <cudaTypedefs.h>
#include <cublas_v2.h>
#include <stddef.h>
#include <stdint.h>

#include "attention/attention.h"

// Shared memory one block may use: the sm80 family's budget is compute capability 8.0's (A100:
// 163 KB; the family also runs on sm90, whose limit is larger), the sm90 family's Hopper's
// (H100/H200: 227 KB).
#define SM80_SMEM_LIMIT (163 * 1024)
#define SM90_SMEM_LIMIT (227 * 1024)

// Forward: each of NWARPS warps owns MT m16 tiles of query rows (BM = 16 * MT * NWARPS) and keeps
// them, with its O accumulator (16*MT x HS fp32) and its scores (16*MT x BN fp32), in registers.
// Q and two stages of K and V live in shared memory: the loads of key tile n-1 are in flight for
// the whole of tile n. MT = 2 makes every K/V fragment read from shared memory (ldmatrix.x4)
// feed 4 MMAs instead of 2. Measured on H200 (docs/PERFORMANCE.md):
//   HS 64:  MT 2, 4 warps, BM 128, BN 64, Q re-read per k-step: 244-260 TFLOP/s at 8K
//           (MT 1 x 8 warps: 160-180).
//   HS 128: MT 1, 8 warps, BM 128, BN 64, Q in registers: O already takes 64 registers; MT 2
//           (O at 128 registers, BN cut to 32 to fit) measured 10% slower.
// Tried again after the backward rewrite, same run as PyTorch: FlashAttention-2's own shapes,
// HS 64 with BN 128 (scores at 128 registers) and HS 128 with MT 2 x 4 warps and BN 64 (Q
// re-read), both spill and ran 4-6% slower; HS 64 at 3 blocks per SM (168 registers) 2% slower.
// The other head sizes follow the nearest measured one:
//   HS 32:  HS 64's shape (MT 2, 4 warps, BM 128, BN 64).
//   HS 96:  HS 128's (MT 1, 8 warps, BM 128, BN 64, Q in registers: 24 beside O's 48).
//   HS 256: MT 1, 8 warps, BM 128, BN 32, Q re-read: O takes 128 registers, so Q (64 more)
//           stays in shared memory, and Q plus two stages of K and V at BN 64 (192 KB) would
//           not fit sm80's budget; at BN 32 they take 128 KB.
template <int HS> struct FwdTile {
    static constexpr int MT = HS <= 64 ? 2 : 1;
    static constexpr int NWARPS = MT == 2 ? 4 : 8;
    static constexpr int BM = 16 * MT * NWARPS;
    static constexpr int BN = HS <= 128 ? 64 : 32;
    static constexpr int NTHREADS = 32 * NWARPS;
    static constexpr bool Q_IN_REGS = MT == 1 && HS <= 128;
    static constexpr int MIN_BLOCKS = 1;
    static_assert(HS % 16 == 0 && BN % 16 == 0, "MMA k-steps of 16");
};
// Q (later the staging area for O), then two stages of K and of V, all swizzled (flash_common.cuh).
template <typename T, int HS> struct FwdSmem {
    using Tile = FwdTile<HS>;
    alignas(16) T q[Tile::BM * HS];
    T k[2][Tile::BN * HS];
    T v[2][Tile::BN * HS];
};

// Backward (main kernel), FlashAttention-2's structure: one block of 8 warps per key tile of BN
// keys; query tiles of BM rows stream through a two-stage Q/dO pipeline. Each product runs on its
// own 2-D grid of warps with both operands in shared memory:
//   S = Q K^T, dP = dO V^T  (BM x BN)  over SD_WM x SD_WN warps, each SD_MT m16 x SD_NT n8 tiles;
//   P and dS go to shared memory (BM x BN each, element type);
//   dV += P^T dO, dK += dS^T Q  (BN x HS)  over KV_WN x KV_WD warps (accumulated in registers
//   across all query tiles of all query heads sharing the KV head: GQA sums without a reduction);
//   dQ += dS K  (BM x HS)  over DQ_WM x DQ_WD warps, added into fp32 with atomics.
// Every warp's block is 32 rows (two m16 tiles), so each fragment read from shared memory feeds
// at least 4 MMAs. The earlier design (warps owning whole key rows of dK and dV, S^T and dP^T in
// registers) fit only 16 keys per warp at HS 128, where dK and dV took 128 of 255 registers.
//   HS 64:  BM 128, BN 128; S/dP 4 x 2 warps (32 q x 64 k), dK/dV 4 x 2 (32 k x 32 d), dQ 4 x 2.
//   HS 128: BM 64,  BN 128; S/dP 2 x 4 warps (32 q x 32 k), dK/dV 4 x 2 (32 k x 64 d), dQ 2 x 4.
// Measured on H200 at 8K tokens (docs/PERFORMANCE.md), TFLOP/s against the earlier design:
// HS 128 215-225 (169-177), HS 64 184-192 (173-187). P and dS in shared memory cost 2 x BM x BN
// elements, which at HS 64 is why the row ranges are recomputed instead of staged. One block
// of 8 warps fits an SM (registers and shared memory): ncu shows 2 warps per scheduler stalled
// on MMA/ldmatrix latency with the tensor pipe ~36% busy, which is the remaining gap to
// PyTorch's FlashAttention-2 (0.68-0.96x); the sm90 family below replaced it on Hopper.
// The other head sizes:
//   HS 32:  HS 64's tiles; S/dP 4 x 2 warps, dK/dV 4 x 2 (32 k x 16 d), dQ 4 x 2 (32 q x 16 d).
//   HS 96:  HS 128's tiles; S/dP 2 x 4, dK/dV 4 x 2 (32 k x 48 d), and dQ 4 x 2 warps of 16
//           queries x 48 columns (a 2 x 4 grid would give each warp 24 columns, an odd number
//           of n8 tiles).
//   HS 256: BM 32, BN 64; S/dP 2 x 4 warps of 16 queries x 16 keys, dK/dV 2 x 4 (32 k x 64 d:
//           128 registers for both), dQ 1 x 8 (32 q x 32 d). BN 128 would hold dK and dV in 256
//           registers; BM 64 spilled (dQ at 64 registers beside dK and dV) and with two stages of
//           Q and dO took 209 KB, past sm80's budget (these tiles: 137 KB). The dQ atomics and
//           the Q/dO traffic per key tile do not depend on BM.
// The S/dP and dQ grids use 16-row warp blocks where 32-row ones would leave a warp an odd
// number of n8 tiles.
template <int HS> struct BwdTile {
    static constexpr int NWARPS = 8;
    static constexpr int NTHREADS = 32 * NWARPS;
    static constexpr int BN = HS <= 128 ? 128 : 64;
    static constexpr int BM = HS <= 64 ? 128 : HS <= 128 ? 64 : 32;
    static constexpr int SD_WM = BN / (NWARPS / (BM / 32)) / 8 % 2 == 0 ? BM / 32 : BM / 16, SD_WN = NWARPS / SD_WM;
    static constexpr int KV_WN = BN / 32, KV_WD = NWARPS / KV_WN;
    static constexpr int DQ_WM = HS / (NWARPS / (BM / 32)) / 8 % 2 == 0 ? BM / 32 : BM / 16, DQ_WD = NWARPS / DQ_WM;
    static constexpr int SD_MT = BM / SD_WM / 16, SD_NT = BN / SD_WN / 8;
    static constexpr int KV_MT = BN / KV_WN / 16, KV_ND = HS / KV_WD / 8;
    static constexpr int DQ_MT = BM / DQ_WM / 16, DQ_ND = HS / DQ_WD / 8;
    static_assert(NWARPS % SD_WM == 0 && NWARPS % KV_WN == 0 && NWARPS % DQ_WM == 0, "warp grids");
    static_assert(SD_NT % 2 == 0 && KV_ND % 2 == 0 && DQ_ND % 2 == 0, "B fragments come in n8 pairs");
    static_assert(BM % 16 == 0 && BN % 16 == 0 && HS % 16 == 0, "MMA k-steps of 16");
};
// K and V (at the end the staging areas of dK and dV), two stages of Q and of dO, P after dropout
// (for dV) and dS (for dK and dQ), two stages of LSE (natural log) and of D. The kernel's
// fragment addresses step from K to V, from Q to dO and from P to dS by a member's size, so
// these pairs stay adjacent in this order.
template <typename T, int HS> struct BwdSmem {
    using Tile = BwdTile<HS>;
    alignas(16) T k[Tile::BN * HS];
    T v[Tile::BN * HS];
    T q[2][Tile::BM * HS];
    T dout[2][Tile::BM * HS];
    T p[Tile::BM * Tile::BN];
    T ds[Tile::BM * Tile::BN];
    float lse[2][Tile::BM];
    float d[2][Tile::BM];
};

// Deterministic dQ kernel: like the forward (warps own 16 query rows), accumulating dQ over the
// key tiles in registers instead of atomics. Q, dO, K and V tiles in shared memory. HS 256 takes
// key tiles of 32 (dQ alone holds 128 registers, S and dP at BN 64 would add 64) and keeps the
// k-steps of S and dP rolled: fully unrolled, ptxas hoists their fragment loads and spills 252
// bytes; rolled, the plain instance still spills 16 (4 registers, sm_80), the price of a warp
// holding all HS columns of its 16 rows' dQ in this deterministic-mode kernel.
template <int HS> struct DqTile {
    static constexpr int NWARPS = 4;
    static constexpr int BM = 16 * NWARPS;
    static constexpr int BN = HS <= 128 ? 64 : 32;
    static constexpr int NTHREADS = 32 * NWARPS;
    static constexpr bool KSTEPS_UNROLLED = HS <= 128;
};
// Q (later the staging area for dQ), dO, K and V.
template <typename T, int HS> struct DqSmem {
    using Tile = DqTile<HS>;
    alignas(16) T q[Tile::BM * HS];
    T dout[Tile::BM * HS];
    T k[Tile::BN * HS];
    T v[Tile::BN * HS];
};

// Hopper forward (flash_fwd_sm90.cu, wgmma): NWG warpgroups of 64 query rows each share the K/V
// tiles of BN keys (STAGES stages, handed over by mbarriers). Per thread: scores BN/2 fp32, O
// HS/2 fp32, P BN/4 registers. attn_select_kernel picks NWG. Measured on H200 at HS 64 with two
// stages and a block barrier per tile (docs/PERFORMANCE.md), TFLOP/s:
//   3 warpgroups (BM 192, FlashAttention-3's shape): 314 causal / 354 full at 8K, 172 causal at 1K;
//   2 warpgroups (BM 128): 291 / 305 at 8K, 197 causal at 1K (less imbalance on short causal rows).
//   HS 128: 2 warpgroups (3 do not fit the registers: O alone takes 64 per thread).
// Three mbarrier stages instead of the block barrier: +7-10% (350 / 390 at 8K, HS 64).
// The softmax overlapped with O += P V (S of the next tile issued first): 384 -> 444
// causal at 32K with 3 warpgroups (415 with 2; 3 spill 32 bytes and still win), 381 -> 441 full
// at 8K, HS 128 472 -> 522 causal at 16K.
//   HS 256: BN 64, two stages (Q and three stages at BN 128 would take 320 KB; these 192 KB), O
//           at 128 registers per thread.
// Tiles are whole 64-column blocks: HS 32 runs in HS 64's tiles, HS 96 in HS 128's (sm90_tile_hs).
// BLOCKS 2 (HS 64, two warpgroups): BN 64 and two stages, so that two blocks share a
// multiprocessor (128 registers per thread, no spills, plain or with the features; 48 KB of
// shared memory each) and one's prologue and epilogue run under the other's loop. Plain, against
// BN 128 at one block per SM (H200, 16K tokens): causal 1.14x at 1K, 1.08x at 2K (GPT-2's
// 16 x 1024, 12 heads: 1.09x); full 0.95x / 0.93x, so attn_select_kernel takes it for causal
// rows below 4K only. The feature instance with dropout 0.2 (H100, 16K tokens, 32 heads): causal
// 1.23x at 256, 1.13x at 512, 1.03x at 1K, 0.97x at 2K (shakespeare_char's 64 x 256, 6 heads:
// 1.10x), so it takes it below 1K queries.
// PRODUCER (one block per SM): one more warpgroup has one thread issue the copies and gives its
// registers to those that compute (setmaxnreg: 2 x 240 + 24 = 3 x 168 with two MMA warpgroups,
// 3 x 160 + 32 = 4 x 128 with three), so no MMA warp waits for a stage's release to refill it
// and the warpgroups drift apart freely. Two blocks per SM (128 registers) have none to give.
// With three warpgroups (and K and V apart) it measured 1.15-1.29x at HS 64 from 4K queries
// and 1.19x / 1.06x at full 2K / 1K rows, so those full rows run three warpgroups too
// (docs/PERFORMANCE.md).
// KV_APART (HS 64): K and V of a stage land and are released apart (K once S = Q K^T has
// completed, V once O += P V has), so a refill of K does not wait for the O += P V issued with
// the next S. Measured 1.01-1.10x at 1K and 2K queries with two warpgroups; with three under
// the producer, 1.14-1.25x the base at 4K-32K where the producer alone made 1.10-1.15x;
// 0.90-0.99x at HS 128, which hands a stage over whole (docs/PERFORMANCE.md).
template <int HS, int NWG, int BLOCKS = 1> struct Sm90FwdTile {
    static constexpr int BM = 64 * NWG, BN = HS <= 128 && BLOCKS == 1 ? 128 : 64;
    static constexpr int STAGES = HS <= 128 && BLOCKS == 1 ? 3 : 2;
    static constexpr bool PRODUCER = BLOCKS == 1;
    static constexpr bool KV_APART = HS == 64;
    static constexpr int NMMA = 128 * NWG, NTHREADS = NMMA + (PRODUCER ? 128 : 0);
    static constexpr int REGS_MMA = NWG == 3 ? 160 : 240, REGS_PRODUCER = NWG == 3 ? 32 : 24;
    static_assert(HS % 64 == 0, "SW128 tiles are whole 64-column blocks");
    static_assert(NWG == 2 || (NWG == 3 && HS == 64), "warpgroups that fit the registers");
    static_assert(BLOCKS == 1 || (BLOCKS == 2 && NWG == 2 && HS == 64), "two blocks per SM at HS 64 only");
};
// Q (later the staging area for O), STAGES stages of K and of V, every tile SW128 and so
// 1024-byte aligned (each is a multiple of 1 KB), then per stage and per K and V a `full`
// mbarrier (the tile landed) and an `empty` one (every warpgroup released it); K's pair stands
// for the whole stage where K and V are not handed over apart (Sm90FwdTile's KV_APART).
template <typename T, int HS, int NWG, int BLOCKS = 1> struct Sm90FwdSmem {
    using Tile = Sm90FwdTile<HS, NWG, BLOCKS>;
    alignas(1024) T q[Tile::BM * HS];
    T k[Tile::STAGES][Tile::BN * HS];
    T v[Tile::STAGES][Tile::BN * HS];
    uint64_t full_k[Tile::STAGES], empty_k[Tile::STAGES], full_v[Tile::STAGES], empty_v[Tile::STAGES];
};

// Hopper backward (flash_bwd_sm90.cu, wgmma): two MMA warpgroups of 64 keys share a key tile of
// BN keys; query tiles of BM rows stream through a two-stage Q/dO pipeline; a third warpgroup
// (one warp of it) loads the stages and another adds their dQ blocks into the accumulator. Per
// MMA thread: S^T and dP^T BM/2 fp32 each, dK and dV HS/2 each, dQ 32. At 24 registers the
// loader keeps a few of its values in local memory (ptxas: 40-80 bytes, about 460 with
// Stream-K's run cursor; the MMA warpgroups spill nothing). 40 for the copy warpgroup and 232
// for the MMA ones measured 0.93-0.97x at HS 64 (docs/PERFORMANCE.md).
//   HS 64:  BM 128 (dQ split between the warpgroups by query halves).
//   HS 128: BM 64  (dQ split by column halves; dK and dV already take 128 registers).
template <int HS> struct Sm90BwdTile {
    static constexpr int NWG = 2, NMMA = 128 * NWG, NTHREADS = NMMA + 128;
    static constexpr int REGS_MMA = 240, REGS_COPY = 24;  // setmaxnreg: 2 x 240 + 24 = 3 x 168
    static constexpr int BN = 64 * NWG, BM = HS <= 64 ? 128 : 64;
    static_assert(HS % 64 == 0 && BM % 64 == 0, "SW128 tiles are whole 64-column blocks");
};
// Two stages of Q and of dO, K and V (at the end the staging areas of dK and dV), two of dS^T
// (keys x queries), every tile SW128 and a multiple of 1 KB (so each stays 1024-byte aligned); a
// 64 x 64 fp32 dQ block per MMA warpgroup; two stages of LSE, D, the visible key ranges of the
// rows and whether the tile is partial; and per stage the mbarriers on which it is full (its
// copies landed) and empty (both MMA warpgroups are done with it).
template <typename T, int HS> struct Sm90BwdSmem {
    using Tile = Sm90BwdTile<HS>;
    alignas(1024) T q[2][Tile::BM * HS];
    T dout[2][Tile::BM * HS];
    T k[Tile::BN * HS];
    T v[Tile::BN * HS];
    T ds[2][Tile::BN * Tile::BM];
    float dq[Tile::NWG][4096];
    float lse[2][Tile::BM];
    float d[2][Tile::BM];
    int2 rng[2][Tile::BM];
    int partial[2];
    uint64_t full[2], empty[2];
};

// The head width of the sm90 tiles for head size HS: SW128 tiles are whole 64-column blocks, so
// HS 32 runs in HS 64's tiles and HS 96 in HS 128's. The copy engine reads the columns past HS as
// zeros (the tensor maps end at HS): they add nothing to S = Q K^T, and the columns of O, dQ, dK
// and dV past HS come out 0 and are not stored (dQ's accumulator has room for them).
constexpr int sm90_tile_hs(int HS) { return (HS + 63) / 64 * 64; }

// Block-sparse attention (attention.h) visits whole tiles of its ATTN_SPARSE_BLOCK blocks: every
// query tile and key tile divides a block (bwd_pairs in flash_mask.cuh looks a backward key
// tile's block up by n0), and the sm90 backward's key tile is exactly one. The sm90 forward's
// 192-row tile (three warpgroups) does not divide one: attn_select_kernel keeps two with a
// block mask.
template <int HS> constexpr bool sm80_sparse_tiles_fit() {
    return ATTN_SPARSE_BLOCK % FwdTile<HS>::BM == 0 && ATTN_SPARSE_BLOCK % FwdTile<HS>::BN == 0 &&
           ATTN_SPARSE_BLOCK % BwdTile<HS>::BM == 0 && ATTN_SPARSE_BLOCK % BwdTile<HS>::BN == 0 &&
           ATTN_SPARSE_BLOCK % DqTile<HS>::BM == 0 && ATTN_SPARSE_BLOCK % DqTile<HS>::BN == 0;
}
template <int HS> constexpr bool sm90_fwd_sparse_tiles_fit() {
    return ATTN_SPARSE_BLOCK % Sm90FwdTile<HS, 2>::BM == 0 && ATTN_SPARSE_BLOCK % Sm90FwdTile<HS, 2>::BN == 0;
}
template <int HS> constexpr bool sm90_bwd_sparse_tiles_fit() {
    return ATTN_SPARSE_BLOCK % Sm90BwdTile<HS>::BM == 0 && Sm90BwdTile<HS>::BN == ATTN_SPARSE_BLOCK;
}
static_assert(sm80_sparse_tiles_fit<32>() && sm80_sparse_tiles_fit<64>() && sm80_sparse_tiles_fit<96>() &&
                  sm80_sparse_tiles_fit<128>() && sm80_sparse_tiles_fit<256>() && sm90_fwd_sparse_tiles_fit<64>() &&
                  sm90_fwd_sparse_tiles_fit<128>() && sm90_fwd_sparse_tiles_fit<256>() &&
                  sm90_bwd_sparse_tiles_fit<64>() && sm90_bwd_sparse_tiles_fit<128>(),
              "tiles must divide the sparse block");

// X(T, HS) for every head size of the sm80 family's instances.
#define FLASH_SM80_FOR_EACH_HS(X, T) X(T, 32) X(T, 64) X(T, 96) X(T, 128) X(T, 256)
// Launchers (explicitly instantiated for T in {__nv_bfloat16, __half}, HS in {32, 64, 96, 128,
// 256}, EXTRAS = ALiBi or dropout present). dsum and dq_accum point into the caller's fp32
// workspace (its layout: flash_ws_dq_accum / flash_ws_dsum in attention_cuda.cu).
template <typename T, int HS, bool EXTRAS> void flash_fwd_launch(const AttnParams &p, cudaStream_t s);
template <typename T, int HS, bool EXTRAS>
void flash_bwd_launch(const AttnParams &p, float *dsum, float *dq_accum, cudaStream_t s);
template <typename T, int HS, bool EXTRAS>
void flash_bwd_dq_launch(const AttnParams &p, const float *dsum, cudaStream_t s);

// sm90 family (T in {__nv_bfloat16, __half}; EXTRAS = soft-capping, ALiBi or dropout present, the
// forward's EXTRAS instances with NWG 2 only): the forward for HS in {32, 64, 96, 128, 256},
// the backward for HS in {32, 64, 96, 128} (its dK and dV take HS registers per thread: HS 256
// runs the sm80 backward on Hopper). The backward adds dQ into dq_accum, or with dq_accum
// NULL (the deterministic mode) leaves dQ to flash_bwd_dq_launch. sms: the device's
// multiprocessors (the stream-K instance's grid).
// The driver's cuTensorMapEncodeTiled (looked up once per context, attention_cuda.cu).
typedef PFN_cuTensorMapEncodeTiled_v12000 TensorMapEncoder;
// The sm90 launchers return the tensor-map encoder's refusal (then nothing was launched), else
// CUDA_SUCCESS; launch errors stay CUDA's last error, as for every launcher.
template <typename T, int HS, int NWG, bool EXTRAS, int BLOCKS = 1>
CUresult flash_fwd_sm90_launch(const AttnParams &p, TensorMapEncoder enc, cudaStream_t s);
template <typename T, int HS, bool EXTRAS>
CUresult flash_bwd_sm90_launch(const AttnParams &p, const float *dsum, float *dq_accum, int sms,
                               TensorMapEncoder enc, cudaStream_t s);
// Whether flash_bwd_sm90_launch runs p stream-K (its SPLIT instance) on sms multiprocessors, for
// the plain (!extras) or the feature instance, with or without a dQ accumulator.
bool flash_bwd_sm90_stream_k(const AttnParams &p, bool extras, bool dq_accum, int sms);
bool flash_sm90_ok();  // this binary has sm_90a code for the current device

// Backward helpers (flash_bwd_sm80.cu): D = rowsum(dO * O) (B, NH, T_q) when dsum is not NULL
// and, when dq_accum is not NULL, zeroing of dq_accum (B, NH, T_q, HS); then dQ = scale *
// dq_accum in the element type (added to an fp32 dq with accumulate).
template <typename T>
void flash_bwd_preprocess(const AttnParams &p, float *dsum, float *dq_accum, cudaStream_t s);
template <typename T> void flash_bwd_convert_dq(const AttnParams &p, const float *dq_accum, cudaStream_t s);
