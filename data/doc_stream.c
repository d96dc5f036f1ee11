#define _GNU_SOURCE   // memmem
#include "data/doc_stream.h"

#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "data/byte_source.h"
#include "data/bytebuf.h"
#include "data/jsonl.h"
#include "data/utf8.h"

#define DOC_STREAM_BLOCK (1u << 20)   // bytes read at a time: the size of a text piece
#define DOC_STREAM_REPORTS 10         // malformed lines named one by one; the rest are counted

struct DocStream {
    const InputList *in;
    DocStreamOptions o;
    size_t sep_len;
    int file;                // the file being read, -1 before the first
    ByteSource *src;         // NULL between files
    uint64_t raw_before;     // input bytes of the files before this one
    int eof;                 // src has no more bytes
    ByteBuf win;             // read-ahead window: the file's bytes from win_offset
    uint64_t win_offset;
    size_t emit;             // text: next byte of win to hand out; jsonl: start of the next line
    size_t search;           // text: where the separator search resumes; jsonl: end of the bytes scanned for '\n'
    // text
    uint64_t doc_offset;     // file offset of the current document's first byte
    int in_doc;              // a piece of the current document has been handed out
    int part;
    int split_pending;       // split_after has not been reached yet
    uint64_t seen;           // characters (or bytes) counted towards split_after
    size_t split_scan;       // win index up to which they were counted
    // jsonl
    ByteBuf text;            // the current record's decoded text
    uint64_t line_no, line_offset;
    uint64_t text_skip;      // after a seek: bytes of the first record's text already handed out
    int skipping_long;       // inside a line longer than DOC_STREAM_MAX_LINE
    DocStreamStats st;
};

DocStream *doc_stream_open(const InputList *in, const DocStreamOptions *o) {
    DocStream *d = xcalloc(1, sizeof *d);
    d->in = in;
    d->o = *o;
    d->sep_len = o->separator ? strlen(o->separator) : 0;
    d->file = -1;
    d->split_pending = o->format == DOCS_TEXT && o->split_after != UINT64_MAX;
    // The window is never NULL, so the memmove/memchr on an empty one are defined behaviour.
    bytebuf_reserve(&d->win, DOC_STREAM_BLOCK);
    return d;
}

static void close_file(DocStream *d) {
    if (!d->src) return;
    int64_t size = d->in->files[d->file].size;
    d->raw_before += size >= 0 ? (uint64_t)size : byte_source_consumed(d->src);
    byte_source_close(d->src);
    d->src = NULL;
}

void doc_stream_close(DocStream *d) {
    if (!d) return;
    close_file(d);
    bytebuf_free(&d->win);
    bytebuf_free(&d->text);
    free(d);
}

static const char *file_name(const DocStream *d) {
    const char *p = d->in->files[d->file].path;
    return strcmp(p, "-") == 0 ? "standard input" : p;
}

// Opens the file after the current one: 1, 0 when there is none, -1 with err.
static int open_next(DocStream *d, char *err, size_t errlen) {
    close_file(d);
    if (d->file + 1 >= d->in->n) return 0;
    d->file++;
    if (!(d->src = byte_source_open(d->in->files[d->file].path, err, errlen))) return -1;
    d->eof = 0;
    d->win.len = d->emit = d->search = d->split_scan = 0;
    d->win_offset = d->doc_offset = 0;
    d->in_doc = 0;
    d->line_no = 0;
    d->skipping_long = 0;
    return 1;
}

// Drops the window's bytes before `keep` and appends up to one block more. 0 or -1 with err.
static int read_more(DocStream *d, size_t keep, char *err, size_t errlen) {
    memmove(d->win.p, d->win.p + keep, d->win.len - keep);
    d->win.len -= keep;
    d->win_offset += keep;
    d->emit -= keep;
    d->search -= keep;
    d->split_scan -= d->split_scan >= keep ? keep : d->split_scan;
    bytebuf_reserve(&d->win, DOC_STREAM_BLOCK);
    long got = byte_source_read(d->src, d->win.p + d->win.len, DOC_STREAM_BLOCK, err, errlen);
    if (got < 0) return -1;
    if (got == 0) d->eof = 1;
    d->win.len += (size_t)got;
    return 0;
}

static uint64_t raw_pos(const DocStream *d, uint64_t offset) {
    if (byte_source_codec(d->src) == CODEC_PLAIN) return d->raw_before + offset;
    return d->raw_before + byte_source_consumed(d->src);
}

// ---------------------------------------------------------------------------------------------
// text

// The window index where part 0 ends, counting characters from split_scan on; win.len when the
// split lies beyond the window.
static size_t split_index(DocStream *d) {
    if (!d->split_pending) return d->win.len;
    for (; d->split_scan < d->win.len; d->split_scan++) {
        if (!d->o.split_in_bytes && !utf8_is_lead((unsigned char)d->win.p[d->split_scan])) continue;
        if (d->seen == d->o.split_after) return d->split_scan;
        d->seen++;
    }
    return d->eof && d->seen == d->o.split_after ? d->win.len : SIZE_MAX;
}

static void hand_out(DocStream *d, DocPiece *p, size_t end, int doc_end) {
    *p = (DocPiece){d->win.p + d->emit, end - d->emit, !d->in_doc, doc_end, d->part,
                    {d->file, d->win_offset + d->emit, d->doc_offset, 0, 0}, raw_pos(d, d->win_offset + d->emit)};
    d->in_doc = !doc_end;
    d->emit = end;
    if (doc_end) {
        d->search = end;
        d->doc_offset = d->win_offset + end;
    }
}

static int text_next(DocStream *d, DocPiece *p, char *err, size_t errlen) {
    for (;;) {
        if (!d->src) {
            int rc = open_next(d, err, errlen);
            if (rc <= 0) return rc;
        }
        size_t split = split_index(d);
        int hard_end = split != SIZE_MAX && (split < d->win.len || d->split_pending || d->eof);
        size_t end = split == SIZE_MAX ? d->win.len : split;
        if (d->sep_len && d->search < end) {
            const char *hit = memmem(d->win.p + d->search, end - d->search, d->o.separator, d->sep_len);
            if (hit) {
                hand_out(d, p, (size_t)(hit - d->win.p) + d->sep_len, 1);
                return 1;
            }
            d->search = end - d->search >= d->sep_len ? end - (d->sep_len - 1) : d->search;
        }
        if (hard_end) {   // the end of the file, or of part 0
            int empty = d->emit == end && !d->in_doc;
            if (!empty || d->o.keep_empty) hand_out(d, p, end, 1);
            if (empty) d->st.empty_docs += !d->o.keep_empty;
            if (split < d->win.len || (d->split_pending && d->eof)) {
                d->split_pending = 0;
                d->part = 1;
                d->search = d->emit = end;
                d->in_doc = 0;
                d->doc_offset = d->win_offset + end;
            } else {
                close_file(d);
            }
            if (!empty || d->o.keep_empty) return 1;
            continue;
        }
        if (d->emit < end) {
            hand_out(d, p, end, 0);
            return 1;
        }
        // Bytes handed out are dropped, except those a separator may still start in.
        size_t keep = d->sep_len && d->search < d->emit ? d->search : d->emit;
        if (read_more(d, keep, err, errlen) != 0) return -1;
    }
}

// ---------------------------------------------------------------------------------------------
// jsonl

// The next line of the current file (without its '\n'): 1, 0 at the end of the file, -1 with err.
// *too_long is set for a line longer than DOC_STREAM_MAX_LINE, which is not kept.
static int next_line(DocStream *d, const char **line, size_t *len, int *too_long, char *err, size_t errlen) {
    *too_long = 0;
    for (;;) {
        const char *nl = memchr(d->win.p + d->search, '\n', d->win.len - d->search);
        size_t end = nl ? (size_t)(nl - d->win.p) : d->win.len;
        if (nl || (d->eof && d->emit < d->win.len)) {
            *line = d->win.p + d->emit;
            *len = end - d->emit;
            *too_long = d->skipping_long;
            d->skipping_long = 0;
            d->line_offset = d->win_offset + d->emit;
            d->emit = d->search = nl ? end + 1 : end;
            d->line_no++;
            return 1;
        }
        if (d->eof) return 0;
        d->search = d->win.len;
        if (d->win.len - d->emit > DOC_STREAM_MAX_LINE) {   // drop it: only its end is looked for
            d->skipping_long = 1;
            d->emit = d->win.len;
        }
        if (read_more(d, d->emit, err, errlen) != 0) return -1;
    }
}

// A malformed line: an error with --jsonl-strict, else a warning (the first few) and a count.
static int bad_line(DocStream *d, const char *why, char *err, size_t errlen) {
    d->st.bad_lines++;
    if (d->o.jsonl_strict)
        return set_error(err, errlen, "%s:%llu: %s (--jsonl-strict: malformed lines are errors; without it "
                                      "they are reported and skipped)",
                         file_name(d), (unsigned long long)d->line_no, why);
    if (d->o.log && d->st.bad_lines <= DOC_STREAM_REPORTS)
        fprintf(d->o.log, "warning: prepare: %s:%llu: %s: line skipped%s\n", file_name(d),
                (unsigned long long)d->line_no, why,
                d->st.bad_lines == DOC_STREAM_REPORTS ? " (further malformed lines are only counted)" : "");
    return 0;
}

static int jsonl_next(DocStream *d, DocPiece *p, char *err, size_t errlen) {
    char why[512];
    for (;;) {
        if (!d->src) {
            int rc = open_next(d, err, errlen);
            if (rc <= 0) return rc;
        }
        const char *line;
        size_t len;
        int too_long, rc = next_line(d, &line, &len, &too_long, err, errlen);
        if (rc < 0) return -1;
        if (rc == 0) {
            close_file(d);
            continue;
        }
        d->st.lines++;
        JsonlResult r = too_long ? JSONL_BAD : jsonl_field_text(line, len, d->o.jsonl_field, &d->text, why, sizeof why);
        if (too_long) snprintf(why, sizeof why, "longer than the %u MB a JSONL line may have", DOC_STREAM_MAX_LINE >> 20);
        if (r == JSONL_BLANK) {
            d->st.blank_lines++;
            continue;
        }
        if (r == JSONL_BAD) {
            if (bad_line(d, why, err, errlen) != 0) return -1;
            continue;
        }
        uint64_t skip = d->text_skip;
        d->text_skip = 0;
        if (d->text.len == 0 && !d->o.keep_empty) {
            d->st.empty_docs++;
            continue;
        }
        if (skip > d->text.len)
            return set_error(err, errlen, "%s:%llu: the record is shorter than before: the input changed",
                             file_name(d), (unsigned long long)d->line_no);
        *p = (DocPiece){d->text.p + skip, d->text.len - (size_t)skip, skip == 0, 1, 0,
                        {d->file, d->line_offset, 0, skip, d->line_no}, raw_pos(d, d->line_offset)};
        return 1;
    }
}

int doc_stream_next(DocStream *d, DocPiece *p, char *err, size_t errlen) {
    int rc = d->o.format == DOCS_JSONL ? jsonl_next(d, p, err, errlen) : text_next(d, p, err, errlen);
    d->st.raw_done = d->raw_before + (d->src ? byte_source_consumed(d->src) : 0);
    return rc;
}

int doc_stream_seek(DocStream *d, const DocPos *pos, char *err, size_t errlen) {
    CHECK(!d->split_pending && pos->file < d->in->n);
    close_file(d);
    d->raw_before = 0;
    for (int i = 0; i < pos->file; i++) d->raw_before += (uint64_t)d->in->files[i].size;
    d->file = pos->file - 1;
    if (open_next(d, err, errlen) <= 0) return -1;
    if (d->o.format == DOCS_JSONL) {
        d->line_no = pos->line - 1;
        d->text_skip = pos->text_offset;
        d->win_offset = pos->offset;
        return byte_source_skip(d->src, pos->offset, err, errlen);
    }
    // The separator search needs the bytes of the document just before the position: an
    // occurrence may have started there.
    uint64_t history = d->sep_len ? d->sep_len - 1 : 0;
    uint64_t from = pos->offset - pos->doc_offset > history ? pos->offset - history : pos->doc_offset;
    if (byte_source_skip(d->src, from, err, errlen) != 0) return -1;
    d->win_offset = from;
    while (d->win.len < pos->offset - from && !d->eof)
        if (read_more(d, 0, err, errlen) != 0) return -1;
    if (d->win.len < pos->offset - from)
        return set_error(err, errlen, "'%s' ends before the position to resume from: the input changed", file_name(d));
    d->emit = (size_t)(pos->offset - from);
    d->search = 0;
    d->doc_offset = pos->doc_offset;
    d->in_doc = pos->offset > pos->doc_offset;
    return 0;
}

DocStreamStats doc_stream_stats(const DocStream *d) { return d->st; }
