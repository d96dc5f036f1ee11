// shard_set: the shards of one split as tokens arrive: PREFIX_train_000000.bin, ... of
// shard_tokens tokens each (the last one shorter), or, in the single-file layout,
// PREFIX_train.bin alone. Each shard is a shard_out: complete under its final name, or absent.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "data/shard_out.h"

#define SHARD_SET_PATH_MAX 4096

typedef struct {
    char base[SHARD_SET_PATH_MAX];   // PREFIX_train, PREFIX_val
    int numbered;                    // several numbered shards; else one file, base.bin
    uint64_t shard_tokens;           // tokens per shard (the single file: at most INT32_MAX)
    ShardVersion version;
    int done;                        // shards complete (committed, or closed in the single layout)
    uint64_t tokens;                 // in complete shards and the open one
    ShardOut cur;
    int open;
} ShardSet;

void shard_set_init(ShardSet *s, const char *base, int numbered, uint64_t shard_tokens, ShardVersion v);
// The name of shard `index` (numbered), or of the single file.
void shard_set_path(const ShardSet *s, int index, char *out, size_t n);
// Appends ids[0, n) to the open shard (opening one when none is), stopping when it is full:
// *taken is how many went in. 0, or -1 with err.
int shard_set_write(ShardSet *s, const int *ids, size_t n, size_t *taken, char *err, size_t errlen);
int shard_set_full(const ShardSet *s);
// Completes the open shard (nothing when none is open or it is empty): closed, and renamed to
// its final name unless commit is 0 (the single layout renames its files together at the end).
int shard_set_finish(ShardSet *s, int commit, char *err, size_t errlen);
// Renames the closed single file (shard_set_finish with commit 0) to its final name.
int shard_set_commit(ShardSet *s, char *err, size_t errlen);
// Removes the open or closed-but-uncommitted shard's temporary file.
void shard_set_discard(ShardSet *s);
