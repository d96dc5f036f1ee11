// ring_attention: causal attention over a sequence split across the ranks of a ring (context
// parallelism). The model reaches the other ranks only through a RingLink of callbacks (the
// trainer implements it over dist/'s Comm), so model/ stays free of dist/.
//
// Layout (zigzag, load-balanced under the causal mask): the sequence of T = size * T_local
// tokens is cut into 2 * size chunks of c = T_local / 2; rank r holds chunks r and
// 2 * size - 1 - r, in that order, as its T_local local tokens. Every rank then has the same
// amount of visible (query, key) pairs.
//
// Forward: the K/V block of each rank travels around the ring (size - 1 sends); each rank
// attends its local queries to every block with explicit chunk positions (attention.h) and
// merges the partial results through their log-sum-exp, exactly. Chunk pairs with no visible
// (query, key) pair (the causal future, chunks wholly outside a sliding window) are not computed;
// they are still sent, because the ring relays every block past every rank. Backward: the blocks
// travel again, each with an fp32 dK/dV accumulator; each rank adds its queries' contribution,
// computed from the saved output and global lse, so the accumulator that returns to its owner
// after size sends holds the block's full dK/dV; dQ stays local.
//
// Memory per rank: two K/V blocks and two dK/dV blocks of (B, T_local, 2 * NKV * HS) and one
// partial output of (B, c, NH * HS) plus its lse: O(T / size).
#pragma once
#include <stddef.h>

#include "model/backend.h"

typedef struct {
    void *ctx;
    int rank, size;  // this process's place in the ring and the ring's length
    // Starts sending `bytes` of send to the next rank (rank + 1 mod size) and receiving as many
    // from the previous one into recv (backend memory, untouched until wait). Several may be in
    // flight; between two ranks they arrive in the order they were started.
    void (*start)(void *ctx, const void *send, void *recv, size_t bytes);
    void (*wait)(void *ctx);  // finishes every started exchange
} RingLink;

// Global position of local token t (0 <= t < T_local, T_local even) of ring rank `rank`.
int ring_global_pos(int rank, int size, int T_local, int t);

typedef struct RingAttention RingAttention;

// For batches of B x T_local local tokens (T_local even) of a model with NH query and NKV
// key/value heads of size HS. The link is copied.
RingAttention *ring_attention_create(Backend *be, const RingLink *link, int B, int T_local, int NH,
                                     int NKV, int HS);
void ring_attention_free(RingAttention *ra);
// p: the local problem as the model describes it (fused QKV layout of attn_fused_qkv, T_q = T_k
// = T_local, causal, window, ALiBi; no documents, no dropout). Writes p->out and p->lse for the
// local queries over the whole sequence's keys. Every rank of the ring must call it.
void ring_attention_forward(RingAttention *ra, const AttnParams *p);
// The backward of the last forward with the same p (attn_fused_qkv_grads set): dq, dk, dv of
// the local tokens, OVERWRITTEN. Every rank of the ring must call it.
void ring_attention_backward(RingAttention *ra, const AttnParams *p);
