// utf8: code points to and from UTF-8, for the JSON string decoder and the char vocabulary scan.
// Validation is tokenizer_utf8_char_len's (data/tokenizer.h): these functions trust their input.
#pragma once
#include <stdint.h>

#define UTF8_MAX_BYTES 4

// Writes the UTF-8 encoding of code point cp (at most U+10FFFF, not a surrogate) to out;
// returns its length, 1..4.
int utf8_encode(uint32_t cp, char out[UTF8_MAX_BYTES]);
// The code point of the valid len-byte sequence at p (len from tokenizer_utf8_char_len).
uint32_t utf8_decode(const char *p, int len);
// Whether byte c starts a character (is not a continuation byte 10xxxxxx).
static inline int utf8_is_lead(unsigned char c) { return (c & 0xC0) != 0x80; }
