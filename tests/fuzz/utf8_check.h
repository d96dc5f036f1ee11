// What the two GPT-2 harnesses check of an encoding: every id is a mergeable token (never
// <|endoftext|>, which gpt2_bpe_encode does not recognise in text), the ids decode to valid
// UTF-8 when the text is valid, and then to exactly the text.
#pragma once
#include "data/gpt2_bpe.h"
#include "data/utf8.h"
#include "tests/fuzz/fuzz.h"

static inline int fuzz_utf8_valid(const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n;) {
        const int l = utf8_char_len((const char *)p + i, n - i, NULL);
        if (l < 0) return 0;
        i += (size_t)l;
    }
    return 1;
}

static inline void fuzz_check_encoding(const Gpt2Bpe *t, const uint8_t *text, size_t n) {
    int *ids = NULL;
    size_t n_ids = 0, cap = 0;
    FUZZ_ASSERT(gpt2_bpe_encode(t, (const char *)text, n, &ids, &n_ids, &cap, NULL, 0) == 0);
    const int valid = fuzz_utf8_valid(text, n);
    unsigned char *back = malloc(3 * n + 1);   // each invalid byte decodes to at most U+FFFD
    size_t len = 0;
    for (size_t i = 0; i < n_ids; i++) {
        int l;
        FUZZ_ASSERT(ids[i] >= 0 && ids[i] < gpt2_bpe_eot(t));
        const unsigned char *b = gpt2_bpe_token_bytes(t, ids[i], &l);
        FUZZ_ASSERT(b != NULL && l >= 1 && len + (size_t)l <= 3 * n);
        memcpy(back + len, b, (size_t)l);
        len += (size_t)l;
    }
    FUZZ_ASSERT(!valid || (len == n && memcmp(back, text, n) == 0));
    FUZZ_ASSERT(valid || fuzz_utf8_valid(back, len));
    free(back);
    free(ids);
}
