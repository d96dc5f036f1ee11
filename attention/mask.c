// mask: validation of AttnParams at the module boundary, workspace sizes, and the public wrappers
// around the shared mask and dropout rules of attention/mask.h.
#include "attention/mask.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "attention/attention.h"
#include "attention/decode_plan.h"
#include "attention/route.h"
#include "common/check.h"

#define ATTN_CPU_MAX_HS 1024
#define ATTN_CUDA_MAX_HS 256
// Alignment the CUDA kernels' vector loads need for every base pointer and stride (bytes).
#define ATTN_CUDA_ALIGN 16

// Head sizes each device accepts. CPU: any (its per-thread tiles are (tile, HS) floats; the cap
// only turns garbage such as an uninitialised field into a clear message). CUDA: up to 256 here;
// which of them have a flash kernel (64, 128) is attn_select_kernel's decision in
// attention_cuda.cu, whose message also offers the naive path.
static int hs_supported(Device dev, int HS) {
    return HS >= 1 && HS <= (dev == DEVICE_CPU ? ATTN_CPU_MAX_HS : ATTN_CUDA_MAX_HS);
}

// Whether distinct (b, t, h, d) elements of a tensor with these strides land on distinct
// addresses: sort the three outer dimensions by stride; each must step over the whole extent of
// the smaller ones (the contiguous head dimension being the smallest). Dimensions of size 1 never
// step, so their stride does not matter.
static int strides_disjoint(AttnStrides st, int B, int T, int H, int HS) {
    int64_t s[3] = {st.batch, st.row, st.head};
    int64_t n[3] = {B, T, H};
    for (int a = 0; a < 3; a++)
        for (int b = a + 1; b < 3; b++)
            if (s[b] < s[a]) {
                int64_t ts = s[a], tn = n[a];
                s[a] = s[b]; n[a] = n[b];
                s[b] = ts; n[b] = tn;
            }
    int64_t extent = HS;  // elements spanned by the dimensions below the current one
    for (int a = 0; a < 3; a++) {
        if (n[a] <= 1) continue;
        if (s[a] < extent) return 0;
        extent = s[a] * (n[a] - 1) + extent;
    }
    return 1;
}

typedef struct {
    const char *name;
    const void *ptr;
    AttnStrides st;
    int T, H;
    int written;  // an output: its elements must not overlap
} TensorDesc;

static int check_tensor(const TensorDesc *t, const AttnParams *p, Device dev, char *err,
                        size_t errlen) {
    if (!t->ptr) return set_error(err, errlen, "attention: tensor '%s' is NULL", t->name);
    if (t->st.batch < 0 || t->st.row < 0 || t->st.head < 0)
        return set_error(err, errlen,
                    "attention: tensor '%s' has a negative stride (batch %lld, row %lld, head %lld)",
                    t->name, (long long)t->st.batch, (long long)t->st.row, (long long)t->st.head);
    if (t->written && !strides_disjoint(t->st, p->B, t->T, t->H, p->HS))
        return set_error(err, errlen,
                    "attention: output '%s' strides (batch %lld, row %lld, head %lld) make elements "
                    "overlap for B=%d, T=%d, heads=%d, HS=%d",
                    t->name, (long long)t->st.batch, (long long)t->st.row, (long long)t->st.head,
                    p->B, t->T, t->H, p->HS);
    if (dev == DEVICE_CUDA) {
        size_t eb = dtype_size(p->dtype);
        int64_t all[3] = {t->st.batch, t->st.row, t->st.head};
        if ((uintptr_t)t->ptr % ATTN_CUDA_ALIGN != 0)
            return set_error(err, errlen, "attention: tensor '%s' is not %d-byte aligned", t->name,
                        ATTN_CUDA_ALIGN);
        for (int i = 0; i < 3; i++)
            if ((all[i] * (int64_t)eb) % ATTN_CUDA_ALIGN != 0)
                return set_error(err, errlen,
                            "attention: tensor '%s' stride %lld is not a multiple of %d bytes "
                            "(CUDA kernels load 16-byte vectors)",
                            t->name, (long long)all[i], ATTN_CUDA_ALIGN);
    }
    return 0;
}

// Host-side checks of the document list (CPU only: for CUDA it lives in device memory).
static int check_docs(const AttnParams *p, char *err, size_t errlen) {
    const int *cu = p->cu_seqlens;
    int64_t total = (int64_t)p->B * p->T_q;
    if (cu[0] != 0)
        return set_error(err, errlen, "attention: cu_seqlens[0] is %d, must be 0", cu[0]);
    if (cu[p->n_docs] != total)
        return set_error(err, errlen, "attention: cu_seqlens[%d] (the last) is %d, must be B*T = %lld",
                    p->n_docs, cu[p->n_docs], (long long)total);
    int next_row = 1;  // the next batch-row start (in rows) that must appear in the list
    for (int d = 1; d <= p->n_docs; d++) {
        if (cu[d] < cu[d - 1])
            return set_error(err, errlen, "attention: cu_seqlens decreases at index %d (%d after %d)", d,
                        cu[d], cu[d - 1]);
        while (next_row < p->B && (int64_t)next_row * p->T_q < cu[d]) {
            if ((int64_t)next_row * p->T_q != cu[d - 1])
                return set_error(err, errlen,
                            "attention: a document (cu_seqlens[%d..%d] = %d..%d) crosses the start "
                            "of batch row %d (token %lld): split it there",
                            d - 1, d, cu[d - 1], cu[d], next_row, (long long)next_row * p->T_q);
            next_row++;
        }
    }
    return 0;
}

// Host-side checks of the block lists (CPU only: for CUDA they live in device memory): each
// list's offsets start at 0 and never decrease, each row is ascending and in range, and the
// transposed lists hold exactly the same blocks.
static int check_block_lists(const AttnParams *p, int backward, char *err, size_t errlen) {
    AttnBlockMask m;
    if (attn_block_mask_from_lists(&m, p->T_q, p->T_k, p->sparse_q_offsets, p->sparse_q_blocks, err,
                                   errlen) != 0)
        return -1;
    int bad = -1;  // the first key block whose transposed list differs
    if (backward)
        for (int kb = 0; kb < m.n_kb && bad < 0; kb++) {
            const int n = m.k_offsets[kb + 1] - m.k_offsets[kb];
            if (p->sparse_k_offsets[kb] != m.k_offsets[kb] || p->sparse_k_offsets[kb + 1] != m.k_offsets[kb + 1] ||
                memcmp(p->sparse_k_blocks + m.k_offsets[kb], m.k_blocks + m.k_offsets[kb], sizeof(int) * n) != 0)
                bad = kb;
        }
    attn_block_mask_free(&m);
    if (bad >= 0)
        return set_error(err, errlen, "attention: the transposed block list of key block %d is not that of "
                                      "the query blocks' lists (attn_block_mask_from_lists builds it)", bad);
    return 0;
}

static int check_sparse(const AttnParams *p, Device dev, int backward, char *err, size_t errlen) {
    const int any = p->sparse_q_offsets || p->sparse_q_blocks || p->sparse_k_offsets || p->sparse_k_blocks;
    if (!any) return 0;
    if (!p->sparse_q_offsets || !p->sparse_q_blocks || (backward && (!p->sparse_k_offsets || !p->sparse_k_blocks)))
        return set_error(err, errlen, "attention: a block mask needs sparse_q_offsets and sparse_q_blocks, "
                                      "and for backward sparse_k_offsets and sparse_k_blocks");
    if (p->pos_explicit)
        return set_error(err, errlen, "attention: a block mask cannot be combined with explicit chunk "
                                      "positions (context parallelism)");
    if (attn_runs_naive(p, dev))
        return set_error(err, errlen, "attention: a block mask needs the flash kernels on cuda (impl flash, "
                                      "dtype bf16 or fp16); the naive path is dense");
    return dev == DEVICE_CPU ? check_block_lists(p, backward, err, errlen) : 0;
}

// The feature combinations the CUDA flash kernels do not have on any GPU; the naive CUDA path
// has them all (attn_route decides which path a problem takes). Softcap itself runs on
// the sm90 family only: attn_select_kernel (attention_cuda.cu) refuses it elsewhere.
static int cuda_flash_lacks(const AttnParams *p, int backward, char *err, size_t errlen) {
    if (p->softcap > 0.0f && backward && p->deterministic)
        return set_error(err, errlen, "attention: softcap with the deterministic backward runs on the cpu "
                                      "and the naive cuda path only: use impl naive (attention.impl = "
                                      "naive), --device cpu or the non-deterministic backward");
    return 0;
}

// The backward's caller-held per-query state (attention.h: dsum, dq_accum).
static int check_shared_rows(const AttnParams *p, Device dev, char *err, size_t errlen) {
    if (p->dsum_ready && !p->dsum)
        return set_error(err, errlen, "attention: dsum_ready is set but dsum is NULL");
    if (!p->dsum && !p->dq_accum) return 0;
    if (p->impl == ATTN_IMPL_NAIVE || attn_runs_naive(p, dev))
        return set_error(err, errlen, "attention: dsum and dq_accum (work shared by the backward calls "
                                      "of one set of queries) need the flash backward: impl flash, and "
                                      "on cuda dtype bf16 or fp16");
    if (p->dq_accum && p->deterministic)
        return set_error(err, errlen, "attention: dq_accum cannot be combined with the deterministic "
                                      "backward, which adds dQ into an fp32 dq with accumulate instead");
    if (p->dq_accum && dev == DEVICE_CUDA && (uintptr_t)p->dq_accum % 16 != 0)
        return set_error(err, errlen, "attention: dq_accum must be 16-byte aligned on cuda (cudaMalloc's "
                                      "is): the kernels add into it with vector reductions");
    return 0;
}

int attn_check(const AttnParams *p, Device dev, int backward, char *err, size_t errlen) {
    if (!p) return set_error(err, errlen, "attention: params are NULL");
    const char *devname = dev == DEVICE_CPU ? "cpu" : "cuda";
    if (dev != DEVICE_CPU && dev != DEVICE_CUDA)
        return set_error(err, errlen, "attention: unknown device %d", (int)dev);
    if (p->B < 1 || p->T_q < 1 || p->T_k < 1)
        return set_error(err, errlen, "attention: sizes must be positive, got B=%d, T_q=%d, T_k=%d", p->B,
                    p->T_q, p->T_k);
    if (p->NH < 1 || p->NKV < 1)
        return set_error(err, errlen, "attention: head counts must be positive, got NH=%d, NKV=%d", p->NH,
                    p->NKV);
    if (p->NH % p->NKV != 0)
        return set_error(err, errlen,
                    "attention: the %d query heads cannot be shared evenly by %d key/value heads: "
                    "n_kv_head must divide n_head",
                    p->NH, p->NKV);
    if (!hs_supported(dev, p->HS)) {
        if (dev == DEVICE_CPU)
            return set_error(err, errlen, "attention: head size %d is not supported on cpu: use 1..%d",
                        p->HS, ATTN_CPU_MAX_HS);
        return set_error(err, errlen,
                    "attention: head size %d is not supported on cuda: use 1..%d, best 32, 64, 96, 128 or "
                    "256 (n_embd / n_head), which have flash kernels",
                    p->HS, ATTN_CUDA_MAX_HS);
    }
    if (!isfinite(p->scale))
        return set_error(err, errlen, "attention: scale %g is not finite", p->scale);
    if (p->impl != ATTN_IMPL_FLASH && p->impl != ATTN_IMPL_NAIVE)
        return set_error(err, errlen, "attention: unknown implementation %d: use flash or naive", (int)p->impl);
    if (p->dtype != DTYPE_F32 && p->dtype != DTYPE_BF16 && p->dtype != DTYPE_F16)
        return set_error(err, errlen, "attention: unknown dtype %d", (int)p->dtype);
    if (dev == DEVICE_CPU && p->dtype != DTYPE_F32)
        return set_error(err, errlen, "attention: the cpu implementation is fp32 only, got dtype %s: "
                                 "use fp32", dtype_name(p->dtype));
    // The naive path (impl naive, and on cuda every fp32 problem) overwrites dq, dk and dv in
    // dtype: it has no fp32 accumulators to add into.
    if (backward && p->accumulate && (p->impl == ATTN_IMPL_NAIVE || attn_runs_naive(p, dev)))
        return set_error(err, errlen,
                    "attention: accumulate (a sum over key chunks, as context parallelism's ring "
                    "makes) needs the flash backward: impl flash, and on cuda dtype bf16 or fp16 "
                    "(fp32 runs the naive kernels there, which overwrite dq, dk and dv)");
    if (backward && check_shared_rows(p, dev, err, errlen) != 0) return -1;
    if (p->pos_explicit && (p->q_pos0 < 0 || p->k_pos0 < 0 || p->q_pos0 + p->T_q > INT_MAX ||
                            p->k_pos0 + p->T_k > INT_MAX))
        return set_error(err, errlen,
                    "attention: explicit positions must lie in [0, 2^31): q_pos0 %lld, k_pos0 %lld",
                    (long long)p->q_pos0, (long long)p->k_pos0);
    if (p->pos_explicit && p->cu_seqlens)
        return set_error(err, errlen,
                    "attention: documents (cu_seqlens) index the flattened batch and cannot be "
                    "combined with explicit chunk positions");
    if (p->lse_batch_stride < 0 || p->lse_head_stride < 0 ||
        ((p->lse_batch_stride || p->lse_head_stride) &&
         !strides_disjoint((AttnStrides){p->lse_batch_stride ? p->lse_batch_stride
                                                             : (int64_t)p->NH * p->T_q,
                                         0, p->lse_head_stride ? p->lse_head_stride : p->T_q},
                           p->B, 1, p->NH, p->T_q)))
        return set_error(err, errlen,
                    "attention: lse strides (batch %lld, head %lld) make elements overlap for B=%d, "
                    "NH=%d, T_q=%d", (long long)p->lse_batch_stride,
                    (long long)p->lse_head_stride, p->B, p->NH, p->T_q);
    if (!(p->softcap >= 0.0f) || !isfinite(p->softcap))
        return set_error(err, errlen, "attention: softcap %g must be 0 (off) or a finite number > 0",
                         p->softcap);
    if (p->alibi_batch_stride < 0 || (p->alibi_batch_stride > 0 && p->alibi_batch_stride < p->NH))
        return set_error(err, errlen,
                         "attention: alibi_batch_stride %lld must be 0 (slopes (NH) shared by every "
                         "batch row) or at least NH = %d (slopes (B, NH))",
                         (long long)p->alibi_batch_stride, p->NH);
    if (p->alibi_batch_stride && !p->alibi_slopes)
        return set_error(err, errlen, "attention: alibi_batch_stride is %lld but alibi_slopes is NULL",
                         (long long)p->alibi_batch_stride);
    if (dev == DEVICE_CUDA && !attn_runs_naive(p, dev) && cuda_flash_lacks(p, backward, err, errlen) != 0)
        return -1;
    if (p->window_left < -1 || p->window_right < -1)
        return set_error(err, errlen,
                    "attention: window (left %d, right %d) must be -1 (unbounded) or >= 0",
                    p->window_left, p->window_right);
    if (!(p->dropout_p >= 0.0f && p->dropout_p < 1.0f))
        return set_error(err, errlen, "attention: dropout %g must be in [0, 1)", p->dropout_p);
    if (p->dropout_p > 0.0f && attn_dropout_threshold(p->dropout_p) == 0)
        return set_error(err, errlen, "attention: dropout %g is below the rule's resolution (1/256; it rounds to 0): "
                         "use 0 or at least 0.002", p->dropout_p);
    if (p->cu_seqlens) {
        if (p->T_q != p->T_k)
            return set_error(err, errlen, "attention: documents (cu_seqlens) need T_q == T_k, got %d and %d",
                        p->T_q, p->T_k);
        if (p->n_docs < 1)
            return set_error(err, errlen, "attention: cu_seqlens is set but n_docs is %d", p->n_docs);
        if (dev == DEVICE_CPU && check_docs(p, err, errlen) != 0) return -1;
    }
    if (check_sparse(p, dev, backward, err, errlen) != 0) return -1;
    if (!p->lse) return set_error(err, errlen, "attention: lse (B, NH, T_q) fp32 buffer is NULL");

    TensorDesc t[8] = {
        {"q", p->q, p->q_st, p->T_q, p->NH, 0},
        {"k", p->k, p->k_st, p->T_k, p->NKV, 0},
        {"v", p->v, p->v_st, p->T_k, p->NKV, 0},
        {"out", p->out, p->o_st, p->T_q, p->NH, !backward},
        {"dout", p->dout, p->do_st, p->T_q, p->NH, 0},
        {"dq", p->dq, p->dq_st, p->T_q, p->NH, 1},
        {"dk", p->dk, p->dk_st, p->T_k, p->NKV, 1},
        {"dv", p->dv, p->dv_st, p->T_k, p->NKV, 1},
    };
    int n = backward ? 8 : 4;
    for (int i = 0; i < n; i++)
        if (check_tensor(&t[i], p, dev, err, errlen) != 0) return -1;

    // A workspace the caller hands in must be large enough; without one the context uses its own.
    size_t need = attn_workspace_bytes(p, dev);
    if (need > 0 && p->workspace && p->workspace_bytes < need)
        return set_error(err, errlen, "attention: %s needs a workspace of %zu bytes, got %zu", devname, need,
                    p->workspace ? p->workspace_bytes : (size_t)0);
    return 0;
}

int attn_runs_naive(const AttnParams *p, Device dev) { return attn_route(p, dev).naive; }

// CPU: 0, each thread allocates its O(T + tile * (tile + HS)) scratch itself. CUDA (layouts in
// attention_cuda.cu, flash_mask.cuh and naive_cuda.cu): D = rowsum(dO * O) (B, NH, T_q) and the
// fp32 dQ accumulator (B, NH, T_q and HS rounded up to 64); the naive kernels, which also run every
// fp32 problem, add fp32 per-query-head dK and dV (B, NH, T_k, HS) under GQA and two
// (B, NH, T_q, T_k) fp32 matrices (scores / P, then P_drop / dP). A problem attn_decode runs on
// the split-KV kernel needs its partials instead (decode_plan.h), never both at once.

size_t attn_workspace_bytes(const AttnParams *p, Device dev) {
    if (dev == DEVICE_CPU) return 0;
    size_t rows_q = (size_t)p->B * p->NH * p->T_q, rows_k = (size_t)p->B * p->NH * p->T_k;
    size_t floats = rows_q + attn_dq_acc_floats(p);
    if (attn_runs_naive(p, dev)) {
        if (p->NKV < p->NH) floats += 2 * rows_k * (size_t)p->HS;
        floats += 2 * rows_q * (size_t)p->T_k;
    }
    const size_t split = decode_workspace_bytes(p);
    return floats * sizeof(float) > split ? floats * sizeof(float) : split;
}

// One size on every device: the CUDA kernels' tiled layout (flash_mask.cuh), of which the CPU
// reference uses the first B * NH * T_q * HS floats, (B, NH, T_q, HS) row-major.
size_t attn_dq_accum_floats(const AttnParams *p) { return attn_dq_acc_floats(p); }

int attn_visible(const AttnParams *p, int b, int i, int j) {
    AttnKeyRange r = attn_key_range(p, b, i);
    return j >= r.lo && j < r.hi && attn_block_present(p, i, j);
}

int attn_dropout_keep(const AttnParams *p, int b, int h, int i, int j) {
    return attn_dropout_keep_at(p, attn_dropout_offset(p), b, h, i, j);
}

float attn_dropout_keep_scale(const AttnParams *p) { return attn_dropout_scale(p->dropout_p); }
