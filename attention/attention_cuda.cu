// attention_cuda: the GPU half of an AttnContext (attention/attention_gpu.h). It keeps what a
// call would otherwise look up again (architecture, the Hopper kernels' presence, the driver's
// tensor-map encoder, a cuBLAS handle, a growing workspace, the kernel choice per shape), asks
// the one selection function for a kernel family and tile, and dispatches; every run-time
// choice becomes a template parameter in sm80_dispatch() and sm90_dispatch() alone. Every
// failure (a launch, cudaFuncSetAttribute in a launcher, cuBLAS, an allocation) comes back as
// attention.h's status with CUDA's message; nothing here ends the process.
#include "attention/attention_gpu.h"
#include "attention/decode_cuda.cuh"
#include "attention/flash_common.cuh"
#include "attention/flash_tiles.cuh"
#include "attention/mask.h"
#include "attention/naive_cuda.cuh"
#include "attention/route.h"

#include <stdlib.h>
#include <string.h>

typedef enum { FAMILY_NAIVE = 0, FAMILY_SM80 = 1, FAMILY_SM90 = 2 } AttnKernelFamily;

typedef struct {
    AttnKernelFamily family;
    int hs;       // head size of the instantiated kernel
    bool extras;  // soft-capping, ALiBi or dropout: the kernel variant that evaluates them
    int fwd_wgs;     // sm90 forward: warpgroups per block (Sm90FwdTile)
    int fwd_blocks;  // sm90 forward: blocks per multiprocessor (Sm90FwdTile's BLOCKS)
} AttnKernelChoice;

// What a kernel choice depends on besides the context: one cached plan per distinct key.
typedef struct {
    int backward, hs, extras, softcap, deterministic, naive, long_q, sparse, causal;
    DType dtype;
} PlanKey;

enum { PLAN_SLOTS = 16 };

struct AttnGpu {
    cudaStream_t stream;
    AttnKernel kernel;        // the family asked for
    int arch;                 // 10 * major + minor of the current device
    int sms;                  // its multiprocessors (the split-KV decode's split count, the
                              // stream-K backward's grid)
    size_t smem_optin;        // the shared memory one block may opt in to (bytes)
    bool sm90_ok;             // this binary holds sm_90a code for it
    TensorMapEncoder encode;  // the driver's cuTensorMapEncodeTiled (sm90 family only)
    cublasHandle_t blas;      // the naive path's, made on its first use
    void *ws;                 // device workspace, grown to the largest problem seen
    size_t ws_bytes;
    PlanKey keys[PLAN_SLOTS];
    AttnKernelChoice plans[PLAN_SLOTS];
    int n_plans, next_slot;
};

// Shared memory of the sm80 backward's main kernel at head size HS (one of the instances').
static size_t sm80_bwd_smem_bytes(int HS) {
    switch (HS) {
    case 32: return smem_bytes<BwdSmem<__half, 32>>();
    case 64: return smem_bytes<BwdSmem<__half, 64>>();
    case 96: return smem_bytes<BwdSmem<__half, 96>>();
    case 128: return smem_bytes<BwdSmem<__half, 128>>();
    default: return smem_bytes<BwdSmem<__half, 256>>();
    }
}

// Picks the kernel family and tile from (arch, dtype, head size, features, direction, T).
// Hopper (compute capability 9.0, with sm_90a code in this binary) runs the wgmma family, every
// feature included, unless the context asked for sm80; softcap runs on that family only. The
// wgmma family takes every head size (32 in HS 64's tiles, 96 in HS 128's) but the backward at
// 256, whose dK and dV would not fit the registers (flash_bwd_sm90.cu): that backward runs the
// sm80 family on Hopper too, and a context that asked for sm90 refuses it with a message.
// fp32 (no tensor-core flash kernel) and impl naive run the materialised version, and the
// feature instance (EXTRAS: soft-capping, ALiBi, dropout, a block mask) runs where the plain one
// lacks a feature (attn_route, attention/route.c). Only the sm90
// forward's tile depends on T and on causality (fwd_wgs, fwd_blocks; flash_tiles.cuh has the
// measurements). Returns -1 with a message when nothing fits.
static int attn_select_kernel(const AttnGpu &g, const AttnParams &p, int backward, AttnKernelChoice *c,
                              char *err, size_t errlen) {
    const AttnRoute route = attn_route(&p, DEVICE_CUDA);
    c->hs = p.HS;
    c->extras = route.extras;
    if (route.naive) {
        c->family = FAMILY_NAIVE;
        return 0;
    }
    if (g.arch < 80) {
        snprintf(err, errlen, "attention: the CUDA flash kernels need compute capability 8.0 or newer "
                 "(this GPU is %d.%d): use impl naive", g.arch / 10, g.arch % 10);
        return -1;
    }
    if (p.HS != 32 && p.HS != 64 && p.HS != 96 && p.HS != 128 && p.HS != 256) {
        snprintf(err, errlen, "attention: head size HS = %d has no CUDA flash kernel: use 32, 64, 96, 128 or "
                 "256, or impl naive", p.HS);
        return -1;
    }
    const bool hopper = g.kernel != ATTN_KERNEL_SM80 && g.arch == 90 && g.sm90_ok;
    const bool sm90_hs = !backward || p.HS != 256;
    c->family = hopper && sm90_hs ? FAMILY_SM90 : FAMILY_SM80;
    if (p.softcap > 0.f && c->family == FAMILY_SM80) {
        if (hopper)
            snprintf(err, errlen, "attention: softcap at head size HS = %d runs on the cpu and the naive cuda path "
                     "only (the sm90 flash kernels' %s takes it at HS %s): use impl naive (attention.impl = naive)",
                     p.HS, backward ? "backward" : "forward", backward ? "32, 64, 96 and 128" : "32, 64, 96, 128 and 256");
        else
            snprintf(err, errlen, "attention: softcap runs on the sm90 flash kernels (a Hopper GPU, kernel auto or "
                     "sm90), the cpu and the naive cuda path: use impl naive (attention.impl = naive)");
        return -1;
    }
    if (g.kernel == ATTN_KERNEL_SM90 && c->family == FAMILY_SM80) {
        snprintf(err, errlen, "attention: the sm90 flash backward takes head sizes 32, 64, 96 and 128, not HS = %d "
                 "(kernel auto runs it on the sm80 family): use kernel auto or sm80 (attention.kernel)", p.HS);
        return -1;
    }
    if (backward && c->family == FAMILY_SM80 && sm80_bwd_smem_bytes(p.HS) > g.smem_optin) {
        snprintf(err, errlen, "attention: the sm80 flash backward at head size HS = %d needs %zu KB of shared "
                 "memory per block and this GPU offers %zu KB: use impl naive",
                 p.HS, sm80_bwd_smem_bytes(p.HS) / 1024, g.smem_optin / 1024);
        return -1;
    }
    // HS 64 tiles (HS 32 and 64): three warpgroups (BM 192, under a producer warpgroup) for the
    // full rows and for causal rows from 4K queries on (shorter causal rows are imbalanced over
    // 192-row tiles); the other head sizes fit two only, and so do the feature instances (a block
    // mask among them needs query tiles that divide its blocks).
    const bool hs64 = p.HS <= 64, short_causal = p.causal && p.T_q < 4096;
    c->fwd_wgs = hs64 && !short_causal && !c->extras ? 3 : 2;
    // The short causal rows in HS 64 tiles run two blocks per SM instead (Sm90FwdTile's BLOCKS 2,
    // with its measurements): one block's prologue and epilogue run under the other's loop;
    // against the one-block producer instance 1.14x at 1K and 1.05x at 2K. The feature instance
    // gains from it only at the shortest rows (below 1K queries).
    c->fwd_blocks = hs64 && (c->extras ? p.causal && p.T_q < 1024 : short_causal) ? 2 : 1;
    return 0;
}

// Flash workspace (floats, see attn_workspace_bytes): the dQ accumulator (B, NH, T_q and HS rounded
// up to 64; its tiled layout: flash_mask.cuh), which only the non-deterministic backward uses,
// then D (B, NH, T_q). The accumulator comes first so that it keeps the workspace's 16-byte
// alignment, which the bulk reductions and vector atomics into it need.
static float *flash_ws_dq_accum(const AttnParams &p) { return static_cast<float *>(p.workspace); }
static float *flash_ws_dsum(const AttnParams &p) {
    return flash_ws_dq_accum(p) + attn_dq_acc_floats(&p);
}

// The backward's per-query buffers, the caller's (AttnParams.dsum, dq_accum) or the workspace's.
struct BwdRows {
    float *dsum;      // D (B, NH, T_q)
    float *dsum_out;  // where the preprocess computes D; NULL when the caller's is ready
    float *dq_accum;  // the main kernel's fp32 dQ accumulator; NULL: deterministic (dQ kernel)
    float *dq_ws;     // the workspace's accumulator when it is the one: zeroed by the
                      // preprocess, converted into dq after the main kernel
};

static BwdRows bwd_rows(const AttnParams &p) {
    BwdRows r;
    r.dsum = p.dsum ? p.dsum : flash_ws_dsum(p);
    r.dsum_out = p.dsum_ready ? NULL : r.dsum;
    r.dq_ws = p.deterministic || p.dq_accum ? NULL : flash_ws_dq_accum(p);
    r.dq_accum = p.dq_accum ? p.dq_accum : r.dq_ws;
    return r;
}

// After the main kernel: dq from the workspace's accumulator, or the deterministic dQ kernel; a
// caller's accumulator waits for attn_dq_accum_store.
template <typename T, int HS, bool EXTRAS>
static void bwd_finish(const AttnParams &p, const BwdRows &r, cudaStream_t s) {
    if (r.dq_ws) flash_bwd_convert_dq<T>(p, r.dq_ws, s);
    else if (!r.dq_accum) flash_bwd_dq_launch<T, HS, EXTRAS>(p, r.dsum, s);
}

template <typename T, int HS, bool EXTRAS>
static void sm80_run(const AttnParams &p, int backward, cudaStream_t s) {
    if (!backward) {
        flash_fwd_launch<T, HS, EXTRAS>(p, s);
        return;
    }
    const BwdRows r = bwd_rows(p);
    flash_bwd_preprocess<T>(p, r.dsum_out, r.dq_ws, s);
    flash_bwd_launch<T, HS, EXTRAS>(p, r.dsum, r.dq_accum, s);
    bwd_finish<T, HS, EXTRAS>(p, r, s);
}

// attn_select_kernel only returns head sizes 32, 64, 96, 128 and 256 for the flash families.
template <typename T, bool EXTRAS>
static void sm80_dispatch_hs(const AttnParams &p, const AttnKernelChoice &c, int backward, cudaStream_t s) {
    switch (c.hs) {
    case 32: sm80_run<T, 32, EXTRAS>(p, backward, s); break;
    case 64: sm80_run<T, 64, EXTRAS>(p, backward, s); break;
    case 96: sm80_run<T, 96, EXTRAS>(p, backward, s); break;
    case 128: sm80_run<T, 128, EXTRAS>(p, backward, s); break;
    default: sm80_run<T, 256, EXTRAS>(p, backward, s); break;
    }
}

// The three-warpgroup forward has no feature instance. The deterministic backward runs the sm90
// main kernel without dQ and the sm80 family's dQ kernel after it (sm80_run's order). Both return
// the tensor-map encoder's refusal, if any (then the main kernel was not launched).
template <typename T, int HS, bool EXTRAS>
static CUresult sm90_forward(const AttnParams &p, const AttnKernelChoice &c, TensorMapEncoder enc, cudaStream_t s) {
    if constexpr (HS <= 64) {
        if (!EXTRAS && c.fwd_wgs == 3) return flash_fwd_sm90_launch<T, HS, 3, false>(p, enc, s);
        if (c.fwd_blocks == 2) return flash_fwd_sm90_launch<T, HS, 2, EXTRAS, 2>(p, enc, s);
    }
    return flash_fwd_sm90_launch<T, HS, 2, EXTRAS>(p, enc, s);
}
template <typename T, int HS, bool EXTRAS>
static CUresult sm90_backward(const AttnParams &p, int sms, TensorMapEncoder enc, cudaStream_t s) {
    const BwdRows rows = bwd_rows(p);
    flash_bwd_preprocess<T>(p, rows.dsum_out, rows.dq_ws, s);
    const CUresult r = flash_bwd_sm90_launch<T, HS, EXTRAS>(p, rows.dsum, rows.dq_accum, sms, enc, s);
    if (r != CUDA_SUCCESS) return r;
    bwd_finish<T, HS, EXTRAS>(p, rows, s);
    return CUDA_SUCCESS;
}

// attn_select_kernel returns the sm90 family for the forward at head sizes 32, 64, 96, 128 and
// 256 and for the backward at 32, 64, 96 and 128.
template <typename T, bool EXTRAS>
static CUresult sm90_dispatch_hs(const AttnParams &p, const AttnKernelChoice &c, int backward, int sms,
                                 TensorMapEncoder enc, cudaStream_t s) {
    if (backward) switch (c.hs) {
        case 32: return sm90_backward<T, 32, EXTRAS>(p, sms, enc, s);
        case 64: return sm90_backward<T, 64, EXTRAS>(p, sms, enc, s);
        case 96: return sm90_backward<T, 96, EXTRAS>(p, sms, enc, s);
        default: return sm90_backward<T, 128, EXTRAS>(p, sms, enc, s);
        }
    switch (c.hs) {
    case 32: return sm90_forward<T, 32, EXTRAS>(p, c, enc, s);
    case 64: return sm90_forward<T, 64, EXTRAS>(p, c, enc, s);
    case 96: return sm90_forward<T, 96, EXTRAS>(p, c, enc, s);
    case 128: return sm90_forward<T, 128, EXTRAS>(p, c, enc, s);
    default: return sm90_forward<T, 256, EXTRAS>(p, c, enc, s);
    }
}

static CUresult sm90_dispatch(const AttnParams &p, const AttnKernelChoice &c, int backward, int sms,
                              TensorMapEncoder enc) {
    cudaStream_t s = static_cast<cudaStream_t>(p.stream);
    if (p.dtype == DTYPE_BF16)
        return c.extras ? sm90_dispatch_hs<__nv_bfloat16, true>(p, c, backward, sms, enc, s)
                        : sm90_dispatch_hs<__nv_bfloat16, false>(p, c, backward, sms, enc, s);
    return c.extras ? sm90_dispatch_hs<__half, true>(p, c, backward, sms, enc, s)
                    : sm90_dispatch_hs<__half, false>(p, c, backward, sms, enc, s);
}

static void sm80_dispatch(const AttnParams &p, const AttnKernelChoice &c, int backward) {
    cudaStream_t s = static_cast<cudaStream_t>(p.stream);
    if (p.dtype == DTYPE_BF16) {
        if (c.extras) sm80_dispatch_hs<__nv_bfloat16, true>(p, c, backward, s);
        else sm80_dispatch_hs<__nv_bfloat16, false>(p, c, backward, s);
    } else {
        if (c.extras) sm80_dispatch_hs<__half, true>(p, c, backward, s);
        else sm80_dispatch_hs<__half, false>(p, c, backward, s);
    }
}

// The driver's cuTensorMapEncodeTiled, found through the runtime (no link against libcuda).
static int find_tensor_map_encoder(TensorMapEncoder *out, char *err, size_t errlen) {
    void *fn = NULL;
    cudaDriverEntryPointQueryResult found;
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                                           cudaEnableDefault, &found);
    if (e != cudaSuccess || found != cudaDriverEntryPointSuccess || !fn) {
        cudaGetLastError();
        snprintf(err, errlen, "attention: the CUDA driver has no cuTensorMapEncodeTiled (needs CUDA "
                 "12 or later) for the sm90 kernels: use kernel sm80");
        return -1;
    }
    *out = reinterpret_cast<TensorMapEncoder>(fn);
    return 0;
}

extern "C" void *attn_gpu_stream(const AttnGpu *g) { return (void *)g->stream; }

extern "C" AttnGpu *attn_gpu_create(void *stream, AttnKernel kernel, char *err, size_t errlen) {
    int dev, major, minor, sms, smem_optin;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
        snprintf(err, errlen, "attention: no usable CUDA device (%s)", cudaGetErrorString(cudaGetLastError()));
        return NULL;
    }
    AttnGpu *g = static_cast<AttnGpu *>(calloc(1, sizeof(AttnGpu)));
    if (!g) {
        snprintf(err, errlen, "attention: out of memory for a CUDA context");
        return NULL;
    }
    g->stream = static_cast<cudaStream_t>(stream);
    g->kernel = kernel;
    g->arch = major * 10 + minor;
    g->sms = sms;
    g->smem_optin = (size_t)smem_optin;
    g->sm90_ok = g->arch == 90 && flash_sm90_ok();
    if (kernel == ATTN_KERNEL_SM90 && !g->sm90_ok) {
        snprintf(err, errlen, "attention: kernel sm90 needs a Hopper GPU (compute capability 9.0) and a "
                 "binary built with sm_90a code; this GPU is %d.%d%s: use kernel auto or sm80",
                 major, minor, g->arch == 90 ? " and the binary has no sm_90a code" : "");
        free(g);
        return NULL;
    }
    if (g->sm90_ok && kernel != ATTN_KERNEL_SM80 && find_tensor_map_encoder(&g->encode, err, errlen) != 0) {
        free(g);
        return NULL;
    }
    return g;
}

// Nothing to report to: a failure here (a device already in an error state) leaves the memory
// to the driver, which frees it with the process, and clears CUDA's error for the caller.
extern "C" void attn_gpu_destroy(AttnGpu *g) {
    if (!g) return;
    if (cudaStreamSynchronize(g->stream) == cudaSuccess) cudaFree(g->ws);
    if (g->blas) cublasDestroy(g->blas);
    cudaGetLastError();
    free(g);
}

// err := "attention: <what> failed: <CUDA's message>"; -1. Clears CUDA's error state.
static int cuda_failed(cudaError_t e, const char *what, char *err, size_t errlen) {
    cudaGetLastError();
    snprintf(err, errlen, "attention: %s failed: %s", what, cudaGetErrorString(e));
    return -1;
}

static bool same_key(const PlanKey &a, const PlanKey &b) { return memcmp(&a, &b, sizeof a) == 0; }

// The kernel choice for p, from the plan cache or the selection function (then cached, the
// oldest slot replaced when all are taken).
static int plan_for(AttnGpu *g, const AttnParams &p, int backward, AttnKernelChoice *c, char *err,
                    size_t errlen) {
    PlanKey k;
    memset(&k, 0, sizeof k);   // padding too: keys are compared bytewise
    k.backward = backward;
    k.hs = p.HS;
    const AttnRoute route = attn_route(&p, DEVICE_CUDA);
    k.extras = route.extras;
    k.softcap = p.softcap > 0.f;
    k.deterministic = p.deterministic;
    k.naive = route.naive;
    k.long_q = p.T_q >= 4096;
    k.sparse = attn_sparse(&p);
    k.causal = p.causal;
    k.dtype = p.dtype;
    for (int i = 0; i < g->n_plans; i++)
        if (same_key(g->keys[i], k)) {
            *c = g->plans[i];
            return 0;
        }
    if (attn_select_kernel(*g, p, backward, c, err, errlen) != 0) return -1;
    const int slot = g->n_plans < PLAN_SLOTS ? g->n_plans++ : g->next_slot++ % PLAN_SLOTS;
    g->keys[slot] = k;
    g->plans[slot] = *c;
    return 0;
}

// The caller's workspace, or the context's own, grown (after the work queued on its stream
// that may still read the old one) to need bytes.
static int attach_workspace(AttnGpu *g, AttnParams *p, size_t need, char *err, size_t errlen) {
    if (p->workspace) return 0;   // attn_check accepted its size
    if (need > g->ws_bytes) {
        cudaError_t e = cudaStreamSynchronize(g->stream);
        if (e != cudaSuccess)
            return cuda_failed(e, "waiting for the stream before growing the workspace", err, errlen);
        e = cudaFree(g->ws);
        if (e != cudaSuccess) return cuda_failed(e, "freeing the old workspace", err, errlen);
        g->ws = NULL;
        g->ws_bytes = 0;
        if (cudaMalloc(&g->ws, need) != cudaSuccess) {
            cudaGetLastError();
            g->ws = NULL;
            snprintf(err, errlen, "attention: no GPU memory for a workspace of %.1f MiB (B=%d, NH=%d, "
                     "T_q=%d, T_k=%d)", need / 1048576.0, p->B, p->NH, p->T_q, p->T_k);
            return -1;
        }
        g->ws_bytes = need;
    }
    p->workspace = g->ws;
    p->workspace_bytes = g->ws_bytes;
    return 0;
}

// A workspace the caller hands in must be 16-byte aligned (attn_check has checked its size).
static int check_caller_workspace(const AttnParams *p, char *err, size_t errlen) {
    if (!p->workspace || (uintptr_t)p->workspace % 16 == 0) return 0;
    snprintf(err, errlen, "attention: the CUDA workspace must be 16-byte aligned (cudaMalloc's is)");
    return -1;
}

extern "C" int attn_gpu_run(AttnGpu *g, AttnParams *p, int backward, char *err, size_t errlen) {
    if (backward && !p->out) {
        snprintf(err, errlen, "attention: backward needs the forward output 'out' (for D = rowsum(dO * O))");
        return -1;
    }
    if (check_caller_workspace(p, err, errlen) != 0) return -1;
    AttnKernelChoice c;
    if (plan_for(g, *p, backward, &c, err, errlen) != 0) return -1;
    AttnParams run = *p;   // the caller's params stay as they were given
    run.stream = g->stream;
    if (attach_workspace(g, &run, attn_workspace_bytes(p, DEVICE_CUDA), err, errlen) != 0) return -1;
    if (c.family == FAMILY_NAIVE) {
        if (!g->blas) {
            const cublasStatus_t st = cublasCreate(&g->blas);
            if (st != CUBLAS_STATUS_SUCCESS) {
                g->blas = NULL;
                snprintf(err, errlen, "attention: cublasCreate failed for the naive path: %s",
                         cublasGetStatusString(st));
                return -1;
            }
        }
        return naive_run_cuda(run, g->blas, backward, err, errlen);
    }
    // The launchers queue their kernels (and set their shared-memory attributes) and return; the
    // first launch or attribute error is still CUDA's last error here.
    if (c.family == FAMILY_SM90) {
        const CUresult r = sm90_dispatch(run, c, backward, g->sms, g->encode);
        if (r != CUDA_SUCCESS) {
            snprintf(err, errlen, "attention: cuTensorMapEncodeTiled refused the sm90 kernels' tensor "
                     "maps (CUresult %d)", (int)r);
            return -1;
        }
    } else {
        sm80_dispatch(run, c, backward);
    }
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return cuda_failed(e, c.family == FAMILY_SM90 ? "the sm90 flash kernels' launch"
                                                      : "the sm80 flash kernels' launch", err, errlen);
    return 0;
}

// The deterministic backward alone runs without a dQ accumulator (bwd_rows).
extern "C" int attn_gpu_backward_stream_k(const AttnGpu *g, const AttnParams *p) {
    AttnKernelChoice c;
    char err[256];
    if (attn_select_kernel(*g, *p, 1, &c, err, sizeof err) != 0 || c.family != FAMILY_SM90) return 0;
    return flash_bwd_sm90_stream_k(*p, c.extras, !p->deterministic, g->sms);
}

extern "C" int attn_gpu_decode_splits(const AttnGpu *g, const AttnParams *p) {
    return decode_plan(p, g->sms).splits;
}

// attn_workspace_bytes counts the split kernel's partials (decode_workspace_bytes), so the
// caller's workspace, or the context's grown to that size, holds them.
extern "C" int attn_gpu_decode(AttnGpu *g, AttnParams *p, char *err, size_t errlen) {
    const DecodePlan d = decode_plan(p, g->sms);
    if (d.splits == 0) return attn_gpu_run(g, p, 0, err, errlen);
    if (check_caller_workspace(p, err, errlen) != 0) return -1;
    AttnParams run = *p;
    run.stream = g->stream;
    if (attach_workspace(g, &run, attn_workspace_bytes(p, DEVICE_CUDA), err, errlen) != 0) return -1;
    return decode_run_cuda(run, d, err, errlen);
}

extern "C" int attn_gpu_dq_accum_store(AttnGpu *g, const AttnParams *p, char *err, size_t errlen) {
    if (p->dtype == DTYPE_BF16) flash_bwd_convert_dq<__nv_bfloat16>(*p, p->dq_accum, g->stream);
    else flash_bwd_convert_dq<__half>(*p, p->dq_accum, g->stream);  // attn_check: bf16 or fp16
    const cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? 0 : cuda_failed(e, "the dQ accumulator's store", err, errlen);
}
