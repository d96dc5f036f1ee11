// backend: the small set of ops the GPT is written against. The model (model/gpt.c) calls only
// these; model/cpu/ implements them in fp32 (the reference) and model/cuda/ in bf16, fp16 and
// fp32.
//
// Conventions:
// - Every pointer is backend memory; tensors are row-major, shapes are given in comments.
// - Weights, activations and their gradients have the element type `dtype`. Tensors typed
//   float* (LayerNorm statistics, losses) are fp32 everywhere; token ids are int32.
// - Linear weights are (OC, C) as in PyTorch: out = inp @ w^T + bias.
// - Parameter gradients ACCUMULATE (+=) so micro-steps add up; activation gradients are
//   OVERWRITTEN (=) except where an op says it accumulates.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "attention/attention.h"
#include "common/dtype.h"

typedef enum { EPI_NONE = 0, EPI_GELU = 1 } Epilogue;  // matmul epilogue (tanh-approximate GELU)

// A dropout mask (Backend.dropout's rule), for the dropout op or applied inside another op to one
// of its tensors, over that tensor's flat element index: each element becomes its value times
// attn_dropout_scale(p) when kept, 0 when dropped, rounded to the dtype, exactly what the dropout
// op would have left there. A NULL DropMask, or p == 0, applies nothing.
typedef struct {
    float p;
    uint64_t seed, offset;
    const uint64_t *offset_dev;
} DropMask;


typedef struct Backend Backend;
struct Backend {
    const char *name;          // "cpu" or "cuda"
    DType dtype;
    Device device;
    void *stream;              // the cudaStream_t the ops run on, for work queued beside them
                               // (the optimizer, collectives); NULL on the CPU
    const char *device_name;   // the GPU's name ("NVIDIA H200"), or "cpu"
    int compute_capability;    // 10 * major + minor (90 for 9.0); 0 on the CPU
    AttnContext *attn;         // the attention module's context on this device and stream
    void *ctx;                 // backend-private state (handles, workspaces)

    void (*destroy)(Backend *be);

    // ---- memory ----
    void *(*alloc)(Backend *be, size_t bytes);  // zero-filled; exits with a message on failure
    void (*release)(Backend *be, void *p);
    void (*fill_zero)(Backend *be, void *p, size_t bytes);
    void (*copy)(Backend *be, void *dst, const void *src, size_t bytes);           // within backend
    // rows blocks of width bytes, from src every src_pitch bytes to dst every dst_pitch bytes
    // (within backend; the regions must not overlap): one column block of a row-major matrix.
    void (*copy_2d)(Backend *be, void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                    size_t width, size_t rows);
    void (*upload)(Backend *be, void *dst, const void *host, size_t bytes);        // raw bytes
    void (*download)(Backend *be, void *host, const void *src, size_t bytes);      // raw bytes
    void (*upload_f32)(Backend *be, void *dst, const float *host, size_t n);       // fp32 -> dtype
    void (*download_f32)(Backend *be, float *host, const void *src, size_t n);     // dtype -> fp32
    void (*synchronize)(Backend *be);
    // Device memory in bytes: free now, and in use (total - free: every allocation of this
    // process, the CUDA context and library workspaces included). Returns 0 without device
    // memory to report (the CPU), 1 otherwise.
    int (*memory)(Backend *be, size_t *free_bytes, size_t *used_bytes);

    // ---- ops ----
    // out (B,T,C) = wte[tokens] + wpe[pos]; pos (B,T) or NULL for pos = t.
    void (*embed_forward)(Backend *be, void *out, const int *tokens, const int *pos, const void *wte,
                          const void *wpe, int B, int T, int C);
    // dwte (V,C) += scatter(dout), dwpe (P,C) += scatter(dout) (dwpe may be NULL when there is
    // no table).
    void (*embed_backward)(Backend *be, void *dwte, void *dwpe, const void *dout, const int *tokens,
                           const int *pos, int B, int T, int C, int V, int P);
    // out (N,C) = (inp - mean) * rstd * w + b; mean, rstd (N) fp32 saved for backward.
    void (*layernorm_forward)(Backend *be, void *out, float *mean, float *rstd, const void *inp,
                              const void *w, const void *b, int N, int C);
    // dinp (N,C) ACCUMULATES (it is the residual stream's gradient); dw, db (C) accumulate.
    // dcopy (N,C), or NULL, receives dinp's new values too (the residual gradient the branch
    // below starts from: the backward of the residual add, fused), through dcopy_drop (the
    // backward of that branch's residual dropout, fused; NULL: none).
    void (*layernorm_backward)(Backend *be, void *dinp, void *dcopy, void *dw, void *db,
                               const void *dout, const void *inp, const void *w, const float *mean,
                               const float *rstd, int N, int C, const DropMask *dcopy_drop);
    // out (N,OC) = epi(inp (N,C) @ w (OC,C)^T + bias (OC or NULL)). With EPI_GELU, pre (N,OC)
    // receives the values before GELU (needed by backward); otherwise pre is NULL.
    void (*matmul_forward)(Backend *be, void *out, void *pre, const void *inp, const void *w,
                           const void *bias, int N, int C, int OC, Epilogue epi);
    // dout (N,OC) is the gradient of matmul_forward's out; with EPI_GELU the GELU backward is
    // applied first using pre. dinp (N,C) overwritten (NULL = not needed); dw, dbias accumulate.
    // dout may be used as scratch (it is dead after this call).
    void (*matmul_backward)(Backend *be, void *dinp, void *dw, void *dbias, void *dout,
                            const void *pre, const void *inp, const void *w, int N, int C, int OC,
                            Epilogue epi);
    // out = a + b_drop(b) over n elements (out may alias a or b; b_drop NULL: b as it is).
    void (*add)(Backend *be, void *out, const void *a, const void *b, size_t n,
                const DropMask *b_drop);
    // fp32 accumulators (context parallelism's ring): acc += x over n fp32 elements, and the
    // store of rows of width elements from fp32 src (every src_pitch elements), plus the fp32
    // addend `add` of the same layout unless it is NULL, into dst of dtype (every dst_pitch
    // elements), each value rounded once.
    void (*add_f32)(Backend *be, float *acc, const float *x, size_t n);
    void (*store_f32)(Backend *be, void *dst, size_t dst_pitch, const float *src, const float *add,
                      size_t src_pitch, size_t width, size_t rows);
    // Fused softmax cross-entropy over logits (N,Vp), of which the first V columns are real;
    // target < 0 means "ignore" (loss 0, no gradient). With dscale == 0: losses (N) fp32 receive
    // -log softmax[target] and lse (N) fp32 the log-sum-exp of each row; the logits are left
    // alone. With dscale != 0: the logits are overwritten with dlogits = dscale * (softmax -
    // onehot) on the real columns and 0 on the padded ones (and on ignored rows), softmax taken
    // from the lse of an earlier dscale == 0 call on the same logits; losses are not written.
    void (*softmax_xent)(Backend *be, void *logits, float *losses, float *lse, const int *targets,
                         int N, int V, int Vp, float dscale);
    // Dropout in place over x (n) by mask d (NULL or p == 0: none), 0 <= p < 1: element i becomes
    // x[i] * attn_dropout_scale(p) (the inverse of the kept share, p to the nearest 1/256) when
    // kept, 0 when dropped; kept iff attn_philox_keep(seed, offset, i, p) (attention/philox.h), so
    // every backend and every thread count drops the same elements. Applied to a gradient with
    // the same mask it is its own backward. offset_dev: NULL, or one uint64 of backend memory
    // added to offset when the op runs (AttnParams.offset_dev's rule: a captured graph's
    // per-step part).
    void (*dropout)(Backend *be, void *x, size_t n, const DropMask *d);
    // Rotary position embedding, half-split convention (GPT-NeoX, Llama): in place on the query
    // and key heads of the fused buffer qkv (N, (NH + 2*NKV) * HS); the value heads are left
    // alone. In each of the first NH + NKV heads the pairs (x[d], x[d + HS/2]), d < HS/2, turn by
    // the table's angle a (pos * theta^(-2d/HS) when every dimension rotates; gpt_rope_table_host):
    // x'[d] = x[d] cos a - x[d + HS/2] sin a, x'[d + HS/2] = x[d + HS/2] cos a + x[d] sin a.
    // table (maxT, HS/2, 2) fp32 holds [cos a, sin a] per position and pair (computed once per
    // model); pos (N) int32 token positions, or NULL for i % T.
    void (*rope_forward)(Backend *be, void *qkv, const float *table, const int *pos, int N, int T,
                         int NH, int NKV, int HS);
    // Its backward on dqkv (N, (NH + 2*NKV) * HS), in place: the inverse rotation (angle -a) of
    // the query and key gradients (a rotation's transpose is its inverse); value heads untouched.
    void (*rope_backward)(Backend *be, void *dqkv, const float *table, const int *pos, int N, int T,
                          int NH, int NKV, int HS);
    // p (n fp32) = value everywhere (the ring's "no key seen yet" lse of +INFINITY).
    void (*fill_f32)(Backend *be, float *p, float value, size_t n);
    // *p (one uint64 of backend memory) = value, queued behind the ops before it (no wait): a
    // per-step number the ops of a captured graph read when they run.
    void (*set_u64)(Backend *be, uint64_t *p, uint64_t value);

    // ---- training steps without host waits (trainer/train_step.c) ----
    // Host memory the device copies from asynchronously (page-locked on CUDA); zero-filled.
    void *(*host_alloc)(Backend *be, size_t bytes);
    void (*host_release)(Backend *be, void *p);
    // Queues the copy of bytes from host (host_alloc memory) to dst and returns at once, then
    // marks fence `slot` (0 or 1) behind it; upload_wait(slot) returns once the device has passed
    // that fence, after which the host memory of the copies before it may be rewritten.
    void (*upload_async)(Backend *be, void *dst, const void *host, size_t bytes, int slot);
    void (*upload_wait)(Backend *be, int slot);
    // acc (1) fp64 += the mean of losses (N) fp32 over the n_valid rows with targets[i] >= 0:
    // the sum in double, divided by n_valid and rounded to fp32 (as gpt_forward's float return
    // value), then added; nothing when n_valid is 0. On the device, no wait.
    void (*loss_mean_add)(Backend *be, double *acc, const float *losses, const int *targets, int N,
                          int n_valid);
    // CUDA graphs: capture_begin makes the ops queued on the stream from then on be recorded
    // instead of run; capture_end stops and returns the executable graph, or NULL with a message
    // in err (the device refused something recorded, or the backend has no graphs: then
    // capture_begin already returns -1 with the message). graph_launch queues one replay and
    // returns 0, or -1 without queueing anything when the graph is stale (a workspace it recorded
    // has been reallocated since, by a larger op between steps): capture it again.
    int (*capture_begin)(Backend *be, char *err, size_t errlen);
    void *(*capture_end)(Backend *be, char *err, size_t errlen);
    int (*graph_launch)(Backend *be, void *graph);
    void (*graph_free)(Backend *be, void *graph);
    // The residual add and the LayerNorm after it in one pass: res (N,C) = a + b_drop(b) (the
    // branch's residual dropout fused; NULL: b as it is), rounded once to the dtype (res may
    // alias a or b; b is left as it is), then out = LayerNorm(res) as layernorm_forward.
    void (*add_layernorm_forward)(Backend *be, void *res, void *out, float *mean, float *rstd,
                                  const void *a, const void *b, const void *w, const void *bias,
                                  int N, int C, const DropMask *b_drop);

    // ---- device time (benchmark breakdowns) ----
    // A mark is a point in the backend's queue: mark_record places it after the work queued so
    // far (a CUDA event on the stream; on the CPU, whose ops are done when they return, the host
    // clock), and mark_elapsed_ms waits for mark b and returns the milliseconds from a to b.
    void *(*mark_create)(Backend *be);
    void (*mark_record)(Backend *be, void *mark);
    double (*mark_elapsed_ms)(Backend *be, void *a, void *b);
    void (*mark_free)(Backend *be, void *mark);
};

// Attention forward (backward = 0) or backward on be's attention context, in be's dtype. A
// problem the module refuses (its message names its own parameters) ends the run with exit 2
// and the message told in the config's terms (model/backend.c).
void backend_attention(Backend *be, AttnParams *p, int backward);
// Decode-step attention forward (attn_decode) on be's attention context, failing as
// backend_attention does.
void backend_attention_decode(Backend *be, AttnParams *p);
// The exact merge of a partial attention result over other keys into acc (attn_merge), on be's
// attention context; exits 2 with the module's message where the device has none.
void backend_attention_merge(Backend *be, const AttnParams *acc, const AttnParams *part);
// dq from the dQ accumulator of backward calls over several key sets (attn_dq_accum_store), on
// be's attention context, failing as backend_attention does.
void backend_attention_dq_store(Backend *be, const AttnParams *p);
// The attention context of a new backend; exits 2 with the module's message when the device
// cannot serve `kernel`.
AttnContext *backend_attention_context(Device dev, void *stream, AttnKernel kernel);

Backend *backend_cpu_create(void);
#ifdef FLASHGPT_CUDA
// kernel: the attention kernel family (attention.kernel).
Backend *backend_cuda_create(DType dtype, int device, AttnKernel kernel);
// CUDA GPUs this process can use; 0 when there is none or no driver (never fails).
int backend_cuda_device_count(void);
#endif
