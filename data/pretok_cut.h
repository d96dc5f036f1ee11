// pretok_cut: the rule both parallel GPT-2 encoders (gpt2_bpe_encode's whole-text split and
// prepare's segmenter) cut text by. A '\n' with a printable ASCII character (not a space) on
// each side is a match of GPT-2's pre-tokenizer on its own: \s+(?!\S) fails there and \s+ takes
// the one character, and no match on either side can reach over it. Invalid UTF-8 cannot span
// it either, so replacing invalid bytes per piece is the same as for the whole text.
#pragma once

// Printable ASCII other than the space: 0x21..0x7E.
static inline int pretok_printable(unsigned char c) { return c > 0x20 && c < 0x7F; }

// Whether a '\n' between the bytes before and after it is a safe place to cut (just after it).
static inline int pretok_newline_cut(unsigned char before, unsigned char after) {
    return pretok_printable(before) && pretok_printable(after);
}
