// gpt: the GPT-2 model, written once over the Backend ops (model/backend.h). Owns the flat
// parameter and gradient buffers, the activations and the KV cache used by sampling.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "common/config.h"
#include "model/backend.h"
#include "model/ring_attention.h"


typedef struct {
    int V, Vp;     // vocabulary, padded to a multiple of 128
    int maxT;      // max sequence length
    int L, NH, NKV, C, HS;
    PosEmbedding pos;   // learned: wpe table; rope: q/k rotation (half-split); alibi: slopes
    float rope_theta;   // RoPE base frequency (see gpt_rope_table_host)
    int rope_dims;      // RoPE: dimensions rotated per head (even, <= HS); 0 = all HS
} GPTConfig;

// One named parameter tensor inside the flat parameter vector (element offsets).
typedef struct {
    char name[64];    // e.g. "h.3.attn.qkv.weight"
    size_t offset, numel;
    int ndim, shape[2];
    int decay;        // receives weight decay
} ParamTensor;

typedef struct GPT GPT;   // opaque: see model/gpt.c

GPTConfig gpt_config_from(const Config *c);
// The RoPE table (maxT, HS/2, 2) into host fp32: [cos, sin] of the angle pos * inv_freq(d) of
// the half-split pair (x[d], x[d + HS/2]). With R = rope_dims (0 = HS), the pairs d < R/2 turn
// at inv_freq = theta^(-2d/R) (the full frequency range over the rotated pairs, as GPT-NeoX's
// rotary_pct, whose rotated dimensions are the first R; here they are d and d + HS/2, d < R/2);
// the pairs d >= R/2 are never rotated (cos 1, sin 0) and carry no position.
void gpt_rope_table_host(const GPTConfig *g, float *host);
// Builds the model on `be` for batches up to B x T. Parameters are not initialised.
GPT *gpt_create(const GPTConfig *cfg, Backend *be, int B, int T, const Config *run);
void gpt_free(GPT *m);

const GPTConfig *gpt_cfg(const GPT *m);
Backend *gpt_backend(const GPT *m);
size_t gpt_num_params(const GPT *m);                       // elements in the flat vector
int gpt_num_tensors(const GPT *m);
const ParamTensor *gpt_tensor(const GPT *m, int i);
void *gpt_params(GPT *m);   // backend memory, dtype elements, (gpt_num_params)
void *gpt_grads(GPT *m);    // backend memory, dtype elements, (gpt_num_params)

// GPT-2 initialisation (normal std 0.02, residual projections 0.02/sqrt(2L), biases 0, LN 1/0,
// padded vocabulary rows 0) into host fp32 (gpt_num_params), deterministic in seed.
void gpt_init_weights_host(const GPT *m, float *host, uint64_t seed);
void gpt_set_params_f32(GPT *m, const float *host);   // host fp32 -> backend
void gpt_get_params_f32(GPT *m, float *host);
void gpt_get_grads_f32(GPT *m, float *host);

// Forward over tokens (B,T) host int32. With targets (B,T) (entries < 0 ignored) returns the
// mean loss over non-ignored targets and keeps what backward needs; without, returns 0.
// With attention.doc_mask the rows are split into documents after each data.eot_token (see
// model/gpt.c): attention stays inside each document and positions restart in each.
// Logits of the last forward are available through gpt_logits_f32.
float gpt_forward(GPT *m, const int *tokens, const int *targets, int B, int T);
// The training forward of a step that does not wait for the device: the batch is already in
// backend memory (dev: tokens then targets, (2, B, T) int32, e.g. copied there asynchronously by
// the caller; host: the same values in host memory, for the id checks and the target count), and
// the loss stays there: the micro-batch's mean loss is added to *loss_acc (backend fp64, 1) by
// Backend.loss_mean_add. Returns the number of counted targets (the backward divides by it).
// Neither attention.doc_mask nor context parallelism (they need gpt_forward); gpt_loss_sum and
// gpt_losses_f32 do not describe it.
int gpt_forward_async(GPT *m, const int *host, const int *dev, int B, int T, double *loss_acc);
// The checks gpt_forward makes of a batch (its size, every id in the vocabulary; targets may be
// NULL): exits 2 with a message that names the bad id.
void gpt_check_batch(const GPT *m, const int *tokens, const int *targets, int B, int T);
// The sum of the last forward's per-token losses over its counted targets (double), and their
// number in *count.
double gpt_loss_sum(const GPT *m, int *count);
// The number of targets the loss of the last forward is a mean over, for its backward: by
// default its own count; under context parallelism the whole ring's (each rank holds part of
// each sequence, and the loss is the mean over all of its tokens). 0 = no gradient.
void gpt_set_loss_tokens(GPT *m, long long n);
// Context parallelism: this process holds the local tokens of ring rank link->rank of
// link->size (model/ring_attention.h's zigzag layout) of every sequence, T (gpt_create's) of
// them, T even. Positions (learned, RoPE, ALiBi) become the tokens' global positions and every
// training forward and backward runs its attention around the ring, so every rank of the ring
// must make the same calls. Decoding stays local. Returns 0, or -1 with err set (and m as it
// was) with doc_mask, attention dropout, the naive attention, or an odd or too long split.
int gpt_set_ring(GPT *m, const RingLink *link, char *err, size_t errlen);
// Backward of the last forward with targets; gradients ACCUMULATE into gpt_grads, scaled by
// grad_scale (1/grad_accum times the loss scale). Returns nothing; call gpt_zero_grad first.
void gpt_backward(GPT *m, float grad_scale);
// Called by gpt_backward with a block [offset, offset + count) of the flat gradient vector as
// soon as this backward has finished writing it (on CUDA: its kernels are queued on the
// backend's stream, not necessarily done): data parallelism starts reducing it while the
// earlier layers' backward runs. The blocks tile the vector and come in descending order of
// offset, each adjacent to the one before: lnf, layers L-1 down to 0, wpe (learned positions
// only), wte. Every backward reports every block once, also when all its targets were ignored.
typedef void (*GradReadyFn)(void *ctx, size_t offset, size_t count);
// fn NULL (the default): no calls.
void gpt_set_grad_ready_hook(GPT *m, GradReadyFn fn, void *ctx);
void gpt_zero_grad(GPT *m);
// Training mode (the default) applies attention.dropout and model.dropout in forwards with
// targets; evaluation turns them off with gpt_set_training(m, 0). Decoding never drops.
void gpt_set_training(GPT *m, int training);
// The micro-step (e.g. step * grad_accum + micro-step) whose dropout masks the next forwards
// draw: masks are a pure function of train.seed, this number, the layer and the site, so a
// resumed run regenerates them. Default 0; forwards with the same rng step draw the same masks.
void gpt_set_rng_step(GPT *m, uint64_t step);
// Dropout masks counted from a base in backend memory (a CUDA graph captured once replays with
// every step's masks): queues the write of `base` into the model's counter (behind the ops
// before it, no wait; not inside a graph capture, where the value would be baked in). From the
// first call on, a forward after gpt_set_rng_step(m, s) draws the masks of micro-step base + s
// (bitwise those gpt_set_rng_step(m, base + s) draws without the counter), with base read by
// the kernels when they run. Nothing when the model has no dropout.
void gpt_set_rng_base(GPT *m, uint64_t base);
// Per-token losses (B*T) of the last forward with targets, fp32 host copy.
void gpt_losses_f32(GPT *m, float *host);
// Logits (B,T,V) of the last forward (its real V columns), fp32 host: computed on this call,
// chunk by chunk, from that forward's final LayerNorm output and the current weights (the
// forward itself never holds the whole batch's logits).
void gpt_logits_f32(GPT *m, float *host);
// Rows per classifier chunk (logits, loss and their gradient): by default as many as 2 GiB of
// logits hold, at most B*T; fewer (1 up to that default) to test or to save memory. Returns 0,
// or -1 with err set (nothing changed) for rows outside that range.
int gpt_set_head_rows(GPT *m, int rows, char *err, size_t errlen);

// Incremental decoding with a KV cache: feed B sequences' tokens (B) at position pos (0, 1,
// 2, ..., the same for every sequence), receive logits (B, V) fp32 host for their next tokens.
// pos 0 resets the cache. The cache, per layer (B, NKV, T, HS) for the keys and the same for
// the values, is made by gpt_decode_reserve (B sequences of T positions) or, without it, by the
// first step (its B, T = max_seq_len) and keeps its size; a step with another B, or past its T
// positions, is refused. Positions are not split into documents here (eot tokens are
// ordinary tokens). gpt_decode_step is the batch of one.
void gpt_decode_batch(GPT *m, const int *tokens, int B, int pos, float *logits_out);
void gpt_decode_step(GPT *m, int token, int pos, float *logits_out);
// Prefill: feeds one prompt of n tokens to all B cached sequences at positions pos .. pos+n-1
// (pos <= the positions cached, pos + n <= max_seq_len) as gpt_decode_batch would one position
// at a time, but in a few forward passes: chunks of up to gpt_set_prefill_rows' rows, each
// through the whole model, whose causal attention (the flash kernels, T_q the chunk's rows
// against T_k = its last position + 1) reads the cache the chunk has just written its keys and
// values into. Sequence 0's cache is computed and the others' copied from it. logits_out
// (B, V) fp32 host receives the next-token logits of the last prompt token for every sequence.
// The same results as the steps to rounding (the chunks' matmuls and attention sum in another
// order); the chunks end on multiples of ATTN_SPARSE_BLOCK, so a block-sparse layer reads the
// blocks of training's query blocks, as a step does.
void gpt_decode_prefill(GPT *m, const int *tokens, int n, int B, int pos, float *logits_out);
// Rows per prefill chunk: by default min(max_seq_len, 4096); fewer (1 up to that default) to
// test or to save memory. Where the attention is materialised (attention.impl naive, or fp32 on
// CUDA), the chunks also keep its score matrices within 1 GiB. Returns 0, or -1 with err set
// (nothing changed) for rows outside that range.
int gpt_set_prefill_rows(GPT *m, int rows, char *err, size_t errlen);
// Makes the decode buffers for B sequences of up to T positions each (1 <= T <= max_seq_len: a
// sample needs its context, prompt and new tokens), that is the cache, one step's activations
// and the prefill chunk's (min(T, the chunk rows) rows), after checking that they fit the
// device's free memory (the host's physical memory on the CPU): 0, or -1 with err naming the
// bytes needed and free, before anything is allocated. 0 when they already exist for B and at
// least T positions; -1 for another B or more positions.
int gpt_decode_reserve(GPT *m, int B, int T, char *err, size_t errlen);
// Positions per sequence the decode cache holds (or will hold when the first step makes it):
// gpt_decode_reserve's T, else max_seq_len.
int gpt_decode_positions(const GPT *m);
// A timing aid: marks the first pos positions of every sequence as cached without computing
// them (their keys and values are what the cache holds: zeros when it is new), so that the next
// step may feed position pos and costs what a step at that context length costs. Needs the
// buffers (gpt_decode_reserve); pos in [0, the cache's positions).
void gpt_decode_seek(GPT *m, int pos);
// Decode attention through attn_decode, the split-KV kernel on CUDA (on = 1, the default), or
// through attn_forward as training's attention (on = 0): the same results to rounding.
void gpt_set_decode_split(GPT *m, int on);
