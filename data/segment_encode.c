#include "data/segment_encode.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"

// A thread's work item holds whole segments of at least this many bytes together: fewer,
// larger items cost less scheduling, and a thread keeps its buffers warm.
#define ENCODE_ITEM_BYTES (256u << 10)

static void ids_reserve(IdBuf *b, size_t more) {
    if (b->n + more <= b->cap) return;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->n + more) cap *= 2;
    b->p = xrealloc(b->p, cap * sizeof(int));
    b->cap = cap;
}

// Appends the ids of one segment to out; 0, -1 when a table vocabulary lacks a character, or -2
// with err when GPT-2's encoder failed (out of memory, PCRE2).
static int encode_one(const SegmentEncoder *e, const char *text, const Segment *s, IdBuf *out, char *err,
                      size_t errlen) {
    if (s->doc_start && e->eot >= 0) {
        ids_reserve(out, 1);
        out->p[out->n++] = e->eot;
    }
    if (e->bpe)
        return gpt2_bpe_encode(e->bpe, text + s->start, s->len, &out->p, &out->n, &out->cap, err, errlen) ? -2 : 0;
    ids_reserve(out, s->len);   // at most one id per byte
    long k = tokenizer_encode_bytes(e->table, text + s->start, s->len, out->p + out->n, (long)s->len);
    if (k < 0) return -1;
    out->n += (size_t)k;
    return 0;
}

int segments_encode(const SegmentEncoder *e, const char *text, const Segment *segs, size_t n, IdBuf *ids,
                    size_t *counts, char *err, size_t errlen) {
    // Work item w is segments [first[w], first[w + 1]).
    size_t *first = xmalloc((n + 1) * sizeof(size_t)), n_items = 0;
    for (size_t i = 0, bytes = ENCODE_ITEM_BYTES; i < n; i++) {
        if (bytes >= ENCODE_ITEM_BYTES) {
            first[n_items++] = i;
            bytes = 0;
        }
        bytes += segs[i].len;
    }
    first[n_items] = n;
    IdBuf *part = xcalloc(n_items ? n_items : 1, sizeof *part);
    int threads = e->threads > 0 ? e->threads : omp_get_max_threads();
    if ((size_t)threads > n_items) threads = n_items ? (int)n_items : 1;
    size_t bad = SIZE_MAX;   // the first segment a table vocabulary could not encode
    char bpe_err[ERR_LEN] = "";   // the message of a GPT-2 encoder failure, if any
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1) reduction(min : bad)
    for (size_t w = 0; w < n_items; w++) {
        // Each item fills a buffer of its own: neighbouring items run on other threads.
        IdBuf *out = &part[w];
        char item_err[ERR_LEN];
        for (size_t i = first[w]; i < first[w + 1]; i++) {
            size_t before = out->n;
            const int rc = encode_one(e, text, &segs[i], out, item_err, sizeof item_err);
            if (rc == -1 && i < bad) bad = i;
            if (rc == -2) {
#pragma omp critical(segment_encode_error)
                if (!bpe_err[0]) snprintf(bpe_err, sizeof bpe_err, "%s", item_err);
            }
            counts[i] = out->n - before;
        }
    }
    ids->n = 0;
    for (size_t w = 0; w < n_items; w++) {
        ids_reserve(ids, part[w].n);
        memcpy(ids->p + ids->n, part[w].p, part[w].n * sizeof(int));
        ids->n += part[w].n;
        free(part[w].p);
    }
    free(part);
    free(first);
    if (bpe_err[0]) return set_error(err, errlen, "%s", bpe_err);
    if (bad == SIZE_MAX) return 0;
    return set_error(err, errlen, "input file %d near byte %llu has a character outside the vocabulary of the "
                                  "first pass: the input changed while prepare read it",
                     segs[bad].pos.file + 1, (unsigned long long)segs[bad].pos.offset);
}
