#define _GNU_SOURCE   // qsort_r
#include "data/tokenizer.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/fileio.h"
#include "data/utf8.h"

#define TOK_HEADER_INTS 256
#define TOK_HEADER_BYTES (TOK_HEADER_INTS * sizeof(uint32_t))
#define TOK_NO_EOT 0xFFFFFFFFu    // our convention for "no end-of-text token" (documented)
#define TOK_GPT2_VOCAB 50257       // version 1 files are GPT-2's: llm.c assumes eot 50256
#define TOK_MAX_LEN 255            // one length byte per token
#define UNICODE_MAX 0x10FFFF

struct Tokenizer {
    int n, eot, max_len;
    unsigned char *blob;   // every token's bytes, back to back
    size_t *off;           // (n,) start of token i in blob
    int *len;              // (n,)
    int *sorted;           // (n,) ids ordered by their bytes, for encoding lookups
};

// Orders byte strings like memcmp, shorter first on a common prefix.
static int cmp_bytes(const unsigned char *a, int la, const unsigned char *b, int lb) {
    int c = memcmp(a, b, (size_t)(la < lb ? la : lb));
    return c ? c : (la > lb) - (la < lb);
}

static int cmp_ids(const void *x, const void *y, void *ctx) {
    const Tokenizer *t = ctx;
    int a = *(const int *)x, b = *(const int *)y;
    int c = cmp_bytes(t->blob + t->off[a], t->len[a], t->blob + t->off[b], t->len[b]);
    return c ? c : (a > b) - (a < b);   // duplicates: the lowest id first
}

// Allocates a tokenizer for n tokens totalling blob_len bytes; the caller fills blob/off/len and
// then calls finish().
static Tokenizer *alloc_tokenizer(int n, size_t blob_len, int eot) {
    Tokenizer *t = xcalloc(1, sizeof *t);
    t->n = n;
    t->eot = eot;
    t->blob = xmalloc(blob_len);
    t->off = xmalloc(sizeof(size_t) * (size_t)n);
    t->len = xmalloc(sizeof(int) * (size_t)n);
    t->sorted = xmalloc(sizeof(int) * (size_t)n);
    return t;
}

static void finish(Tokenizer *t) {
    for (int i = 0; i < t->n; i++) {
        t->sorted[i] = i;
        if (t->len[i] > t->max_len) t->max_len = t->len[i];
    }
    qsort_r(t->sorted, (size_t)t->n, sizeof(int), cmp_ids, t);
}

void tokenizer_free(Tokenizer *t) {
    if (!t) return;
    free(t->blob);
    free(t->off);
    free(t->len);
    free(t->sorted);
    free(t);
}

Tokenizer *tokenizer_parse(const unsigned char *buf, size_t size, const char *path, char *err, size_t errlen) {
    if (size < TOK_HEADER_BYTES) {
        set_error(err, errlen, "tokenizer '%s' is truncated: %zu bytes, smaller than the %zu-byte header", path,
               size, TOK_HEADER_BYTES);
        return NULL;
    }
    uint32_t h[TOK_HEADER_INTS];
    memcpy(h, buf, sizeof h);
    if (h[0] != TOKENIZER_MAGIC) {
        set_error(err, errlen, "tokenizer '%s': bad magic %u (expected %d): not an llm.c tokenizer file", path,
               h[0], TOKENIZER_MAGIC);
        return NULL;
    }
    if (h[1] != 1 && h[1] != 2) {
        set_error(err, errlen, "tokenizer '%s': unsupported version %u (expected 1 or 2)", path, h[1]);
        return NULL;
    }
    uint32_t n = h[2];
    if (n == 0 || n > INT32_MAX) {
        set_error(err, errlen, "tokenizer '%s': bad token count %u in the header", path, n);
        return NULL;
    }
    if (h[1] == 1 && n != TOK_GPT2_VOCAB) {
        set_error(err, errlen, "tokenizer '%s': version 1 files are GPT-2's (%d tokens), this one has %u", path,
               TOK_GPT2_VOCAB, n);
        return NULL;
    }
    uint32_t eot = h[1] == 1 ? TOK_GPT2_VOCAB - 1 : h[3];
    if (eot != TOK_NO_EOT && eot >= n) {
        set_error(err, errlen, "tokenizer '%s': end-of-text id %u is not below the %u tokens (0xFFFFFFFF means none)",
               path, eot, n);
        return NULL;
    }
    if (n > (size - TOK_HEADER_BYTES) / 2) {   // every token takes a length byte and >= 1 byte
        set_error(err, errlen, "tokenizer '%s' is truncated: %u tokens need at least %llu bytes after the header, "
                            "the file has %zu", path, n, 2ull * n, size - TOK_HEADER_BYTES);
        return NULL;
    }
    // The token section cannot be larger than the rest of the file.
    Tokenizer *t = alloc_tokenizer((int)n, size - TOK_HEADER_BYTES, eot == TOK_NO_EOT ? -1 : (int)eot);
    size_t pos = TOK_HEADER_BYTES, blob = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (pos >= size) {
            set_error(err, errlen, "tokenizer '%s' is truncated: it ends before token %u of %u", path, i, n);
            goto fail;
        }
        int len = buf[pos++];
        if (len == 0) {   // llm.c asserts every token has at least one byte
            set_error(err, errlen, "tokenizer '%s': token %u has length 0 at byte offset %zu (llm.c requires at "
                                "least one byte per token)", path, i, pos - 1);
            goto fail;
        }
        if (size - pos < (size_t)len) {
            set_error(err, errlen, "tokenizer '%s' is truncated: token %u needs %d bytes at byte offset %zu", path,
                   i, len, pos);
            goto fail;
        }
        memcpy(t->blob + blob, buf + pos, (size_t)len);
        t->off[i] = blob;
        t->len[i] = len;
        blob += (size_t)len;
        pos += (size_t)len;
    }
    if (pos != size) {
        set_error(err, errlen, "tokenizer '%s' has %zu bytes after its last token: trailing data or a wrong token count",
               path, size - pos);
        goto fail;
    }
    finish(t);
    return t;
fail:
    tokenizer_free(t);
    return NULL;
}

Tokenizer *tokenizer_load(const char *path, char *err, size_t errlen) {
    char why[ERR_LEN];
    size_t size;
    char *buf = read_file(path, &size, why, sizeof why);
    if (!buf) {
        set_error(err, errlen, "tokenizer: %s (make one with train_gpt prepare)", why);
        return NULL;
    }
    Tokenizer *t = tokenizer_parse((const unsigned char *)buf, size, path, err, errlen);
    free(buf);
    return t;
}

int tokenizer_vocab_size(const Tokenizer *t) { return t->n; }

int tokenizer_eot(const Tokenizer *t) { return t->eot; }

const unsigned char *tokenizer_decode(const Tokenizer *t, int id, int *len) {
    if (id < 0 || id >= t->n) return NULL;
    *len = t->len[id];
    return t->blob + t->off[id];
}

// The lowest id whose bytes are exactly p[0..len), or -1.
static int lookup(const Tokenizer *t, const unsigned char *p, int len) {
    int lo = 0, hi = t->n;   // first sorted entry >= (p, len)
    while (lo < hi) {
        int mid = (lo + hi) / 2, id = t->sorted[mid];
        if (cmp_bytes(t->blob + t->off[id], t->len[id], p, len) < 0) lo = mid + 1;
        else hi = mid;
    }
    if (lo == t->n) return -1;
    int id = t->sorted[lo];
    return cmp_bytes(t->blob + t->off[id], t->len[id], p, len) == 0 ? id : -1;
}

long tokenizer_encode_bytes(const Tokenizer *t, const char *text, size_t len, int *ids, long cap) {
    const unsigned char *p = (const unsigned char *)text;
    long n = 0;
    while (len > 0 && n < cap) {
        int id = -1, l = (size_t)t->max_len < len ? t->max_len : (int)len;
        for (; l > 0 && id < 0; l--) id = lookup(t, p, l);
        if (id < 0) return -1;
        ids[n++] = id;
        p += t->len[id];
        len -= (size_t)t->len[id];
    }
    return n;
}

long tokenizer_encode_simple(const Tokenizer *t, const char *text, int *ids, long cap) {
    return tokenizer_encode_bytes(t, text, strlen(text), ids, cap);
}

Tokenizer *tokenizer_build_char(const char *text, size_t len, char *err, size_t errlen) {
    if (len == 0) {
        set_error(err, errlen, "the text is empty: a char vocabulary needs at least one character");
        return NULL;
    }
    unsigned char *seen = xcalloc(UNICODE_MAX + 1, 1);   // (0x110000,) code point present
    int n = 0;
    for (size_t i = 0; i < len;) {
        int l = utf8_char_len(text + i, len - i, NULL);
        if (l < 0) {
            set_error(err, errlen, "the text is not valid UTF-8 at byte offset %zu (byte 0x%02X): use --tokenizer "
                                "byte for binary or non-UTF-8 input", i, (unsigned char)text[i]);
            free(seen);
            return NULL;
        }
        uint32_t cp = utf8_decode(text + i, l);
        n += !seen[cp];
        seen[cp] = 1;
        i += (size_t)l;
    }
    Tokenizer *t = alloc_tokenizer(n, (size_t)n * 4, -1);
    size_t blob = 0;
    int id = 0;
    for (uint32_t cp = 0; cp <= UNICODE_MAX; cp++) {   // ascending code points = sorted characters
        if (!seen[cp]) continue;
        t->off[id] = blob;
        t->len[id] = utf8_encode(cp, (char *)t->blob + blob);
        blob += (size_t)t->len[id++];
    }
    free(seen);
    finish(t);
    return t;
}

Tokenizer *tokenizer_build_byte(void) {
    Tokenizer *t = alloc_tokenizer(256, 256, -1);
    for (int i = 0; i < 256; i++) {
        t->blob[i] = (unsigned char)i;
        t->off[i] = (size_t)i;
        t->len[i] = 1;
    }
    finish(t);
    return t;
}

Tokenizer *tokenizer_build_table(int n, const unsigned char *const *bytes, const int *lens, int eot,
                                 char *err, size_t errlen) {
    if (n < 1) {
        set_error(err, errlen, "a tokenizer needs at least one token (got %d)", n);
        return NULL;
    }
    if (eot < -1 || eot >= n) {
        set_error(err, errlen, "end-of-text id %d is not below the %d tokens (-1 means none)", eot, n);
        return NULL;
    }
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        if (lens[i] < 1 || lens[i] > TOK_MAX_LEN) {
            set_error(err, errlen, "token %d has %d bytes: the tokenizer file stores 1..%d bytes per token", i,
                   lens[i], TOK_MAX_LEN);
            return NULL;
        }
        total += (size_t)lens[i];
    }
    Tokenizer *t = alloc_tokenizer(n, total, eot);
    size_t blob = 0;
    for (int i = 0; i < n; i++) {
        memcpy(t->blob + blob, bytes[i], (size_t)lens[i]);
        t->off[i] = blob;
        t->len[i] = lens[i];
        blob += (size_t)lens[i];
    }
    finish(t);
    return t;
}

int tokenizer_save(const Tokenizer *t, const char *path, char *err, size_t errlen) {
    size_t size = TOK_HEADER_BYTES;
    for (int i = 0; i < t->n; i++) size += 1 + (size_t)t->len[i];
    unsigned char *buf = xcalloc(size, 1);
    uint32_t h[TOK_HEADER_INTS] = {0};
    h[0] = TOKENIZER_MAGIC;
    h[1] = 2;
    h[2] = (uint32_t)t->n;
    h[3] = t->eot < 0 ? TOK_NO_EOT : (uint32_t)t->eot;
    memcpy(buf, h, sizeof h);
    size_t pos = TOK_HEADER_BYTES;
    for (int i = 0; i < t->n; i++) {
        buf[pos++] = (unsigned char)t->len[i];
        memcpy(buf + pos, t->blob + t->off[i], (size_t)t->len[i]);
        pos += (size_t)t->len[i];
    }
    int rc = write_file_atomic(path, buf, size, err, errlen);
    free(buf);
    return rc;
}
