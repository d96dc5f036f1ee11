// dataset: where training and validation batches come from, token shards (data.train/val glob
// patterns, llm.c format) or a built-in synthetic task (data.synthetic). The training loop sees
// one interface for both.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "common/config.h"

typedef enum { SPLIT_TRAIN = 0, SPLIT_VAL = 1 } Split;

typedef struct Dataset Dataset;   // opaque

// The position of a dataset in its stream, saved in checkpoints so a resumed run reads exactly
// the batches it would have read.
typedef struct {
    uint64_t a, b, c;
} DatasetState;

// Opens the split for this rank of `world` ranks, for batches of B sequences of T tokens.
// Returns NULL with a message in err (naming the file, pattern or key) on bad input.
Dataset *dataset_open(const Config *c, Split split, int B, int T, int rank, int world, char *err,
                      size_t errlen);
void dataset_close(Dataset *d);
// Next batch: inputs (B,T) and targets (B,T) (targets = inputs shifted by one; a target < 0 is
// ignored by the loss). Wraps around at the end of the data (next epoch).
void dataset_next(Dataset *d, int *inputs, int *targets);
void dataset_rewind(Dataset *d);                 // back to the first batch (evaluation)
DatasetState dataset_get_state(const Dataset *d);
void dataset_set_state(Dataset *d, DatasetState s);
// Tokens in the split (per epoch, all ranks); for synthetic tasks 0 (infinite).
uint64_t dataset_num_tokens(const Dataset *d);
// For synthetic tasks: the lowest achievable mean loss in nats (entropy floor), else -1.
double dataset_loss_floor(const Dataset *d);
