// shard_out: one llm.c token shard written as its tokens arrive (data/shard.h's format), under a
// temporary name "PATH.tmp.<pid>" until it is complete: the header's count is filled in, the
// file is flushed to disk and renamed. An interrupted write never leaves a file under PATH, and
// the temporary name does not match a pattern ending in .bin.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "data/shard.h"

typedef struct {
    char *path, *tmp;   // final name, temporary name
    FILE *f;            // NULL once closed
    ShardVersion version;
    uint64_t n;         // tokens written
} ShardOut;

// Creates the temporary file with a placeholder header. 0, or -1 with err naming the file.
int shard_out_open(ShardOut *o, const char *path, ShardVersion version, char *err, size_t errlen);
// Appends n ids (each must fit the version). 0, or -1 with err (disk full, too many tokens).
int shard_out_write(ShardOut *o, const int *ids, size_t n, char *err, size_t errlen);
// Writes the header's count and makes the file durable, still under the temporary name.
int shard_out_close(ShardOut *o, char *err, size_t errlen);
// Renames the closed file to its final name (then durable in its directory).
int shard_out_commit(ShardOut *o, char *err, size_t errlen);
// Removes the temporary file (after a failure) and frees o; harmless after a commit.
void shard_out_discard(ShardOut *o);
