// fuzz_state: a checkpoint's state.json (ckpt_state_parse: the self-checksum, the format tag,
// the train state, the file digests) and the run config inside it (config_load_json and
// config_validate, as checkpoint_read_config reads it). Input: a state.json. Promise: an
// accepted state.json whose config validates, written again (ckpt_state_format), parses to the
// same train state and digests.
#include "common/check.h"
#include "common/config.h"
#include "trainer/ckpt_state.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = fuzz_text(data, size), err[ERR_LEN];
    CkptState s;
    if (ckpt_state_parse(text, size, "fuzz", &s, err, sizeof err) != 0) {
        FUZZ_ASSERT(err[0] != '\0');
        free(text);
        return 0;
    }
    Config c;
    config_defaults(&c);
    if (config_load_json(&c, s.config_json, "fuzz/state.json", err, sizeof err) == 0 &&
        config_validate(&c, err, sizeof err) == 0) {
        char *again = ckpt_state_format(&s.train, &c, s.files, s.n_files);
        CkptState t;
        FUZZ_ASSERT(ckpt_state_parse(again, strlen(again), "again", &t, err, sizeof err) == 0);
        FUZZ_ASSERT(t.checked && t.n_files == s.n_files);
        FUZZ_ASSERT(memcmp(&t.train, &s.train, sizeof t.train) == 0);
        FUZZ_ASSERT(s.n_files == 0 || memcmp(t.files, s.files, (size_t)s.n_files * sizeof *s.files) == 0);
        ckpt_state_free(&t);
        free(again);
    }
    ckpt_state_free(&s);
    free(text);
    return 0;
}
