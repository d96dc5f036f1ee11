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

// Segments: cut at the first safe place after 1 MB, at 4 MB when there is none. Each segment is
// encoded with a merge cache of its own (one gpt2_bpe_encode call), so longer is cheaper, and
// 1 MB still gives every thread several; the target is a constant so that a resumed run, with
// any number of threads, cuts alike.
#define PIPELINE_SEGMENT_TARGET (1u << 20)
#define PIPELINE_SEGMENT_MAX (4u << 20)
// Text gathered before a batch is encoded: 4 segments per thread even out the threads' load,
// within 16..64 MB (the batch and its ids are most of prepare's memory).
#define PIPELINE_BATCH_MIN (16u << 20)
#define PIPELINE_BATCH_MAX (64u << 20)

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
    size_t batch_bytes;         // 0: from the thread count (PIPELINE_BATCH_MIN..MAX)
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
