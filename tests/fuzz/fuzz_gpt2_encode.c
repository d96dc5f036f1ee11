// fuzz_gpt2_encode: GPT-2's pre-tokenizer (the PCRE2 pattern), invalid UTF-8 replacement and the
// BPE merges (the linear path for short pre-tokens, the heap path above 128 bytes) on arbitrary
// bytes, with OpenAI's encoder.json and vocab.bpe ($FLASHGPT_GPT2_DIR, else data_cache/gpt2/:
// scripts/fetch_data.sh). Promises: utf8_check.h's, and the parallel encoder (documents split at
// "\n\n", 2 threads) gives <|endoftext|> + the encoding of each document.
#include "common/check.h"
#include "tests/fuzz/utf8_check.h"

// Loaded once per process, as libFuzzer's initialisation hook allows (no global state of the
// library itself is involved).
static Gpt2Bpe *bpe;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    char err[4096];
    bpe = gpt2_bpe_load_default(NULL, NULL, err, sizeof err);
    if (!bpe) {
        fprintf(stderr, "fuzz_gpt2_encode: %s\n", err);
        exit(1);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_check_encoding(bpe, data, size);
    int *docs = NULL, *one = NULL;
    size_t n_docs = 0, cap_docs = 0, n_one = 0, cap_one = 0;
    gpt2_bpe_encode_documents(bpe, (const char *)data, size, "\n\n", 2, &docs, &n_docs, &cap_docs, NULL, 0);
    for (size_t start = 0;;) {
        const uint8_t *hit = NULL;
        for (size_t i = start; i + 1 < size && !hit; i++)
            if (data[i] == '\n' && data[i + 1] == '\n') hit = data + i;
        const size_t end = hit ? (size_t)(hit - data) + 2 : size;
        const int eot = gpt2_bpe_eot(bpe);
        if (n_one == cap_one) one = realloc(one, (cap_one = 2 * cap_one + 16) * sizeof(int));
        one[n_one++] = eot;
        gpt2_bpe_encode(bpe, (const char *)data + start, end - start, &one, &n_one, &cap_one, NULL, 0);
        if (!hit) break;
        start = end;
    }
    FUZZ_ASSERT(n_docs == n_one && memcmp(docs, one, n_one * sizeof(int)) == 0);
    free(docs);
    free(one);
    return 0;
}
