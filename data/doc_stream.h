// doc_stream: the documents of prepare's inputs, handed out as pieces of text in input order.
// A document is a JSONL record's text field (--jsonl-field), else the text between separators
// (--doc-separator: the separator stays at the end of the document it closes) or a whole file.
// Memory stays at one read-ahead window (or one JSONL line, at most DOC_STREAM_MAX_LINE bytes)
// whatever the size of a document or file.
#pragma once
#include <stdint.h>
#include <stdio.h>

#include "data/input_list.h"

#define DOC_STREAM_MAX_LINE (64u << 20)   // longest JSONL line; a longer one is a malformed line

typedef enum { DOCS_TEXT = 0, DOCS_JSONL = 1 } DocFormat;

typedef struct {
    DocFormat format;
    const char *jsonl_field;   // DOCS_JSONL: the member holding the text
    int jsonl_strict;          // a malformed JSONL line is an error, not a warning
    const char *separator;     // DOCS_TEXT: documents end after each occurrence (NULL: one per file)
    int keep_empty;            // empty documents are handed out too (Python's str.split keeps them)
    // DOCS_TEXT with one file: after this many characters (bytes with split_in_bytes) the current
    // document ends and part 1 of the input begins; UINT64_MAX: no split.
    uint64_t split_after;
    int split_in_bytes;
    FILE *log;                 // warnings about skipped lines (NULL: none)
} DocStreamOptions;

// Where a piece's text starts, exactly enough to restart reading there (doc_stream_seek).
typedef struct {
    int file;              // index in the input list
    uint64_t offset;       // DOCS_TEXT: byte offset in the decompressed file; DOCS_JSONL: of the line
    uint64_t doc_offset;   // DOCS_TEXT: offset where the piece's document starts
    uint64_t text_offset;  // DOCS_JSONL: offset inside the line's decoded text
    uint64_t line;         // DOCS_JSONL: line number, from 1
} DocPos;

typedef struct {
    const char *text;      // (len) bytes, valid until the next call
    size_t len;
    int doc_start;         // the first piece of a document
    int doc_end;           // the last piece of a document (may be the only one, and may be empty)
    int part;              // 1 after split_after, else 0
    DocPos pos;
    uint64_t raw_pos;      // input bytes before this piece, over all files (compressed sizes: approximate)
} DocPiece;

typedef struct {
    uint64_t lines, blank_lines, bad_lines, empty_docs;   // JSONL lines; empty documents left out
    uint64_t raw_done;     // input bytes consumed so far (as stored: compressed sizes for gzip/zstd)
} DocStreamStats;

typedef struct DocStream DocStream;   // opaque

// The inputs are read lazily: in must outlive the stream.
DocStream *doc_stream_open(const InputList *in, const DocStreamOptions *o);
void doc_stream_close(DocStream *d);
// Restarts at pos (a position from an earlier piece of the same inputs, or one inside it).
int doc_stream_seek(DocStream *d, const DocPos *pos, char *err, size_t errlen);
// The next piece: 1, 0 after the last one, -1 with err (file, line or offset, problem).
int doc_stream_next(DocStream *d, DocPiece *p, char *err, size_t errlen);
DocStreamStats doc_stream_stats(const DocStream *d);
