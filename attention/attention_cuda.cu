// attention_cuda: the public CUDA entries of attention/attention.h. They validate the params once
// (attn_check, then what only the GPU path needs), ask the one selection function for a kernel
// family and tile, and dispatch; every run-time choice becomes a template parameter in
// sm80_dispatch() and sm90_dispatch() alone.
#include "attention/flash_common.cuh"
#include "attention/flash_tiles.cuh"
#include "attention/mask.h"

#include <stdlib.h>
#include <string.h>

typedef enum { ATTN_KERNEL_NAIVE = 0, ATTN_KERNEL_SM80 = 1, ATTN_KERNEL_SM90 = 2 } AttnKernelFamily;

typedef struct {
    AttnKernelFamily family;
    int hs;       // head size of the instantiated kernel
    bool extras;  // ALiBi or dropout: the kernel variant that evaluates them
    int fwd_wgs;  // sm90 forward: warpgroups per block (Sm90FwdTile)
} AttnKernelChoice;

// Picks the kernel family and tile from (arch, dtype, head size, features, direction, T).
// Hopper (compute capability 9.0, with sm_90a code in this binary) runs the wgmma family; ALiBi,
// dropout and the deterministic backward stay on the sm80 family. Only the sm90 forward's tile
// depends on T (fwd_wgs); causality changes no tile (flash_tiles.cuh documents why). The
// environment variable FLASHGPT_ATTN_KERNEL=sm80 forces the sm80 family on Hopper (tests and
// benchmarks compare the two); `auto` or unset is the default. Returns -1 with a message when
// nothing fits.
static int attn_select_kernel(const AttnParams &p, int arch, int backward, AttnKernelChoice *c, char *err,
                              size_t errlen) {
    c->hs = p.HS;
    c->extras = p.alibi_slopes != NULL || p.dropout_p > 0.f;
    if (p.impl == ATTN_IMPL_NAIVE) {
        c->family = ATTN_KERNEL_NAIVE;
        return 0;
    }
    if (p.dtype == DTYPE_F32) {
        // no tensor-core flash kernel for fp32: the materialised version computes it exactly,
        // when the caller sized the workspace for it
        AttnParams naive = p;
        naive.impl = ATTN_IMPL_NAIVE;
        const size_t need = attn_workspace_bytes(&naive, DEVICE_CUDA);
        if (p.workspace_bytes < need) {
            snprintf(err, errlen, "attention: fp32 on CUDA runs the naive (materialised) attention, "
                     "which needs a workspace of %zu bytes (got %zu): set attention.impl = naive or "
                     "use precision.dtype bf16/fp16", need, p.workspace_bytes);
            return -1;
        }
        c->family = ATTN_KERNEL_NAIVE;
        return 0;
    }
    if (arch < 80) {
        snprintf(err, errlen, "attention: the CUDA flash kernels need compute capability 8.0 or newer "
                 "(this GPU is %d.%d): use attention.impl = naive", arch / 10, arch % 10);
        return -1;
    }
    if (p.HS != 64 && p.HS != 128) {
        snprintf(err, errlen, "attention: head size %d has no CUDA flash kernel: use 64 or 128 "
                 "(n_embd / n_head), or attention.impl = naive", p.HS);
        return -1;
    }
    c->family = ATTN_KERNEL_SM80;
    const char *force = getenv("FLASHGPT_ATTN_KERNEL");
    if (force && *force && strcmp(force, "auto") != 0 && strcmp(force, "sm80") != 0) {
        snprintf(err, errlen, "attention: FLASHGPT_ATTN_KERNEL=%s is not a kernel family: use auto or sm80", force);
        return -1;
    }
    const bool sm80_forced = force && strcmp(force, "sm80") == 0;
    if (arch == 90 && !c->extras && !(backward && p.deterministic) && !sm80_forced && flash_sm90_ok())
        c->family = ATTN_KERNEL_SM90;
    // HS 64: three warpgroups (BM 192) from 4K queries on, two below (short causal rows are
    // imbalanced over 192-row tiles); HS 128 fits two only.
    c->fwd_wgs = p.HS == 64 && p.T_q >= 4096 ? 3 : 2;
    return 0;
}

// Flash workspace (floats, see attn_workspace_bytes): the dQ accumulator (B, NH, T_q rounded up
// to 64, HS; its tiled layout: flash_mask.cuh), which only the non-deterministic backward uses,
// then D (B, NH, T_q). The accumulator comes first so that it keeps the workspace's 16-byte
// alignment, which the bulk reductions and vector atomics into it need.
static float *flash_ws_dq_accum(const AttnParams &p) { return static_cast<float *>(p.workspace); }
static float *flash_ws_dsum(const AttnParams &p) {
    return flash_ws_dq_accum(p) + attn_dq_acc_floats(&p);
}

template <typename T, int HS, bool EXTRAS>
static void sm80_run(const AttnParams &p, int backward, cudaStream_t s) {
    if (!backward) {
        flash_fwd_launch<T, HS, EXTRAS>(p, s);
        return;
    }
    float *dq_accum = p.deterministic ? NULL : flash_ws_dq_accum(p);
    float *dsum = flash_ws_dsum(p);
    flash_bwd_preprocess<T>(p, dsum, dq_accum, s);
    flash_bwd_launch<T, HS, EXTRAS>(p, dsum, dq_accum, s);
    if (dq_accum) flash_bwd_convert_dq<T>(p, dq_accum, s);
    else flash_bwd_dq_launch<T, HS, EXTRAS>(p, dsum, s);
}

template <typename T>
static void sm80_dispatch_hs(const AttnParams &p, const AttnKernelChoice &c, int backward, cudaStream_t s) {
    switch (c.hs * 2 + (int)c.extras) {
    case 64 * 2 + 0: sm80_run<T, 64, false>(p, backward, s); break;
    case 64 * 2 + 1: sm80_run<T, 64, true>(p, backward, s); break;
    case 128 * 2 + 0: sm80_run<T, 128, false>(p, backward, s); break;
    case 128 * 2 + 1: sm80_run<T, 128, true>(p, backward, s); break;
    default: CHECK(!"attn_select_kernel returned a head size without a kernel");
    }
}

// The sm90 backward always uses the fp32 dQ accumulator (attn_select_kernel keeps the
// deterministic mode on the sm80 family).
template <typename T, int HS>
static void sm90_run(const AttnParams &p, const AttnKernelChoice &c, int backward, cudaStream_t s) {
    if (!backward) {
        if (HS == 64 && c.fwd_wgs == 3) flash_fwd_sm90_launch<T, 64, 3>(p, s);
        else flash_fwd_sm90_launch<T, HS, 2>(p, s);
        return;
    }
    float *dq_accum = flash_ws_dq_accum(p), *dsum = flash_ws_dsum(p);
    flash_bwd_preprocess<T>(p, dsum, dq_accum, s);
    flash_bwd_sm90_launch<T, HS>(p, dsum, dq_accum, s);
    flash_bwd_convert_dq<T>(p, dq_accum, s);
}

template <typename T>
static void sm90_dispatch_hs(const AttnParams &p, const AttnKernelChoice &c, int backward, cudaStream_t s) {
    if (c.hs == 64) sm90_run<T, 64>(p, c, backward, s);
    else sm90_run<T, 128>(p, c, backward, s);
}

static void sm90_dispatch(const AttnParams &p, const AttnKernelChoice &c, int backward) {
    cudaStream_t s = static_cast<cudaStream_t>(p.stream);
    if (p.dtype == DTYPE_BF16) sm90_dispatch_hs<__nv_bfloat16>(p, c, backward, s);
    else sm90_dispatch_hs<__half>(p, c, backward, s);
}

static void sm80_dispatch(const AttnParams &p, const AttnKernelChoice &c, int backward) {
    cudaStream_t s = static_cast<cudaStream_t>(p.stream);
    if (p.dtype == DTYPE_BF16) sm80_dispatch_hs<__nv_bfloat16>(p, c, backward, s);
    else sm80_dispatch_hs<__half>(p, c, backward, s);
}

static void attn_run_cuda(const AttnParams *p, int backward) {
    char err[512];
    if (attn_check(p, DEVICE_CUDA, backward, err, sizeof err) != 0) fatal(EXIT_USAGE, "%s", err);
    if (backward && !p->out)
        fatal(EXIT_USAGE, "attention: backward needs the forward output 'out' (for D = rowsum(dO * O))");
    if (backward && (uintptr_t)p->workspace % 16 != 0)
        fatal(EXIT_USAGE, "attention: the CUDA workspace must be 16-byte aligned (cudaMalloc's is)");
    int dev, major, minor;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    AttnKernelChoice c;
    if (attn_select_kernel(*p, major * 10 + minor, backward, &c, err, sizeof err) != 0) fatal(EXIT_USAGE, "%s", err);
    if (c.family == ATTN_KERNEL_NAIVE) {
        if (backward) naive_backward_cuda(*p);
        else naive_forward_cuda(*p);
        return;
    }
    if (c.family == ATTN_KERNEL_SM90) sm90_dispatch(*p, c, backward);
    else sm80_dispatch(*p, c, backward);
}

extern "C" void attn_forward_cuda(const AttnParams *p) { attn_run_cuda(p, 0); }
extern "C" void attn_backward_cuda(const AttnParams *p) { attn_run_cuda(p, 1); }
