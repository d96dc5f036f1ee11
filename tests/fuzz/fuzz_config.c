// fuzz_config: the JSON config (config_load_json) and --set overrides (config_set), then the
// cross-key rules (config_validate). Input: the JSON text, optionally a NUL byte and --set
// arguments, one per line. Promise: a config that validates serialises (config_to_json) to
// JSON that loads and validates again into the same serialisation, as a checkpoint's state.json
// must for a resume.
#include "common/check.h"
#include "common/config.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = fuzz_text(data, size), err[ERR_LEN];
    const size_t json_len = fuzz_split(data, size);
    Config c;
    config_defaults(&c);
    int rc = config_load_json(&c, text, "fuzz.json", err, sizeof err);
    FUZZ_ASSERT(rc == 0 || err[0] != '\0');
    for (char *line = text + json_len + 1; rc == 0 && json_len < size && line <= text + size;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = '\0';
        if (config_set(&c, line, err, sizeof err) != 0) FUZZ_ASSERT(err[0] != '\0');
        if (!nl) break;
        line = nl + 1;
    }
    if (rc == 0 && config_validate(&c, err, sizeof err) == 0) {
        char *json = config_to_json(&c);
        Config again;
        config_defaults(&again);
        rc = config_load_json(&again, json, "round trip", err, sizeof err);
        if (rc == 0) rc = config_validate(&again, err, sizeof err);
        if (rc != 0) fprintf(stderr, "fuzz_config: the serialised config does not load: %s\n", err);
        FUZZ_ASSERT(rc == 0);
        char *json2 = config_to_json(&again);
        FUZZ_ASSERT(strcmp(json, json2) == 0);
        free(json2);
        free(json);
    }
    free(text);
    return 0;
}
