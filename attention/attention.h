// attention: the public API of the attention module (CPU reference, CUDA flash kernels, naive
// baseline). It knows nothing of GPT: callers describe tensors with pointers and strides.
//
// Layout: every tensor is addressed as base + b*batch_stride + t*row_stride + h*head_stride + d
// (strides in ELEMENTS, the innermost head dimension is contiguous). This lets the model hand in
// its fused QKV buffer (B, T, (NH + 2*NKV) * HS) without permute copies.
#pragma once
#include <stdint.h>
#include <stddef.h>

#include "common/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { ATTN_IMPL_FLASH = 0, ATTN_IMPL_NAIVE = 1 } AttnImpl;
// The flash kernel family on CUDA: auto (the Hopper family where the GPU, the binary and the
// problem's features allow, else sm80), sm90 (the same, but a context on a GPU without it is
// refused), sm80 (the mma.sync family everywhere, for comparisons and pre-Hopper behaviour).
typedef enum { ATTN_KERNEL_AUTO = 0, ATTN_KERNEL_SM90 = 1, ATTN_KERNEL_SM80 = 2 } AttnKernel;

typedef struct {
    int64_t batch, row, head;  // element strides
} AttnStrides;

// Filled once per call (zero-initialise, then set every field you use); kernels trust it after
// attn_check() accepted it.
typedef struct {
    // --- forward tensors ---
    const void *q;   // (B, T_q, NH, HS)  by q_st
    const void *k;   // (B, T_k, NKV, HS) by k_st
    const void *v;   // (B, T_k, NKV, HS) by v_st
    void *out;       // (B, T_q, NH, HS)  by o_st
    float *lse;      // (B, NH, T_q) fp32: log-sum-exp of the scaled, masked scores (+INFINITY
                     // for a fully masked row, whose output is 0); element (b, h, i) at
                     // lse[b * lse_batch_stride + h * lse_head_stride + i]
    int64_t lse_batch_stride, lse_head_stride;  // both 0: contiguous (NH * T_q, T_q)
    AttnStrides q_st, k_st, v_st, o_st;

    // --- backward tensors (attn_backward only) ---
    const void *dout;      // like out, by do_st
    void *dq, *dk, *dv;    // like q, k, v, by dq_st, dk_st, dv_st
    AttnStrides do_st, dq_st, dk_st, dv_st;
    // With accumulate set, dq, dk and dv are fp32 accumulators (float, by their strides, whatever
    // dtype is) to which this call's gradients are ADDED; without it they are of dtype and
    // overwritten. The flash backward only: attn_check refuses it for impl naive and for fp32
    // on cuda (which runs the naive kernels). Without deterministic, dk and dv may then sum in
    // an order that differs from run to run (the sm90 stream-K backward's atomics), as dq does.
    int accumulate;

    // --- sizes ---
    int B, T_q, T_k;
    int NH, NKV;          // query heads, key/value heads; NKV divides NH (GQA/MQA when NKV < NH)
    int HS;               // head size
    float scale;          // usually 1/sqrt(HS)

    // --- masking ---
    // Query i (0-based in T_q) is aligned to key position i + (T_k - T_q) ("bottom-right"
    // alignment, as in flash-attention), so causal with T_q == T_k is the usual lower triangle;
    // causal with T_q > T_k leaves the first T_q - T_k queries without a visible key (output 0,
    // lse +INFINITY, dq 0), as every other fully masked row.
    // With pos_explicit, query i sits at position q_pos0 + i and key j at k_pos0 + j instead: a
    // chunk of queries against a chunk of keys of one longer sequence (context parallelism).
    // Causal, window and ALiBi then compare these positions; any T_q, T_k is accepted, and a
    // chunk pair with nothing visible gives fully masked rows.
    int causal;
    int pos_explicit;
    int64_t q_pos0, k_pos0;
    int window_left, window_right;  // key j is visible to aligned query position p only if
                                    // p - window_left <= j <= p + window_right; -1 = unbounded
    // ALiBi: adds -slope * |p - j| to each (capped) score. alibi_slopes is NULL (off), or (NH)
    // slopes shared by every batch row when alibi_batch_stride (below) is 0, or (B, NH) slopes
    // with row b's at alibi_slopes + b * alibi_batch_stride (any stride >= NH).
    const float *alibi_slopes;
    // Packed documents (requires T_q == T_k): cu_seqlens[0..n_docs] are cumulative offsets over
    // the flattened (B*T) token index, starting at 0 and ending at B*T; a document never crosses
    // a batch row (row starts must appear in the list). Tokens attend only inside their document.
    const int *cu_seqlens;          // NULL = no document masking
    int n_docs;

    // --- dropout on the attention probabilities (training only) ---
    float dropout_p;                // 0 = off; applied to the nearest 1/256 (attn_dropout_keep_scale)
    uint64_t seed, offset;          // Philox key and counter base: backward regenerates the mask

    // --- execution ---
    DType dtype;                // element type of q, k, v, out, dout, dq, dk, dv
    AttnImpl impl;
    int deterministic;              // bitwise reproducible dq (and dk, dv)
    // The stream is the context's (attn_forward, attn_backward and attn_decode run on it; the
    // caller's params are left as given). The workspace: NULL, the context's own, grown to the
    // largest problem seen; or the caller's, which every entry point (forward, backward, decode)
    // uses as it is: at least attn_workspace_bytes() for this problem (attn_check refuses less),
    // device memory for CUDA, 16-byte aligned.
    void *stream;
    void *workspace;
    size_t workspace_bytes;

    // --- masking, continued: last, so that the layout before them stays that of earlier builds
    // (scripts/bench_attention.py --ab drives both) ---
    int64_t alibi_batch_stride;     // 0: slopes (NH) shared by every batch row; >= NH: (B, NH)
    // Soft-capping of the logits (Gemma 2, flash-attn 2.6+): 0 = off; > 0: each scaled score s
    // becomes softcap * tanh(s / softcap), and only then are ALiBi added and masks applied (the
    // order flash-attn uses). Forward and backward.
    float softcap;
    // Block-sparse attention (all four NULL: dense). Queries and keys are cut into blocks of
    // ATTN_SPARSE_BLOCK (by index in T_q and T_k; the last block of each may be ragged); query
    // block qb reads only the key blocks sparse_q_blocks[sparse_q_offsets[qb] ..
    // sparse_q_offsets[qb + 1]) (sorted, distinct), and the transposed lists sparse_k_offsets /
    // sparse_k_blocks give each key block its query blocks (backward). The usual masks (causal,
    // window, documents) still apply inside the present blocks. One pattern for every batch row
    // and head, so the query heads of a GQA group share their KV head's. Device memory on CUDA;
    // attn_block_mask_build / attn_block_mask_from_lists make the lists and
    // attn_set_block_mask points p at them. Not with pos_explicit or the naive CUDA path.
    const int *sparse_q_offsets;    // (ceil(T_q / ATTN_SPARSE_BLOCK) + 1)
    const int *sparse_q_blocks;     // (sparse_q_offsets[n_qb]) key block indices
    const int *sparse_k_offsets;    // (ceil(T_k / ATTN_SPARSE_BLOCK) + 1)
    const int *sparse_k_blocks;     // (sparse_k_offsets[n_kb]) query block indices
    // Dropout, continued: NULL, or one uint64 in the context's memory (device memory on CUDA)
    // added to offset when the kernel runs, so a captured CUDA graph replays with each step's
    // masks: the draws are those of offset + *offset_dev (mod 2^64) passed as offset alone.
    const uint64_t *offset_dev;
    // --- backward over several key sets of the same queries (the flash backward only) ---
    // Calls that share q, out, dout, lse and the query rows (each over other keys, with
    // accumulate) may share their per-query work through caller memory instead of redoing it:
    // dsum: NULL (each call computes D = rowsum(dO * O) into its workspace), or D (B, NH, T_q)
    //   fp32 contiguous, computed into it by a call with dsum_ready 0 and read as it is by
    //   calls with dsum_ready 1.
    // dq_accum: NULL (dq is written by each call), or the caller's fp32 dQ accumulator of
    //   attn_dq_accum_floats() floats (CUDA: 16-byte aligned), zeroed by the caller, in the
    //   implementation's own layout: the call ADDS its dQ there and leaves dq alone, and
    //   attn_dq_accum_store then writes dq once from the sum. Not with the deterministic
    //   backward (its dQ kernel adds into an fp32 dq with accumulate instead).
    float *dsum;
    int dsum_ready;
    float *dq_accum;
} AttnParams;

// The block size of block-sparse attention: a multiple of every flash tile along both axes
// (sm80: 32, 64 and 128, sm90: 64 and 128; the sm90 forward's 192-row tile is not used with a
// block mask) and of the CPU reference's 64.
#define ATTN_SPARSE_BLOCK 128

// Block patterns (a sparse list built on the host from a few numbers, in blocks): every
// pattern keeps the local band |kb - diag(qb)| < band, where diag(qb) is the key block holding
// the aligned position of query block qb's first row (the diagonal block when T_q == T_k);
//   local_global: plus `global` global blocks: a query block whose diag is below `global`
//                 reads every key block and every query block reads the first `global` key
//                 blocks;
//   strided:      plus every key block kb with kb % stride == stride - 1 (summary columns);
//   bigbird:      local_global plus `random` key blocks per query block drawn from a stream
//                 keyed by seed and diag (duplicates merge).
// Every rule depends on diag(qb), not on qb, so one query decoding at position t against the
// cache (T_q = 1, T_k = t + 1) reads the blocks of training's query block holding t. With
// causal, blocks wholly above the causal diagonal are left out of the lists.
typedef enum {
    ATTN_SPARSE_NONE = 0,
    ATTN_SPARSE_LOCAL_GLOBAL = 1,
    ATTN_SPARSE_STRIDED = 2,
    ATTN_SPARSE_BIGBIRD = 3
} AttnSparsePattern;
typedef struct {
    AttnSparsePattern pattern;
    int band;      // >= 1 blocks (1: the diagonal block alone)
    int global;    // >= 0 blocks (local_global, bigbird)
    int stride;    // >= 1 blocks (strided)
    int random;    // >= 0 blocks per query block (bigbird)
    uint64_t seed; // bigbird's random blocks
} AttnSparseSpec;

// Host memory: the lists of AttnParams' sparse fields for one (T_q, T_k).
typedef struct {
    int T_q, T_k, n_qb, n_kb;
    int nnz;                      // present blocks
    int *q_offsets, *q_blocks;    // (n_qb + 1), (nnz)
    int *k_offsets, *k_blocks;    // (n_kb + 1), (nnz)
} AttnBlockMask;

// Builds m for pattern s over T_q queries and T_k keys (causal: bottom-right aligned, as in
// AttnParams). Parameters wider than the problem are clipped to it (a decoding step early in a
// sequence has fewer blocks than the band). Returns 0, or -1 with err naming the parameter
// (band, global, stride, random) out of its range and m left empty. ATTN_SPARSE_NONE is
// refused: dense attention needs no lists.
int attn_block_mask_build(AttnBlockMask *m, const AttnSparseSpec *s, int T_q, int T_k, int causal,
                          char *err, size_t errlen);
// Builds m from a caller's per-query-block lists (copied; each row sorted, distinct, in range,
// else -1 with err naming the row) and adds the transposed lists.
int attn_block_mask_from_lists(AttnBlockMask *m, int T_q, int T_k, const int *q_offsets,
                               const int *q_blocks, char *err, size_t errlen);
void attn_block_mask_free(AttnBlockMask *m);
// Fraction of the (query block, key block) pairs that are present.
double attn_block_mask_density(const AttnBlockMask *m);
// Points p's four sparse fields at m's host arrays (CPU; CUDA callers point them at device
// copies of the same four arrays).
void attn_set_block_mask(AttnParams *p, const AttnBlockMask *m);

// ---- the context: made once per backend (device, stream, kernel family) ----
// It holds what every call would otherwise look up again: the GPU's architecture, whether this
// binary has the Hopper kernels, the driver's tensor-map encoder, a cuBLAS handle for the naive
// path, a workspace that grows to the largest problem seen, and the kernel choice per problem
// shape. Nothing in it is global: several contexts may coexist.
typedef struct AttnContext AttnContext;

// stream: a cudaStream_t for DEVICE_CUDA (NULL = the legacy default stream), ignored on the CPU.
// Returns NULL with err set when the device cannot serve the request (no CUDA in this build,
// ATTN_KERNEL_SM90 on a GPU or binary without the Hopper kernels).
AttnContext *attn_context_create(Device dev, void *stream, AttnKernel kernel, char *err, size_t errlen);
void attn_context_destroy(AttnContext *ctx);

// Forward (out, lse) and backward (dq, dk, dv; needs out and lse from the forward) of p on the
// context's device: one validation (attn_check), then the kernel. Asynchronous on the stream.
// Return 0, or -1 with err naming the parameter (HS, T_q, window_left, impl, dtype, ...) and
// what is accepted; callers add what those are in their own terms. A CUDA launch, cuBLAS or
// allocation failure returns -1 with CUDA's message the same way. No entry point of this header
// prints or ends the process.
int attn_forward(AttnContext *ctx, AttnParams *p, char *err, size_t errlen);
int attn_backward(AttnContext *ctx, AttnParams *p, char *err, size_t errlen);

// Forward of a decode step: a few queries (T_q <= ATTN_DECODE_MAX_TQ, the newest positions)
// against a long key/value cache, with attn_forward's contract and result (out, lse, every
// masking rule). On CUDA it runs the split-KV kernel (FlashDecoding): the visible key range is
// cut into splits over the GPU's multiprocessors, each writing a partial output and its
// log-sum-exp to the workspace (the caller's or the context's, as attn_forward), merged in fp32
// by a second kernel; one block reads each K/V head once for all the query heads of its GQA
// group. It takes bf16 and fp16, impl flash, HS 64 or 128, causal, windows and ALiBi; a problem
// with what it lacks (dropout, documents, soft-capping, a block mask: the one routing table of
// attention/route.c) and every problem on the CPU runs exactly attn_forward. A cache laid out
// (B, NKV, T_max, HS), k_st = {NKV * T_max * HS, HS, T_max * HS}, reads each head's keys
// contiguously.
#define ATTN_DECODE_MAX_TQ 8
int attn_decode(AttnContext *ctx, AttnParams *p, char *err, size_t errlen);
// The number of key splits attn_decode runs p (accepted by attn_check) with on ctx: >= 1 for
// the split-KV kernel, 0 when p runs attn_forward's path.
int attn_decode_splits(const AttnContext *ctx, const AttnParams *p);
// Whether attn_backward runs p (accepted by attn_check) on ctx with the sm90 backward's stream-K
// instance (attention/flash_bwd_sm90.cu: accumulate mode, every query seeing every key, key
// tiles that leave the last wave part-empty), for tests and benchmarks: 1 or 0 (0 on the CPU).
int attn_backward_stream_k(const AttnContext *ctx, const AttnParams *p);

// The fused QKV layout: q, k and v are the head groups [NH | NKV | NKV] of one buffer qkv
// (B, T, (NH + 2*NKV) * HS) and out is (B, T, NH * HS), elements of elem_bytes. Sets the four
// pointers and strides, B, T_q = T_k = T, NH, NKV, HS and scale = 1/sqrt(HS); the rest of p is
// left as it is.
void attn_fused_qkv(AttnParams *p, const void *qkv, void *out, int B, int T, int NH, int NKV,
                    int HS, size_t elem_bytes);
// The gradients in the same layout (after attn_fused_qkv): dq, dk, dv into dqkv, dout like out.
void attn_fused_qkv_grads(AttnParams *p, void *dqkv, const void *dout, size_t elem_bytes);

// sizeof(AttnParams) in this build, for mirrors of the struct in other languages (ctypes) to
// check their layout against.
size_t attn_params_size(void);

// Validates the params for `dev` (and for backward when `backward` is set). Returns 0 when they
// are acceptable, otherwise writes a message a user can act on into err and returns -1.
int attn_check(const AttnParams *p, Device dev, int backward, char *err, size_t errlen);

// Scratch memory (bytes) that forward, backward and attn_decode of this problem need, whichever
// implementation each runs: the one workspace size a caller's buffer must have. Flash needs
// O(B*NH*T); naive O(B*NH*T_q*T_k); the split-KV decode a partial output per split and query
// row, its splits bounded for every GPU (a few MiB), so a decode whose cache grows step by step
// needs the same workspace at every step.
size_t attn_workspace_bytes(const AttnParams *p, Device dev);
// Whether the problem runs the materialised (naive) path on dev: impl naive, or fp32 on CUDA,
// which has no tensor-core flash kernel. On CUDA, softcap runs on the sm90 flash family only
// (attn_forward / attn_backward refuse it on the sm80 family, attn_check with the
// deterministic backward).
int attn_runs_naive(const AttnParams *p, Device dev);

// Floats of p's dQ accumulator (AttnParams.dq_accum), on every device.
size_t attn_dq_accum_floats(const AttnParams *p);
// dq from p->dq_accum, the sum of the backward calls that added to it (p: one of those calls'
// params): scale * accumulator into dq of dtype (overwritten), or with accumulate added to an
// fp32 dq. On the context's device and stream. Returns 0, or -1 with err set.
int attn_dq_accum_store(AttnContext *ctx, const AttnParams *p, char *err, size_t errlen);

// The CPU reference itself (fp32), on params attn_check accepted: what attn_forward runs on a
// CPU context, and what the oracle tests drive directly. impl picks the tiled flash version or
// the materialised naive one. Returns 0, or -1 when the per-thread scratch memory (naive:
// T_q * T_k floats, twice in backward) cannot be allocated; the outputs are then incomplete.
int attn_forward_cpu(const AttnParams *p);
// Needs out and lse from the forward. The flash backward is exact for any subset of the keys as
// long as out and lse are those of the attention over ALL keys (D = rowsum(dO * O) and P =
// exp(S - lse) then are the full softmax's): a ring of key chunks runs it once per chunk with
// accumulate. The naive backward recomputes its softmax over the keys it is given, so it
// refuses accumulate.
int attn_backward_cpu(const AttnParams *p);

// Partial results over disjoint key sets of the same queries combine exactly through their
// log-sum-exp: acc's out and lse (B, T_q, NH, HS and B, NH, T_q, by their strides) become those
// of the attention over both key sets, given part's out and lse for the other set:
//   lse = log(exp(lse_acc) + exp(lse_part)),
//   out = out_acc * exp(lse_acc - lse) + out_part * exp(lse_part - lse),
// computed in fp32 from the larger lse down (no overflow); an lse of +INFINITY (no visible key)
// contributes nothing, and an acc row whose lse is +INFINITY takes the part's as it is. acc's
// out is an fp32 accumulator (float, by its strides) whatever the dtype; part's out is of
// part's dtype. Only out, lse, their strides, dtype and B, T_q, NH, HS are read. On the
// context's device and stream (asynchronous on CUDA).
int attn_merge(AttnContext *ctx, const AttnParams *acc, const AttnParams *part, char *err,
               size_t errlen);
// The CPU merge itself, on params attn_merge accepted.
void attn_merge_cpu(const AttnParams *acc, const AttnParams *part);
// The CPU store of the dQ accumulator itself (attn_dq_accum_store), on params it accepted.
void attn_dq_accum_store_cpu(const AttnParams *p);

// Helpers shared by every implementation (attention/mask.c): whether key j is visible to query
// i of batch row b under the params' causal/window/document rules and block mask (host lists).
int attn_visible(const AttnParams *p, int b, int i, int j);
// The dropout keep-decision for element (b, h, i, j): 1 keep (scaled by attn_dropout_keep_scale),
// 0 drop. Counter-based (Philox-4x32-10 keyed by seed, counter from offset and the element's
// position; one byte per element against round(256 p): attention/mask.h), so any implementation
// on any device regenerates the same mask. offset_dev, when set, must be host memory here.
int attn_dropout_keep(const AttnParams *p, int b, int h, int i, int j);
// The factor kept probabilities take: 256 / (256 - round(256 dropout_p)), the inverse of the rate
// at which elements survive (dropout_p to the nearest 1/256).
float attn_dropout_keep_scale(const AttnParams *p);

#ifdef __cplusplus
}
#endif
