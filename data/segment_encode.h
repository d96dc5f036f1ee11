// segment_encode: the ids of a batch of segments, computed by OpenMP threads over runs of whole
// segments and joined in input order.
#pragma once
#include <stddef.h>

#include "data/gpt2_bpe.h"
#include "data/segmenter.h"
#include "data/tokenizer.h"

typedef struct {
    const Gpt2Bpe *bpe;        // GPT-2's BPE; NULL: `table` encodes (char and byte vocabularies)
    const Tokenizer *table;
    int eot;                   // goes before each document's first segment; -1: none
    int threads;               // <= 0: all OpenMP threads
} SegmentEncoder;

typedef struct {
    int *p;
    size_t n, cap;
} IdBuf;

// Sets ids to the ids of segs[0, n) over text, in order, and counts[i] to segment i's number of
// ids. -1 with err when a character is outside a table vocabulary (the input changed between
// the passes that built and used it) or GPT-2's encoder failed (out of memory, PCRE2).
int segments_encode(const SegmentEncoder *e, const char *text, const Segment *segs, size_t n, IdBuf *ids,
                    size_t *counts, char *err, size_t errlen);
