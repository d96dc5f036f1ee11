#include "data/segmenter.h"

#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "data/pretok_cut.h"
#include "data/utf8.h"

void batch_init(Batch *b, const SegmenterParams *p) {
    memset(b, 0, sizeof *b);
    CHECK(p->target >= 1 && p->max > p->target);
    b->p = *p;
}

void batch_free(Batch *b) {
    bytebuf_free(&b->text);
    free(b->seg);
    memset(b, 0, sizeof *b);
}

DocPos doc_pos_advance(DocPos pos, DocFormat format, uint64_t n) {
    if (format == DOCS_JSONL) pos.text_offset += n;
    else pos.offset += n;
    return pos;
}

static int char_class(unsigned char c) {   // of a printable ASCII character
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return 0;
    return c >= '0' && c <= '9' ? 1 : 2;
}

// Whether GPT-2's pre-tokenizer (the pattern 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+|
// ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+, which never looks behind a match's start) always ends a
// match just before s[i], looking at s[i-2..i] only (i >= 2):
// - after a '\n' between printable ASCII characters: the '\n' is a match of its own
//   (data/pretok_cut.h);
// - ASCII whitespace (space, \t, \n, \v, \f, \r: whitespace for every Unicode definition)
//   after a printable ASCII character a: no alternative holds a non-space and then whitespace,
//   so a's match ends at a, the same with or without what follows;
// - a printable ASCII letter, digit or punctuation character after one of another class: the
//   classes are disjoint alternatives, except the contractions ('s, 're, ...), so not after '.
// The pattern's outcome at the start of every earlier match depends on the text up to the cut
// only (its lookahead reads one whitespace character past a whitespace run, which stops at a
// non-space), and ASCII bytes are never part of an invalid UTF-8 sequence, so the replacement
// of invalid bytes is the same per segment as for the whole.
static int safe_cut(const unsigned char *s, size_t i) {
    unsigned char a = s[i - 1], b = s[i];
    if (a == '\n') return pretok_newline_cut(s[i - 2], b);
    if (!pretok_printable(a)) return 0;
    if (b == ' ' || (b >= '\t' && b <= '\r')) return 1;
    return pretok_printable(b) && char_class(a) != char_class(b) && a != '\'';
}

static void push_closed(Batch *b, Segment s) {
    if (s.len == 0 && !s.doc_start) return;   // an empty tail after a cut: nothing to encode
    if (b->n == b->cap) b->seg = xrealloc(b->seg, (b->cap = 2 * b->cap + 256) * sizeof *b->seg);
    b->seg[b->n++] = s;
}

// Closes the open segment after `len` of its bytes; the rest starts the next open segment.
static void cut_open(Batch *b, size_t len, int hard) {
    Segment s = b->open;
    s.len = len;
    s.hard_cut = hard;
    push_closed(b, s);
    b->open.start += len;
    b->open.doc_start = 0;
    b->open.pos = doc_pos_advance(b->open.pos, b->p.format, len);
    b->scan = 0;
}

static void find_cuts(Batch *b) {
    for (;;) {
        const unsigned char *s = (const unsigned char *)b->text.p + b->open.start;
        size_t len = b->text.len - b->open.start;
        size_t from = b->scan > b->p.target ? b->scan : b->p.target;
        if (from < 2) from = 2;
        size_t limit = len < b->p.max ? len : b->p.max, cut = 0;
        for (size_t i = from; i < limit && !cut; i++)
            if (safe_cut(s, i)) cut = i;
        if (cut) {
            cut_open(b, cut, 0);
            continue;
        }
        if (len <= b->p.max) {
            b->scan = limit > from ? limit : from;
            return;
        }
        size_t at = b->p.max;   // no safe cut: the character boundary at or just before max
        for (int k = 0; k < UTF8_MAX_BYTES - 1 && !utf8_is_lead(s[at]); k++) at--;
        cut_open(b, at, 1);
    }
}

void batch_add(Batch *b, const DocPiece *piece) {
    if (piece->doc_start || !b->has_open) {
        CHECK(!b->has_open);   // the document before ended with a doc_end piece
        b->open = (Segment){b->text.len, 0, piece->doc_start, piece->part, 0, piece->pos, piece->raw_pos};
        b->has_open = 1;
        b->scan = 0;
    }
    bytebuf_append(&b->text, piece->text, piece->len);
    find_cuts(b);
    if (piece->doc_end) {
        cut_open(b, b->text.len - b->open.start, 0);
        b->has_open = 0;
    }
}

size_t batch_closed_bytes(const Batch *b) { return b->has_open ? b->open.start : b->text.len; }

void batch_clear_closed(Batch *b) {
    size_t keep_from = batch_closed_bytes(b);
    memmove(b->text.p, b->text.p + keep_from, b->text.len - keep_from);
    b->text.len -= keep_from;
    b->open.start = 0;
    b->n = 0;
}
