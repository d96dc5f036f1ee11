// text_scan: a first pass over the documents, for what must be known before any token is
// written: the characters (UTF-8 code points) of the char vocabulary, the number of characters
// (the single-file split is by characters) and whether the text is valid UTF-8 at all.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "data/doc_stream.h"
#include "data/tokenizer.h"
#include "data/utf8.h"

typedef struct {
    uint64_t chars, bytes;           // characters (up to the first invalid byte) and bytes
    int valid;                       // no invalid UTF-8 so far
    int bad_file;                    // the first invalid byte: its file and byte offset
    uint64_t bad_offset;
    unsigned char *seen;             // bitmap of the code points present; NULL: not collected
    char carry[UTF8_MAX_BYTES];      // a character the last piece ended in the middle of
    int carry_len;
    DocPos carry_pos;
} TextScan;

void text_scan_init(TextScan *s, int collect_chars);
void text_scan_free(TextScan *s);
void text_scan_piece(TextScan *s, const DocPiece *p);
// The end of the input: a character left unfinished is invalid.
void text_scan_finish(TextScan *s);
// The char vocabulary of what was scanned (collect_chars): the sorted distinct code points.
Tokenizer *text_scan_char_vocab(const TextScan *s, char *err, size_t errlen);
