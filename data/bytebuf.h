// bytebuf: a growable byte buffer (the JSONL line and decoded text, the batch of text to encode).
#pragma once
#include <stddef.h>
#include <string.h>

#include "common/check.h"

typedef struct {
    char *p;
    size_t len, cap;
} ByteBuf;

// Makes room for `more` bytes after len (doubling, so appends are amortised O(1)).
static inline void bytebuf_reserve(ByteBuf *b, size_t more) {
    if (b->len + more <= b->cap) return;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + more) cap *= 2;
    b->p = xrealloc(b->p, cap);
    b->cap = cap;
}

static inline void bytebuf_append(ByteBuf *b, const void *src, size_t n) {
    bytebuf_reserve(b, n);
    if (n) memcpy(b->p + b->len, src, n);
    b->len += n;
}

static inline void bytebuf_free(ByteBuf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}
