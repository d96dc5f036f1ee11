// segmenter: pieces of documents into segments, the stretches of text that are encoded on their
// own (and in parallel). A segment ends at its document's end or at a safe cut, a place where
// GPT-2's pre-tokenizer always splits whatever comes before or after, so the ids of the segments
// one after the other are exactly the ids of the whole document; for the char and byte
// tokenizers every cut is exact. Cuts depend only on the text from the segment's start, never on
// how the input was read, so a resumed run finds the same segments.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "data/bytebuf.h"
#include "data/doc_stream.h"

typedef struct {
    size_t start, len;     // bytes of the batch's text
    int doc_start;         // its document's first segment: an end-of-text token goes first
    int part;              // DocPiece.part
    int hard_cut;          // ended at max bytes with no safe cut: the ids there may differ from the
                           // whole document's
    DocPos pos;            // where its text starts in the input (resume)
    uint64_t raw_pos;
} Segment;

typedef struct {
    size_t target;         // a segment ends at the first safe cut after target bytes...
    size_t max;            // ...or at max bytes (at a character boundary) when there is none
    DocFormat format;      // how a position advances inside a document
} SegmenterParams;

typedef struct {
    SegmenterParams p;
    ByteBuf text;          // the closed segments' bytes, then the open segment's
    Segment *seg;          // (n) closed segments, in input order
    size_t n, cap;
    Segment open;          // the segment still growing (when has_open)
    int has_open;
    size_t scan;           // offset inside the open segment of the next place to test as a cut
} Batch;

void batch_init(Batch *b, const SegmenterParams *p);
void batch_free(Batch *b);
// Appends a piece: its bytes join the open segment (a new one when it starts a document), which
// is closed at every safe cut past the target and at the piece's document end.
void batch_add(Batch *b, const DocPiece *piece);
size_t batch_closed_bytes(const Batch *b);
// Drops the closed segments (once encoded); the open one moves to the front.
void batch_clear_closed(Batch *b);
// pos moved n bytes further into its document.
DocPos doc_pos_advance(DocPos pos, DocFormat format, uint64_t n);
