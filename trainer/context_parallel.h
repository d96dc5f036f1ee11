// context_parallel: dist.context_parallel's groups. The world's ranks form groups of CP
// consecutive ranks; the ranks of a group share every sequence (each holds train.seq_len / CP of
// its tokens in the zigzag layout of model/ring_attention.h) and run ring attention over a comm
// split off the world's; the groups are the data-parallel replicas (DP = world / CP), each
// reading its own slice of every global batch. Gradients are still reduced over the whole world
// (every rank's are partial sums for its own tokens), so ZeRO-1 shards over all DP x CP ranks.
#pragma once
#include <stddef.h>

#include "common/config.h"
#include "common/dtype.h"
#include "dist/comm.h"
#include "model/gpt.h"

typedef struct {
    int cp, cp_rank;   // ranks per group, this rank's place in its group (its ring rank)
    int dp, dp_rank;   // groups, this rank's group: its data-parallel slice
} CpLayout;

// The layout of rank `rank` of `world` for c's dist.context_parallel. Returns 0, or -1 with a
// message naming the keys to change (CP not dividing the world).
int cp_layout(const Config *c, int rank, int world, CpLayout *out, char *err, size_t errlen);
// Tokens of each sequence one rank holds: train.seq_len / dist.context_parallel.
int cp_local_len(const Config *c);

typedef struct ContextParallel ContextParallel;

// Splits world into the groups and gives m (built for cp_local_len tokens) its ring, into *out
// (NULL when dist.context_parallel is 1). Returns 0, or -1 with a message naming the keys when
// the launch or the model cannot serve it (nothing is left open). Every rank must call it.
// Close it before world.
int cp_open(Comm *world, const Config *c, GPT *m, ContextParallel **out, char *err, size_t errlen);
void cp_close(ContextParallel *cp);   // NULL is fine
const CpLayout *cp_get_layout(const ContextParallel *cp);
// This rank's tokens of each of B whole sequences: full (B, T) into local (B, T / CP).
void cp_take_local(const ContextParallel *cp, const int *full, int *local, int B, int T);
// buf (n <= COMM_HOST_MAX host doubles) becomes the sum over this rank's group.
void cp_group_sum(ContextParallel *cp, double *buf, size_t n);
