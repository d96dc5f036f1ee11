// fuzz_tokenizer: llm.c's tokenizer file (tokenizer_parse), and the char vocabulary that
// `prepare --tokenizer char` builds from a text (tokenizer_build_char). Input: a tokenizer file,
// read as a text too. Promises: every id decodes to 1..255 bytes and encodes back (greedy
// longest match) to ids whose bytes are the same; encoding the input with the file's vocabulary,
// when it succeeds, decodes back to it; a char vocabulary built from the input (valid UTF-8)
// encodes all of it, one id per character, and decodes back to it.
#include "common/check.h"
#include "data/tokenizer.h"
#include "data/utf8.h"
#include "tests/fuzz/fuzz.h"

// ids[0..n) decode to exactly len bytes at p.
static int decodes_to(const Tokenizer *t, const int *ids, long n, const unsigned char *p, size_t len) {
    size_t pos = 0;
    for (long i = 0; i < n; i++) {
        int l;
        const unsigned char *b = tokenizer_decode(t, ids[i], &l);
        if (!b || pos + (size_t)l > len || memcmp(b, p + pos, (size_t)l) != 0) return 0;
        pos += (size_t)l;
    }
    return pos == len;
}

static void check_char_vocabulary(const uint8_t *data, size_t size) {
    char err[ERR_LEN];
    Tokenizer *t = tokenizer_build_char((const char *)data, size, err, sizeof err);
    if (!t) {
        FUZZ_ASSERT(err[0] != '\0');
        return;
    }
    int *ids = malloc(size * sizeof(int));
    const long k = tokenizer_encode_bytes(t, (const char *)data, size, ids, (long)size);
    FUZZ_ASSERT(k >= 1 && decodes_to(t, ids, k, data, size));
    for (long i = 0; i < k; i++) {   // one id per character, in code point order
        int len;
        const unsigned char *b = tokenizer_decode(t, ids[i], &len);
        FUZZ_ASSERT(utf8_char_len((const char *)b, (size_t)len, NULL) == len);
    }
    free(ids);
    tokenizer_free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[ERR_LEN];
    check_char_vocabulary(data, size);
    Tokenizer *t = tokenizer_parse(data, size, "fuzz.bin", err, sizeof err);
    if (!t) {
        FUZZ_ASSERT(err[0] != '\0');
        return 0;
    }
    const int n = tokenizer_vocab_size(t), eot = tokenizer_eot(t);
    FUZZ_ASSERT(n >= 1 && eot >= -1 && eot < n);
    int ids[256];
    for (int id = 0; id < n && id < 4096; id++) {
        int len;
        const unsigned char *b = tokenizer_decode(t, id, &len);
        FUZZ_ASSERT(b != NULL && len >= 1 && len <= 255);
        const long k = tokenizer_encode_bytes(t, (const char *)b, (size_t)len, ids, 256);
        FUZZ_ASSERT(k >= 1 && decodes_to(t, ids, k, b, (size_t)len));
    }
    int len;
    FUZZ_ASSERT(tokenizer_decode(t, n, &len) == NULL && tokenizer_decode(t, -1, &len) == NULL);
    int *all = malloc((size ? size : 1) * sizeof(int));
    const long k = tokenizer_encode_bytes(t, (const char *)data, size, all, (long)size);
    FUZZ_ASSERT(k == -1 || decodes_to(t, all, k, data, size));
    free(all);
    tokenizer_free(t);
    return 0;
}
