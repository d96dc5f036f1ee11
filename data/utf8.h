// utf8: validation of UTF-8 and code points to and from it, for the tokenizers, the JSON string
// decoder and the char vocabulary scan. utf8_encode and utf8_decode trust their input; validate
// it with utf8_char_len first.
#pragma once
#include <stddef.h>
#include <stdint.h>

#define UTF8_MAX_BYTES 4

// Bytes in the UTF-8 character at s (at most left bytes available): 1..4, or -1 when the bytes
// are not valid UTF-8 (overlong forms, surrogates and values above U+10FFFF are invalid, and so
// is left == 0). On -1, *bad (when not NULL and left > 0) is the number of bytes that one U+FFFD
// replaces, as Python's bytes.decode('utf-8', errors='replace') does: the lead byte and the
// continuation bytes that were still acceptable (the maximal subpart). Inline: the GPT-2
// encoder's replacement pass calls it for every non-ASCII character.
static inline int utf8_char_len(const char *s, size_t left, int *bad) {
    const unsigned char *p = (const unsigned char *)s;
    if (left == 0) return -1;
    const unsigned c = p[0];
    if (c < 0x80) return 1;
    int need;
    unsigned lo = 0x80, hi = 0xBF;   // the range of the next byte
    if (c >= 0xC2 && c <= 0xDF) {
        need = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        if (c == 0xE0) lo = 0xA0;   // no overlong forms
        if (c == 0xED) hi = 0x9F;   // no UTF-16 surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        if (c == 0xF0) lo = 0x90;   // no overlong forms
        if (c == 0xF4) hi = 0x8F;   // nothing above U+10FFFF
    } else {
        if (bad) *bad = 1;
        return -1;
    }
    for (int k = 1; k <= need; k++) {
        if ((size_t)k >= left || p[k] < lo || p[k] > hi) {
            if (bad) *bad = k;
            return -1;
        }
        lo = 0x80;
        hi = 0xBF;
    }
    return need + 1;
}

// Writes the UTF-8 encoding of code point cp (at most U+10FFFF, not a surrogate) to out;
// returns its length, 1..4.
int utf8_encode(uint32_t cp, char out[UTF8_MAX_BYTES]);
// The code point of the valid len-byte sequence at p (len from utf8_char_len).
uint32_t utf8_decode(const char *p, int len);
// Whether byte c starts a character (is not a continuation byte 10xxxxxx).
static inline int utf8_is_lead(unsigned char c) { return (c & 0xC0) != 0x80; }
