// fuzz_gpt2_load: GPT-2's encoder.json and vocab.bpe (gpt2_bpe_load_buffers: the JSON, the
// byte alphabet, the merges checked against the vocabulary). Input: encoder.json, a NUL byte,
// vocab.bpe. Promise: a pair that loads encodes the input itself (any bytes) into ids of its
// mergeable tokens that decode back to the text (utf8_check.h).
#include "common/check.h"
#include "tests/fuzz/utf8_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const size_t enc_len = fuzz_split(data, size);
    const size_t bpe_off = enc_len < size ? enc_len + 1 : size;
    char *enc = fuzz_text(data, enc_len), *bpe = fuzz_text(data + bpe_off, size - bpe_off);
    char err[ERR_LEN];
    Gpt2Bpe *t = gpt2_bpe_load_buffers(enc, enc_len, "encoder.json", bpe, size - bpe_off, "vocab.bpe",
                                       err, sizeof err);
    if (t) {
        FUZZ_ASSERT(gpt2_bpe_vocab_size(t) >= 257 && gpt2_bpe_eot(t) == gpt2_bpe_vocab_size(t) - 1);
        fuzz_check_encoding(t, data, size);
        gpt2_bpe_free(t);
    } else {
        FUZZ_ASSERT(err[0] != '\0');
    }
    free(enc);
    free(bpe);
    return 0;
}
