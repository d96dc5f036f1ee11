// ring_attention: causal attention over a sequence split across the ranks of a ring (context
// parallelism). The model reaches the other ranks only through a RingLink of callbacks (the
// trainer implements it over dist/'s Comm), so model/ stays free of dist/.
//
// Layout (zigzag, load-balanced under the causal mask): the sequence of T = size * T_local
// tokens is cut into 2 * size chunks of c = T_local / 2; rank r holds chunks r and
// 2 * size - 1 - r, in that order, as its T_local local tokens. Every rank then has the same
// amount of visible (query, key) pairs.
//
// Step s (1 <= s < size): rank r attends its queries to the K/V block of rank r - s, received
// straight from it, while its own block goes to rank r + s (point-to-point, not relayed), and
// the transfer of step s + 1 runs while step s computes. A (receiver, origin) pair with no
// visible (query, key) pair (the causal future, chunks wholly outside a sliding window) is
// neither computed nor sent: sender and receiver decide it from positions alone (and where the
// receiver reads one contiguous chunk of a block, only that chunk travels). Forward: the partial
// results merge through their log-sum-exp into an fp32 accumulator, exactly. Backward, from the
// saved output and global lse: each rank adds its queries' part of the origin's dK/dV in fp32
// into a chain buffer of the origin's block that travels from visitor to visitor two ring ranks
// apart (the visitors of the odd steps, and those of the even ones), each hop overlapping a step;
// a chain comes back to the origin after its last visit and joins its own fp32 accumulator (under
// the causal zigzag two chains, after the last two steps); dQ stays local (fp32 until the end). The calls of
// one set of queries (all the local ones, or one half: a span kind) share their per-query work
// (attention.h's dsum, dq_accum, with the flash backward): the first call of a kind computes its
// D = rowsum(dO * O) for the later ones, and every call adds its dQ into the kind's accumulator,
// which is stored once at the end (without the deterministic backward, whose dQ kernel adds into
// the fp32 dQ per call). Each wait is for one exchange alone, and on a GPU it is a stream
// dependency, so the host never blocks in the ring.
//
// Memory per rank: its own K/V block and two received ones of (B, T_local, 2 * NKV * HS), fp32
// dK/dV (own, three chain buffers, one come back) of the same shape, an fp32 output and dQ of (B,
// T_local, NH * HS), one partial output of the same shape, D (2 x (B, NH, T_local)) and the
// dQ accumulators of the kinds in use (the fp32 dQ's size for all the queries, half of it for
// one half; under the causal zigzag those two): O(T / size).
#pragma once
#include <stddef.h>

#include "model/backend.h"

typedef struct {
    void *ctx;
    int rank, size;  // this process's place in the ring and the ring's length
    // Starts sending send_bytes of send to ring rank dst and receiving recv_bytes from ring rank
    // src into recv (backend memory, untouched until the exchange is waited for; src sends as
    // many as are received); a NULL send or recv leaves that half out, not both. At most 4 are
    // in flight unwaited; between two ranks they arrive in the order started. Returns the
    // exchange's handle.
    int (*start)(void *ctx, const void *send, size_t send_bytes, int dst, void *recv,
                 size_t recv_bytes, int src);
    // Exchange `handle` is done for the work queued on the backend after this call: a stream
    // dependency on a GPU (the host goes on queueing), a finished exchange on the host.
    void (*wait)(void *ctx, int handle);
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

// The kinds of device work in the ring's calls, for benchmarks (ring_attention_time).
typedef enum {
    RING_PACK = 0,    // the own K/V block packed from the fused layout
    RING_KERNEL = 1,  // attention calls (backward: with D and the dQ conversion where they run)
    RING_MERGE = 2,   // the forward's merges of the parts into the fp32 output
    RING_FILL = 3,    // fills and zeroings of accumulators (lse, dK/dV, dQ)
    RING_ADD = 4,     // the returned dK/dV parts added into the own
    RING_STORE = 5,   // the fp32 accumulators stored in the dtype (the dQ accumulators' too)
    RING_N_PHASES = 6
} RingPhase;
extern const char *const RING_PHASE_NAMES[RING_N_PHASES];

typedef struct {
    double ms[2][RING_N_PHASES];  // [0] forward, [1] backward: device milliseconds, summed
    long ops[2][RING_N_PHASES];   // how many ops they were
} RingTimes;

// From now on every forward and backward adds the device time of each of its ops to *t (a
// backend mark after each op, all waited for at the end of the call); NULL stops it.
void ring_attention_time(RingAttention *ra, RingTimes *t);
