// ckpt_state: state.json's text. SHA-256 against the FIPS 180-2 vectors; the round trip of the
// train state and the file digests; every single changed byte of the text is refused (the
// self-checksum covers all of it); an older flashgpt-state-1 file loads unchecked; a wrong or
// missing format tag, a missing member, a digest of the wrong form are refused with a message.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/config.h"
#include "common/digest.h"
#include "trainer/ckpt_state.h"
#include "tests/testlib.h"

static void sample_state(TrainState *st, CkptFile files[2]) {
    memset(st, 0, sizeof *st);
    st->step = 1234;
    st->tokens_seen = 9007199254740992LL;   // 2^53: the largest exact count
    st->world_size = 2;
    for (int i = 0; i < 4; i++) st->rng[i] = 0xFEDCBA9876543210ull + (uint64_t)i;
    st->data[0] = 77;
    st->scaler = (LossScaler){.scale = 32768.0f, .dynamic = 1, .window = 1000, .clean_steps = 5,
                              .skipped = 3};
    st->guard_loss_mean = 2.718281828459045;
    memset(files, 0, 2 * sizeof *files);
    snprintf(files[0].name, sizeof files[0].name, "model.safetensors");
    sha256_buffer("weights", 7, &files[0].digest);
    snprintf(files[1].name, sizeof files[1].name, "optimizer_rank0.safetensors");
    sha256_buffer("", 0, &files[1].digest);
}

static void test_sha256_vectors(void) {
    FileDigest d;
    sha256_buffer("abc", 3, &d);
    EXPECT(strcmp(d.sha256, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad") == 0, "%s", d.sha256);
    EXPECT(d.size == 3, "%llu", (unsigned long long)d.size);
    Sha256 s;   // streamed in pieces: the same digest
    sha256_begin(&s);
    sha256_update(&s, "a", 1);
    sha256_update(&s, "bc", 2);
    FileDigest e;
    sha256_end(&s, &e);
    EXPECT(strcmp(d.sha256, e.sha256) == 0 && e.size == 3, "%s", e.sha256);
    sha256_buffer("", 0, &d);
    EXPECT(strcmp(d.sha256, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") == 0, "%s", d.sha256);
}

static void test_round_trip(void) {
    TrainState st;
    CkptFile files[2];
    sample_state(&st, files);
    Config c;
    config_defaults(&c);
    c.train.steps = 4321;
    char *text = ckpt_state_format(&st, &c, files, 2), err[ERR_LEN];
    CkptState s;
    EXPECT(ckpt_state_parse(text, strlen(text), "d", &s, err, sizeof err) == 0, "%s", err);
    EXPECT(s.checked && s.n_files == 2, "checked %d, %d files", s.checked, s.n_files);
    EXPECT(memcmp(&s.train, &st, sizeof st) == 0, "the train state differs after the round trip");
    const FileDigest *d = ckpt_state_digest(&s, "model.safetensors");
    EXPECT(d && strcmp(d->sha256, files[0].digest.sha256) == 0 && d->size == 7, "model digest");
    EXPECT(ckpt_state_digest(&s, "tokenizer.bin") == NULL, "an unlisted file has no digest");
    Config back;
    config_defaults(&back);
    EXPECT(config_load_json(&back, s.config_json, "state", err, sizeof err) == 0 && back.train.steps == 4321,
           "%s", err);
    ckpt_state_free(&s);
    free(text);
}

// Every byte of the text, changed to another value, makes the parse fail.
static void test_every_byte_is_checked(void) {
    TrainState st;
    CkptFile files[2];
    sample_state(&st, files);
    Config c;
    config_defaults(&c);
    char *text = ckpt_state_format(&st, &c, files, 2), err[ERR_LEN];
    const size_t n = strlen(text);
    size_t accepted = 0, named = 0;
    for (size_t i = 0; i < n; i++) {
        const char saved = text[i];
        text[i] = saved == ' ' ? '\t' : saved == 'a' ? 'b' : (char)(saved ^ 0x01);
        CkptState s;
        if (ckpt_state_parse(text, n, "d", &s, err, sizeof err) == 0) {
            accepted++;
            ckpt_state_free(&s);
        } else {
            named += strstr(err, "checkpoint d: state.json") != NULL;
        }
        text[i] = saved;
    }
    EXPECT(accepted == 0, "%zu of %zu changed bytes were accepted", accepted, n);
    EXPECT(named == n, "%zu of %zu messages name the checkpoint and state.json", named, n);
    free(text);
}

// The writer's text with member `key` of the top level replaced by `value` (JSON text; NULL
// removes it) and, when `fix` is set, its self-checksum recomputed, so the parse reaches the
// check after it.
static char *edited(const char *key, const char *value, int fix) {
    TrainState st;
    CkptFile files[2];
    sample_state(&st, files);
    Config c;
    config_defaults(&c);
    char *text = ckpt_state_format(&st, &c, files, 2);
    char pat[64];
    snprintf(pat, sizeof pat, "\n\t\"%s\":\t", key);
    char *at = strstr(text, pat);
    CHECK(at != NULL);
    char *val = at + strlen(pat), *end = val;
    int depth = 0;   // the value runs to the next comma (or newline) outside brackets
    for (; *end && !(depth == 0 && (*end == ',' || *end == '\n')); end++)
        depth += (*end == '{' || *end == '[') - (*end == '}' || *end == ']');
    char *out = xmalloc(strlen(text) + (value ? strlen(value) : 0) + 1);
    if (value) sprintf(out, "%.*s%s%s", (int)(val - text), text, value, end);
    else sprintf(out, "%.*s%s", (int)(at - text), text, *end == ',' ? end + 1 : end);
    free(text);
    if (fix) {   // recompute state_sha256 as the writer does: over the text with its digits 0
        char *slot = strstr(out, "\"state_sha256\":\t\"") + strlen("\"state_sha256\":\t\"");
        memset(slot, '0', SHA256_HEX_LEN);
        FileDigest d;
        sha256_buffer(out, strlen(out), &d);
        memcpy(slot, d.sha256, SHA256_HEX_LEN);
    }
    return out;
}

static void expect_refused(const char *key, const char *value, int fix, const char *needle) {
    char *text = edited(key, value, fix), err[ERR_LEN] = "";
    CkptState s;
    const int rc = ckpt_state_parse(text, strlen(text), "d", &s, err, sizeof err);
    EXPECT(rc != 0 && strstr(err, needle), "%s = %s: rc %d, '%s' (expected '%s')", key,
           value ? value : "(removed)", rc, err, needle);
    if (rc == 0) ckpt_state_free(&s);
    free(text);
}

static void test_refusals(void) {
    expect_refused("step", "1235", 0, "state.json is corrupt (checksum mismatch)");
    expect_refused("format", "\"flashgpt-state-9\"", 1, "has format 'flashgpt-state-9'");
    expect_refused("format", NULL, 1, "has format '(none)'");
    expect_refused("step", NULL, 1, "missing fields");
    expect_refused("step", "-1", 1, "missing fields");
    expect_refused("world_size", "0", 1, "missing fields");
    expect_refused("loss_scaler", "{\"scale\": 0}", 1, "loss_scaler");
    expect_refused("files", "{\"model.safetensors\": {\"size\": 1, \"sha256\": \"XYZ\"}}", 1, "'files'");
    expect_refused("config", NULL, 1, "no config");
}

// A state.json from before checksums (flashgpt-state-1: no files, no state_sha256) loads, unchecked.
static void test_unchecked_format(void) {
    char *a = edited("files", NULL, 0);
    char *tail = strstr(a, ",\n\t\"state_sha256\"");
    CHECK(tail != NULL);
    strcpy(tail, "\n}");
    char *fmt = strstr(a, "flashgpt-state-2");
    fmt[strlen("flashgpt-state-")] = '1';
    char err[ERR_LEN];
    CkptState s;
    EXPECT(ckpt_state_parse(a, strlen(a), "d", &s, err, sizeof err) == 0, "%s", err);
    EXPECT(!s.checked && s.n_files == 0 && s.train.step == 1234, "checked %d", s.checked);
    ckpt_state_free(&s);
    fmt[strlen("flashgpt-state-")] = '2';   // the new tag without its checksum: refused
    EXPECT(ckpt_state_parse(a, strlen(a), "d", &s, err, sizeof err) != 0 && strstr(err, "corrupt"), "%s", err);
    free(a);
}

int main(void) {
    TEST_CASE("sha256 vectors, streamed and whole", test_sha256_vectors());
    TEST_CASE("state.json round trip", test_round_trip());
    TEST_CASE("every changed byte of state.json is refused", test_every_byte_is_checked());
    TEST_CASE("wrong tag, missing and malformed members are refused", test_refusals());
    TEST_CASE("flashgpt-state-1 loads without checksums", test_unchecked_format());
    return TEST_SUMMARY();
}
