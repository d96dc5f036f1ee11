// fuzz_shard: llm.c token shards (shard_open: header, size, token range) and the dataset that
// reads windows from them (data/dataset.c, with the shuffled order). Input: a shard file.
// Promises: every token read is below the vocabulary shard_open checked; a dataset over an
// accepted shard yields windows of in-range tokens whose targets are the inputs shifted by one.
#include "common/check.h"
#include "common/config.h"
#include "data/dataset.h"
#include "data/shard.h"
#include "tests/fuzz/fuzz.h"

#define VOCAB 1000
#define B 2
#define T 8

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[256], err[ERR_LEN];
    fuzz_write_file(fuzz_scratch("shard.bin", path, sizeof path), data, size);
    Shard s;
    if (shard_open(&s, path, VOCAB, err, sizeof err) != 0) {
        FUZZ_ASSERT(err[0] != '\0');
        unlink(path);
        return 0;
    }
    int buf[64];
    for (uint64_t i = 0; i < s.n_tokens; i += 64) {
        const size_t n = s.n_tokens - i < 64 ? (size_t)(s.n_tokens - i) : 64;
        shard_read(&s, i, n, buf);
        for (size_t k = 0; k < n; k++) FUZZ_ASSERT(buf[k] >= 0 && buf[k] < VOCAB);
    }
    const uint64_t n_tokens = s.n_tokens;
    shard_close(&s);
    Config c;
    config_defaults(&c);
    c.model.vocab_size = VOCAB;
    c.data.shuffle = size % 2;   // both window orders
    snprintf(c.data.train, sizeof c.data.train, "%s", path);
    Dataset *d = dataset_open(&c, SPLIT_TRAIN, B, T, 0, 1, err, sizeof err);
    FUZZ_ASSERT(d != NULL || n_tokens <= T);   // a shard of T + 1 tokens has a window
    for (int batch = 0; d && batch < 4; batch++) {
        int in[B * T], tgt[B * T];
        dataset_next(d, in, tgt);
        for (int i = 0; i < B * T; i++) {
            FUZZ_ASSERT(in[i] >= 0 && in[i] < VOCAB && tgt[i] >= 0 && tgt[i] < VOCAB);
            if (i % T != T - 1) FUZZ_ASSERT(tgt[i] == in[i + 1]);
        }
    }
    dataset_close(d);
    unlink(path);
    return 0;
}
