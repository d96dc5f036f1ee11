// fuzz_hf_config: a Hugging Face config.json of gpt2, starcoder2 or gpt_neox
// (convert_hf_parse_config: the keys flashgpt reads and the options it refuses) and the import config made from it (convert_import_config,
// through the config table's ranges). Input: a config.json. Promise: an accepted architecture
// gives a config that validates with the same sizes.
#include "common/check.h"
#include "convert/convert.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = fuzz_text(data, size), err[ERR_LEN];
    GPTConfig g;
    int window;
    if (convert_hf_parse_config(text, size, "config.json", &g, &window, err, sizeof err) == 0) {
        Config c;
        if (convert_import_config(&c, &g, window, "config.json", err, sizeof err) == 0) {
            FUZZ_ASSERT(c.model.n_layer == g.L && c.model.n_head == g.NH && c.model.n_embd == g.C);
            FUZZ_ASSERT(c.model.vocab_size == g.V && c.model.max_seq_len == g.maxT);
            FUZZ_ASSERT(c.model.n_kv_head == g.NKV && c.attention.window == window);
            FUZZ_ASSERT(config_validate(&c, err, sizeof err) == 0);
        } else {
            FUZZ_ASSERT(err[0] != '\0');
        }
    } else {
        FUZZ_ASSERT(err[0] != '\0');
    }
    free(text);
    return 0;
}
