// passkey: the passkey prompts of trainer/passkey.h built from token ids, checked against
// sequences written out by hand (where the needle sits for each depth, the filler cycling and
// cut, the lengths), the refusal of a length too short for the prompt, and the real texts
// through the byte tokenizer: the decoded sequence states the key once, at its depth, and ends
// with the question and the answer.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "data/tokenizer.h"
#include "trainer/passkey.h"
#include "tests/testlib.h"

// One byte per token (the byte tokenizer's ids) into r's storage.
static TokenRun bytes_run(const char *s, int *store) {
    const int n = (int)strlen(s);
    for (int i = 0; i < n; i++) store[i] = (unsigned char)s[i];
    return (TokenRun){store, n};
}

static void seq_text(const int *seq, int n, char *out) {
    for (int i = 0; i < n; i++) out[i] = (char)seq[i];
    out[n] = '\0';
}

// intro "I.", filler "ab", needle "K7", question "?", answer "7": 6 tokens at the least, so a
// sequence of 12 has F = 6 filler tokens and the needle after round(6 depth) of them.
static void test_hand_computed_layouts(void) {
    int s[5][8];
    PasskeyPieces p = {bytes_run("I.", s[0]), bytes_run("ab", s[1]), bytes_run("K7", s[2]), bytes_run("?", s[3]),
                       bytes_run("7", s[4])};
    EXPECT(passkey_min_length(&p) == 6, "min length %d", passkey_min_length(&p));
    const double depth[5] = {0, 0.25, 0.5, 0.75, 1};
    // round(6 d) = 0, 2 (1.5 rounds up), 3, 5 (4.5 rounds up), 6
    const char *want[5] = {"I.K7ababab?7", "I.abK7abab?7", "I.abaK7bab?7", "I.ababaK7b?7", "I.abababK7?7"};
    const int want_at[5] = {2, 4, 5, 7, 8};
    for (int d = 0; d < 5; d++) {
        PasskeyLayout l;
        char err[ERR_LEN];
        EXPECT(passkey_layout(&p, 12, depth[d], &l, err, sizeof err) == 0, "depth %g: %s", depth[d], err);
        EXPECT(l.length == 12 && l.prompt_len == 11 && l.filler == 6 && l.needle_at == want_at[d],
               "depth %g: length %d prompt %d filler %d needle at %d", depth[d], l.length, l.prompt_len, l.filler,
               l.needle_at);
        int seq[16];
        char text[17];
        passkey_build(&p, &l, seq);
        seq_text(seq, 12, text);
        EXPECT(strcmp(text, want[d]) == 0, "depth %g: '%s', want '%s'", depth[d], text, want[d]);
    }
    // A filler longer than F is cut; one shorter is repeated (filler "xyz" and F = 7).
    int f[4];
    p.filler = bytes_run("xyz", f);
    PasskeyLayout l;
    char err[ERR_LEN], text[17];
    int seq[16];
    EXPECT(passkey_layout(&p, 13, 0.5, &l, err, sizeof err) == 0 && l.filler == 7 && l.needle_at == 2 + 4,
           "filler %d needle at %d", l.filler, l.needle_at);
    passkey_build(&p, &l, seq);
    seq_text(seq, 13, text);
    EXPECT(strcmp(text, "I.xyzxK7yzx?7") == 0, "cycled filler: '%s'", text);
    EXPECT(passkey_layout(&p, 5, 0.5, &l, err, sizeof err) == -1 && strstr(err, "at least 6 tokens"),
           "a length of 5 is refused: '%s'", err);
    EXPECT(passkey_layout(&p, 6, 1.0, &l, err, sizeof err) == 0 && l.filler == 0 && l.needle_at == 2,
           "the shortest length has no filler");
}

// The real texts through the byte tokenizer, key 12345, 400 tokens at depth 0.3.
static void test_byte_tokenizer_prompt(void) {
    char needle[160], answer[32];
    passkey_key_texts(12345, needle, sizeof needle, answer, sizeof answer);
    EXPECT(strcmp(needle, "The pass key is 12345. Remember it. 12345 is the pass key.\n") == 0 &&
           strcmp(answer, " 12345") == 0, "texts '%s' '%s'", needle, answer);
    Tokenizer *tok = tokenizer_build_byte();
    const char *texts[5] = {PASSKEY_INTRO, PASSKEY_FILLER, needle, PASSKEY_QUESTION, answer};
    int ids[5][160];
    TokenRun r[5];
    for (int k = 0; k < 5; k++) {
        const long n = tokenizer_encode_simple(tok, texts[k], ids[k], 160);
        EXPECT(n == (long)strlen(texts[k]), "piece %d: %ld ids", k, n);
        r[k] = (TokenRun){ids[k], (int)n};
    }
    PasskeyPieces p = {r[0], r[1], r[2], r[3], r[4]};
    const int L = 400, fixed = (int)(strlen(PASSKEY_INTRO) + strlen(needle) + strlen(PASSKEY_QUESTION) + 6);
    PasskeyLayout l;
    char err[ERR_LEN];
    EXPECT(passkey_layout(&p, L, 0.3, &l, err, sizeof err) == 0, "%s", err);
    const int F = L - fixed, before = (int)floor(0.3 * F + 0.5);
    EXPECT(l.filler == F && l.prompt_len == L - 6 && l.needle_at == (int)strlen(PASSKEY_INTRO) + before,
           "filler %d (want %d), needle at %d", l.filler, F, l.needle_at);
    int seq[400];
    char text[401];
    passkey_build(&p, &l, seq);
    seq_text(seq, L, text);
    // Written out: the intro, `before` characters of the filler repeated, the needle, the rest.
    char want[401];
    size_t w = 0;
    const size_t fl = strlen(PASSKEY_FILLER);
    w += (size_t)snprintf(want, sizeof want, "%s", PASSKEY_INTRO);
    for (int i = 0; i < F; i++) {
        if (i == before) w += (size_t)snprintf(want + w, sizeof want - w, "%s", needle);
        want[w++] = PASSKEY_FILLER[i % fl];
    }
    snprintf(want + w, sizeof want - w, "%s%s", PASSKEY_QUESTION, answer);
    EXPECT(strcmp(text, want) == 0, "the sequence differs from the one written out:\n%s\n%s", text, want);
    const char *key_at = strstr(text, "The pass key is 12345");
    EXPECT(key_at && key_at - text == l.needle_at && !strstr(key_at + 1, "The pass key is 12345."),
           "the key is stated once, at token %d", l.needle_at);
    const double depth = (double)(l.needle_at - (int)strlen(PASSKEY_INTRO)) / F;
    EXPECT(fabs(depth - 0.3) <= 0.5 / F, "depth %g", depth);
    EXPECT(strcmp(text + L - 6 - strlen(PASSKEY_QUESTION), PASSKEY_QUESTION " 12345") == 0, "the end: '%s'",
           text + L - 50);
    tokenizer_free(tok);
}

static void test_keys_have_five_digits(void) {
    Rng r;
    rng_seed(&r, 7);
    int lo = 1 << 30, hi = 0;
    for (int i = 0; i < 10000; i++) {
        const int k = passkey_draw_key(&r);
        lo = k < lo ? k : lo;
        hi = k > hi ? k : hi;
    }
    EXPECT(lo >= 10000 && hi <= 99999 && lo < 10100 && hi > 99900, "keys in [%d, %d]", lo, hi);
}

int main(void) {
    TEST_CASE("layouts and sequences of a tiny vocabulary, written out by hand", test_hand_computed_layouts());
    TEST_CASE("the passkey texts through the byte tokenizer", test_byte_tokenizer_prompt());
    TEST_CASE("keys are 5-digit numbers", test_keys_have_five_digits());
    return TEST_SUMMARY();
}
