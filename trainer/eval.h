// eval: the mean validation loss of a model over a dataset, the same loop for the training run's
// periodic evaluation and for `train_gpt eval`, and the loss by token position (long context).
#pragma once
#include "data/dataset.h"
#include "dist/comm.h"
#include "model/gpt.h"
#include "trainer/context_parallel.h"

// Batches of B x T that cover at most `tokens` tokens of d without reading a window twice (at
// least 1); synthetic data (0 tokens) is unbounded.
long long eval_batches(const Dataset *d, int B, int T, long long tokens);
// Mean loss over the non-ignored targets of n_batches batches from the start of d, over every
// rank of comm (NULL: this process alone; each rank reads its slice of every batch). T is the
// whole sequence; with cp (NULL: none) each rank runs its part of each (the model built for
// cp_local_len tokens), and the sum over comm counts every token once. Leaves the model in
// training mode.
double eval_loss(GPT *m, Dataset *d, int B, int T, long long n_batches, Comm *comm,
                 const ContextParallel *cp);

// The mean loss of the targets at window positions [first, last] (1-based: the target at
// position p is predicted from p tokens of context).
typedef struct {
    int first, last;
    double loss;          // NAN when no target counted
    long long targets;
} EvalBucket;
// The buckets 1-128, 129-256, 257-512, ... (each twice the last), the last one cut at T; at
// most max. Returns their number.
int eval_position_buckets(int T, EvalBucket *buckets, int max);
// eval_loss on this process alone (no context parallelism) that also fills the buckets' loss
// and targets. Returns the mean loss over all positions.
double eval_loss_by_position(GPT *m, Dataset *d, int B, int T, long long n_batches, EvalBucket *buckets,
                             int n_buckets);
