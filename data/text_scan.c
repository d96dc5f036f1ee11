#include "data/text_scan.h"

#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "data/bytebuf.h"

#define CODEPOINTS 0x110000

void text_scan_init(TextScan *s, int collect_chars) {
    memset(s, 0, sizeof *s);
    s->valid = 1;
    if (collect_chars) s->seen = xcalloc(CODEPOINTS / 8, 1);
}

void text_scan_free(TextScan *s) {
    free(s->seen);
    memset(s, 0, sizeof *s);
}

static void mark(TextScan *s, uint32_t cp) {
    if (s->seen) s->seen[cp >> 3] |= (unsigned char)(1u << (cp & 7));
}

static void invalid(TextScan *s, const DocPos *pos, uint64_t at) {
    if (!s->valid) return;
    s->valid = 0;
    s->bad_file = pos->file;
    s->bad_offset = pos->offset + at;
}

// Whether the n bytes at p (n < 4) could begin a longer valid character.
static int is_prefix(const char *p, size_t n) {
    unsigned char c = (unsigned char)p[0];
    size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    if (n >= need) return 0;
    for (size_t k = 1; k < n; k++)
        if (utf8_is_lead((unsigned char)p[k])) return 0;
    return need > 1;
}

// One character at p (left bytes): its length, 0 when it may continue in the next piece, -1
// when invalid.
static int scan_char(TextScan *s, const char *p, size_t left) {
    int len = utf8_char_len(p, left, NULL);
    if (len > 0) {
        mark(s, utf8_decode(p, len));
        s->chars += s->valid;
        return len;
    }
    return left < UTF8_MAX_BYTES && is_prefix(p, left) ? 0 : -1;
}

// The carried bytes and the start of the piece: how many bytes of the piece they used.
static size_t finish_carry(TextScan *s, const DocPiece *p) {
    char tmp[2 * UTF8_MAX_BYTES];
    size_t extra = p->len < UTF8_MAX_BYTES ? p->len : UTF8_MAX_BYTES - 1, n = (size_t)s->carry_len + extra;
    memcpy(tmp, s->carry, (size_t)s->carry_len);
    memcpy(tmp + s->carry_len, p->text, extra);
    int len = p->pos.file == s->carry_pos.file ? scan_char(s, tmp, n) : -1;
    int carried = s->carry_len;
    s->carry_len = 0;
    if (len == 0) {   // still unfinished: a piece of fewer than 3 bytes
        memcpy(s->carry, tmp, n);
        s->carry_len = (int)n;
        return p->len;
    }
    if (len < 0) {
        invalid(s, &s->carry_pos, 0);
        return 0;
    }
    return (size_t)(len - carried);
}

void text_scan_piece(TextScan *s, const DocPiece *p) {
    s->bytes += p->len;
    size_t i = s->carry_len ? finish_carry(s, p) : 0;
    const char *t = p->text;
    while (i < p->len) {
        unsigned char c = (unsigned char)t[i];
        if (c < 0x80) {
            mark(s, c);
            s->chars += s->valid;
            i++;
            continue;
        }
        int len = scan_char(s, t + i, p->len - i);
        if (len == 0) {
            s->carry_len = (int)(p->len - i);
            memcpy(s->carry, t + i, (size_t)s->carry_len);
            s->carry_pos = p->pos;
            s->carry_pos.offset += i;
            return;
        }
        if (len < 0) {
            invalid(s, &p->pos, i);
            len = 1;
        }
        i += (size_t)len;
    }
}

void text_scan_finish(TextScan *s) {
    if (s->carry_len) invalid(s, &s->carry_pos, 0);
    s->carry_len = 0;
}

Tokenizer *text_scan_char_vocab(const TextScan *s, char *err, size_t errlen) {
    CHECK(s->seen);
    ByteBuf chars = {0};
    for (uint32_t cp = 0; cp < CODEPOINTS; cp++) {
        if (!(s->seen[cp >> 3] >> (cp & 7) & 1)) continue;
        char u[UTF8_MAX_BYTES];
        bytebuf_append(&chars, u, (size_t)utf8_encode(cp, u));
    }
    Tokenizer *t = tokenizer_build_char(chars.p ? chars.p : "", chars.len, err, errlen);
    bytebuf_free(&chars);
    return t;
}
