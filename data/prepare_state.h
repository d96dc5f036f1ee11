// prepare_state: PREFIX_prepare_state.json, what a sharded prepare has finished. It holds the
// settings of the run (a resumed run must have the same ones: same inputs, sizes and times,
// tokenizer, options) and the position of the first token that is not yet in a complete shard.
// It is rewritten atomically after every shard, so it never points past what is on disk.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "data/doc_stream.h"

typedef struct {
    int started;            // 0: nothing written yet, start from the beginning of the input
    DocPos pos;             // the segment the next token comes from
    uint64_t skip_tokens;   // ids of that segment already in complete shards
    int in_val;             // documents still go to val
    int complete;           // every shard is written
    uint64_t docs, val_tokens, train_tokens, raw_done;
    int val_shards, train_shards;
} PrepareState;

// Writes path atomically: settings (an object of named values) and s. 0, or -1 with err.
int prepare_state_save(const char *path, const cJSON *settings, const PrepareState *s, char *err, size_t errlen);
// Reads path into s after checking that its settings equal `settings`; err names the first
// setting that differs (with both values) and what to do. 0, or -1 with err.
int prepare_state_load(const char *path, const cJSON *settings, PrepareState *s, char *err, size_t errlen);
