// prepare_pipeline: the streaming loop of prepare. Pieces of documents (doc_stream) gather into
// a batch of segments (segmenter); each full batch is encoded by the threads (segment_encode)
// and its ids go, segment by segment, to val or train (shard_set). Memory is one batch of text
// and its ids, whatever the input size.
#pragma once
#include <stdint.h>
#include <stdio.h>

#include <cjson/cJSON.h>

#include "data/doc_stream.h"
#include "data/prepare_progress.h"
#include "data/prepare_state.h"
#include "data/segment_encode.h"
#include "data/segmenter.h"
#include "data/shard_set.h"

// Text gathered before a batch is encoded: enough for every thread to take several work items.
#define PIPELINE_BATCH_BYTES (16u << 20)
// Segments: cut at the first safe place after 256 KB, at 4 MB when there is none.
#define PIPELINE_SEGMENT_TARGET (256u << 10)
#define PIPELINE_SEGMENT_MAX (4u << 20)

typedef struct {
    const InputList *in;
    DocStreamOptions docs;
    SegmenterParams seg;
    SegmentEncoder enc;
    int single;                 // single-file layout: part 0 to train, part 1 to val, nothing renamed
    int val_by_tokens;          // shards: val takes whole documents until it holds val_goal_tokens
    uint64_t val_goal_tokens;   // tokens, else until val_goal_bytes input bytes are read; it always
    uint64_t val_goal_bytes;    // takes the first document (unless the state starts with train)
    ShardSet val, train;
    const char *state_path;     // shards: rewritten after every shard
    const cJSON *settings;
    PrepareState st;            // in: where to start (a resumed run); out: the totals
    Progress *progress;
    FILE *log;                  // warnings
    // out
    uint64_t hard_cuts, text_bytes;
    DocStreamStats doc_stats;
    int all_val;                // failed because no document was left for train
} Pipeline;

// Runs the whole input through. 0, or -1 with err; the open shard's temporary file is then
// removed, and complete shards stay (with the state that lets --resume continue after them).
int pipeline_run(Pipeline *pl, char *err, size_t errlen);
