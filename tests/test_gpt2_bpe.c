// gpt2_bpe: loading small hand-made vocabularies, the merge order, the linear and heap merge paths,
// decoding, the parallel encoder, every kind of bad encoder.json / vocab.bpe (NULL with a
// message naming the file and the problem), and out of memory while encoding (-1 and a message). tests/test_gpt2_bpe.py checks the real GPT-2 files
// against tiktoken.
#define _GNU_SOURCE   // memmem
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/check.h"
#include "data/gpt2_bpe.h"
#include "tests/testlib.h"

// A small vocabulary: the 256 bytes, then these merges (GPT-2 alphabet, so 'Ġ' is a space).
static const char *MERGES[] = {"a a", "aa aa", "a b", "Ġ a", "ab c", "x y"};
#define N_MERGES 6

typedef struct {
    char dir[64], enc[128], voc[128];
} Files;

// Writes the GPT-2 alphabet spelling of byte b (one character, UTF-8) into out; returns its
// length. Printable bytes stand for themselves, the rest are U+0100.. in byte order.
static int alphabet_char(int b, char *out) {
    int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b != 0xAD), cp = b;
    if (!printable) {
        cp = 256;
        for (int x = 0; x < b; x++)
            if (!((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x != 0xAD))) cp++;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | cp >> 6);
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(1);
    }
    fputs(text, f);
    fclose(f);
}

// encoder.json for the 256 bytes (in GPT-2's rank order), the merges' tokens and <|endoftext|>,
// with `extra` spliced in before the closing brace (to break it).
static char *make_encoder_json(const char **merges, int n_merges, const char *extra) {
    size_t cap = 1 << 16, n = 0;
    char *s = malloc(cap);
    n += (size_t)sprintf(s + n, "{");
    int id = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int b = 0; b < 256; b++) {
            int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b != 0xAD);
            if (printable != (pass == 0)) continue;
            char c[2];
            int k = alphabet_char(b, c);
            const char *esc = (b == '"' || b == '\\') ? "\\" : "";
            n += (size_t)sprintf(s + n, "\"%s%.*s\": %d, ", esc, k, c, id++);
        }
    for (int m = 0; m < n_merges; m++) {
        char tok[64];
        int k = 0;
        for (const char *p = merges[m]; *p; p++)
            if (*p != ' ') tok[k++] = *p;
        tok[k] = '\0';
        n += (size_t)sprintf(s + n, "\"%s\": %d, ", tok, id++);
    }
    sprintf(s + n, "%s\"<|endoftext|>\": %d}", extra, id);
    return s;
}

static char *make_vocab_bpe(const char **merges, int n_merges) {
    char *s = malloc(4096);
    size_t n = (size_t)sprintf(s, "#version: 0.2\n");
    for (int m = 0; m < n_merges; m++) n += (size_t)sprintf(s + n, "%s\n", merges[m]);
    return s;
}

static void files_write(Files *f, const char *encoder, const char *vocab) {
    write_file(f->enc, encoder);
    write_file(f->voc, vocab);
}

static void files_write_good(Files *f) {
    char *e = make_encoder_json(MERGES, N_MERGES, ""), *v = make_vocab_bpe(MERGES, N_MERGES);
    files_write(f, e, v);
    free(e);
    free(v);
}

// Writes the good files and loads them, expecting success; NULL (a failure counted) otherwise.
static Gpt2Bpe *load_good(Files *f) {
    files_write_good(f);
    char err[512] = "";
    Gpt2Bpe *t = gpt2_bpe_load(f->enc, f->voc, err, sizeof err);
    EXPECT(t != NULL, "load failed: %s", err);
    return t;
}

// At least cap bytes (malloc'd, *len of them) of the pieces in a pseudo-random order from seed.
static char *pieces_text(const char *const *pieces, int n, unsigned seed, size_t cap, size_t *len) {
    char *text = malloc(cap + 64);
    *len = 0;
    for (unsigned i = seed; *len < cap; i = i * 1103515245u + 12345u)
        *len += (size_t)sprintf(text + *len, "%s", pieces[(i >> 16) % (unsigned)n]);
    return text;
}

// Loads f, expects NULL and an error containing both `file` and `needle`.
static void expect_load_error(const Files *f, const char *file, const char *needle) {
    char err[512] = "";
    Gpt2Bpe *t = gpt2_bpe_load(f->enc, f->voc, err, sizeof err);
    EXPECT(t == NULL, "expected failure for '%s'", needle);
    EXPECT(strstr(err, file) != NULL, "error does not name %s: %s", file, err);
    EXPECT(strstr(err, needle) != NULL, "error does not say '%s': %s", needle, err);
    gpt2_bpe_free(t);
}

static int encode_str(const Gpt2Bpe *t, const char *s, int *out, int max) {
    int *ids = NULL;
    size_t n = 0, cap = 0;
    gpt2_bpe_encode(t, s, strlen(s), &ids, &n, &cap, NULL, 0);
    for (size_t i = 0; i < n && (int)i < max; i++) out[i] = ids[i];
    free(ids);
    return (int)n;
}

static int id_of(const Gpt2Bpe *t, const char *bytes) {
    for (int id = 0; id < gpt2_bpe_vocab_size(t); id++) {
        int len;
        const unsigned char *p = gpt2_bpe_token_bytes(t, id, &len);
        if ((size_t)len == strlen(bytes) && memcmp(p, bytes, (size_t)len) == 0) return id;
    }
    return -1;
}

static void test_small_vocab(Files *f) {
    Gpt2Bpe *t = load_good(f);
    if (!t) return;
    EXPECT(gpt2_bpe_vocab_size(t) == 256 + N_MERGES + 1, "vocab %d", gpt2_bpe_vocab_size(t));
    EXPECT(gpt2_bpe_eot(t) == 256 + N_MERGES, "eot %d", gpt2_bpe_eot(t));
    int len;
    const unsigned char *p = gpt2_bpe_token_bytes(t, gpt2_bpe_eot(t), &len);
    EXPECT(p && len == 13 && memcmp(p, "<|endoftext|>", 13) == 0, "eot bytes");
    EXPECT(gpt2_bpe_token_bytes(t, -1, &len) == NULL, "id -1");
    EXPECT(gpt2_bpe_token_bytes(t, gpt2_bpe_vocab_size(t), &len) == NULL, "id past the end");
    int aa = id_of(t, "aa"), aaaa = id_of(t, "aaaa"), ab = id_of(t, "ab"), abc = id_of(t, "abc");
    int sp_a = id_of(t, " a"), a = id_of(t, "a");
    EXPECT(aa == 256 && aaaa == 257 && ab == 258 && sp_a == 259 && abc == 260, "merge ids");
    int ids[1024], n;
    // "aaab": a+a (rank 256) wins over a+b (258) at the left, then aa+ab is no token.
    n = encode_str(t, "aaab", ids, 1024);
    EXPECT(n == 2 && ids[0] == aa && ids[1] == ab, "aaab -> aa ab (n=%d)", n);
    n = encode_str(t, "abc", ids, 1024);   // one pre-token that is one token
    EXPECT(n == 1 && ids[0] == abc, "abc");
    n = encode_str(t, "aaaaa", ids, 1024);   // leftmost first among equal ranks
    EXPECT(n == 2 && ids[0] == aaaa && ids[1] == a, "aaaaa -> aaaa a");
    // ' abc' is no token: 'ab' (258) beats ' a' (259), then 'abc'; ' a' is one token.
    n = encode_str(t, " abc a", ids, 1024);
    EXPECT(n == 3 && ids[0] == id_of(t, " ") && ids[1] == abc && ids[2] == sp_a, " abc a (n=%d)", n);
    n = encode_str(t, "<|endoftext|>", ids, 1024);   // special tokens are plain text
    EXPECT(n == 13 && ids[0] == id_of(t, "<"), "<|endoftext|> is not recognised (n=%d)", n);
    // Long pre-tokens take the heap path; both paths must agree: a run of 4k + r letters 'a' is
    // k tokens 'aaaa' and then 'aa' and/or 'a'.
    for (int len_a = 1; len_a <= 600; len_a += 37) {
        char *s = malloc((size_t)len_a + 1);
        memset(s, 'a', (size_t)len_a);
        s[len_a] = '\0';
        int *out = malloc(sizeof(int) * 1024);
        n = encode_str(t, s, out, 1024);
        int want = len_a / 4 + (len_a % 4 >= 2) + (len_a % 2);
        int ok = n == want;
        for (int i = 0; ok && i < len_a / 4; i++) ok = out[i] == aaaa;
        EXPECT(ok, "run of %d a: %d tokens, want %d", len_a, n, want);
        free(out);
        free(s);
    }
    // "ab" * 100 (200 bytes, heap path) is 100 x 'ab'; with 'c' after each, 'abc'.
    char s[400];
    for (int i = 0; i < 100; i++) memcpy(s + 2 * i, "ab", 2);
    s[200] = '\0';
    n = encode_str(t, s, ids, 1024);
    EXPECT(n == 100 && ids[0] == ab && ids[99] == ab, "ab*100 (n=%d)", n);
    for (int i = 0; i < 100; i++) memcpy(s + 3 * i, "abc", 3);
    s[300] = '\0';
    n = encode_str(t, s, ids, 1024);
    EXPECT(n == 100 && ids[0] == abc && ids[99] == abc, "abc*100 (n=%d)", n);
    // invalid UTF-8: one U+FFFD (EF BF BD) per maximal invalid subsequence
    n = encode_str(t, "\xe2\x82", ids, 1024);
    EXPECT(n == 3 && ids[0] == id_of(t, "\xef") && ids[1] == id_of(t, "\xbf") &&
               ids[2] == id_of(t, "\xbd"), "truncated sequence -> U+FFFD (n=%d)", n);
    n = encode_str(t, "\xc0\x80", ids, 1024);
    EXPECT(n == 6, "C0 80 -> two U+FFFD (n=%d)", n);
    gpt2_bpe_free(t);
}

static void test_parallel(Files *f) {
    Gpt2Bpe *t = load_good(f);
    if (!t) return;
    // 2 MB of lines that end in every way the pre-tokenizer cares about
    static const char *pieces[] = {"aab c\n", "x y\n\n", " a\n", "ab\n ", "\n\n a", "aa\t\n",
                                   "c'\nb", "1\n2", "\xff\n", "\xe4\xb8\xad\na", " \n"};
    size_t len;
    char *text = pieces_text(pieces, 11, 0, 2u << 20, &len);
    int *one = NULL, *par = NULL;
    size_t n1 = 0, c1 = 0, n2 = 0, c2 = 0;
    gpt2_bpe_encode(t, text, len, &one, &n1, &c1, NULL, 0);
    gpt2_bpe_encode_parallel(t, text, len, 3, &par, &n2, &c2, NULL, 0);
    EXPECT(n1 == n2 && memcmp(one, par, n1 * sizeof(int)) == 0, "parallel differs (%zu vs %zu)",
           n1, n2);
    free(one);
    free(par);
    free(text);
    gpt2_bpe_free(t);
}

// gpt2_bpe_encode_documents equals <|endoftext|> + gpt2_bpe_encode of each document in turn.
static void test_documents(Files *f) {
    Gpt2Bpe *t = load_good(f);
    if (!t) return;
    static const char *pieces[] = {"aab c ", "x y", "\n", " a\n", "ab", "\n\n", "aa\t",
                                   "c'\nb", "1 2", "\xff", "\xe4\xb8\xad"};
    const char *sep = "\n\n";
    size_t len;
    char *text = pieces_text(pieces, 11, 7, 3u << 20, &len);
    for (int with_tail = 0; with_tail < 2; with_tail++) {
        size_t n_text = with_tail ? len : len - 2;
        if (with_tail) memcpy(text + len - 2, sep, 2);   // ends with sep: a last, empty document
        int *want = NULL, *got = NULL;
        size_t nw = 0, cw = 0, ng = 0, cg = 0, start = 0, docs = 0;
        for (;;) {
            const char *hit = memmem(text + start, n_text - start, sep, 2);
            size_t end = hit ? (size_t)(hit - text) + 2 : n_text;
            int eot = gpt2_bpe_eot(t);
            if (nw == cw) want = realloc(want, (cw = 2 * cw + 1024) * sizeof(int));
            want[nw++] = eot;
            gpt2_bpe_encode(t, text + start, end - start, &want, &nw, &cw, NULL, 0);
            docs++;
            if (!hit) break;
            start = end;
        }
        gpt2_bpe_encode_documents(t, text, n_text, sep, 2, &got, &ng, &cg, NULL, 0);
        EXPECT(docs > 1000 && ng == nw && memcmp(want, got, nw * sizeof(int)) == 0,
               "documents differ (%zu docs, %zu vs %zu ids)", docs, ng, nw);
        free(want);
        free(got);
    }
    // one document, no separator in the text: long enough to be cut inside
    memset(text, 'a', 64);
    int *one = NULL, *got = NULL;
    size_t n1 = 0, c1 = 0, ng = 0, cg = 0;
    gpt2_bpe_encode(t, text, len - 2, &one, &n1, &c1, NULL, 0);
    gpt2_bpe_encode_documents(t, text, len - 2, "<|endoftext|>", 2, &got, &ng, &cg, NULL, 0);
    EXPECT(ng == n1 + 1 && got[0] == gpt2_bpe_eot(t) && memcmp(one, got + 1, n1 * sizeof(int)) == 0,
           "single long document");
    free(one);
    free(got);
    free(text);
    gpt2_bpe_free(t);
}

// A piece of a bad file and what the message must say.
typedef struct {
    const char *text, *want;
} BadText;

// encoder.json with the entry "xy": 261 replaced by text (9 bytes).
static const BadText BAD_IDS[] = {
    {"\"xy\": 2.5", "ids must be integers"},
    {"\"xy\": 999", "ids must be integers"},
    // far outside int: must not be cast before the range check
    {"\"xy\":9e99", "ids must be integers"},
    {"\"xy\":\"26\"", "not a number"},
    {"\"xy\": 260", "id 260 is given to both"},
};

// vocab.bpe files beside the good encoder.json.
static const BadText BAD_VOCABS[] = {
    {"a a\naa aa\n", "#version"},
    {"#version: 0.2\na a\naa aa\na b\nĠ a\nab c\nxy\n", ":7: expected two tokens"},
    {"#version: 0.2\na a\naa aa\na b\nĠ a\nab c\nx y z\n", ":7: expected two tokens"},
    {"#version: 0.2\na a\naa aa\na b\nĠ a\nab c\nx yy\n", "is not a token of encoder.json"},
    {"#version: 0.2\na a\naa aa\na b\nĠ a\nab c\nx a\n", "does not have"},
    {"#version: 0.2\naa aa\na a\na b\nĠ a\nab c\nx y\n", "disagree"},   // swapped ranks
    {"#version: 0.2\na a\naa aa\na b\nĠ a\nab c\n", "do not belong together"},   // one merge short
};

static void test_bad_files(Files *f) {
    // missing files
    files_write_good(f);
    unlink(f->enc);
    expect_load_error(f, f->enc, "cannot open");
    files_write_good(f);
    unlink(f->voc);
    expect_load_error(f, f->voc, "cannot open");

    char *v = make_vocab_bpe(MERGES, N_MERGES), *e = make_encoder_json(MERGES, N_MERGES, "");
    // malformed JSON
    files_write(f, "{\"a\": 0,\n \"b\": }", v);
    expect_load_error(f, f->enc, "malformed JSON at line 2");
    files_write(f, "[1, 2]", v);
    expect_load_error(f, f->enc, "JSON object");
    // wrong counts, ids and tokens
    char *more = make_encoder_json(MERGES, N_MERGES, "\"zz\": 263, ");
    files_write(f, more, v);
    expect_load_error(f, f->enc, "do not belong together");
    free(more);
    char *s = strdup(e);
    char *p = strstr(s, "\"xy\": 261");
    for (size_t i = 0; i < sizeof BAD_IDS / sizeof BAD_IDS[0]; i++) {
        memcpy(p, BAD_IDS[i].text, 9);
        files_write(f, s, v);
        expect_load_error(f, f->enc, BAD_IDS[i].want);
    }
    memcpy(p, "\"xy\": 261", 9);
    p = strstr(s, "\"<|endoftext|>\"");
    memcpy(p, "\"<|endoftext|?\"", 15);
    files_write(f, s, v);
    expect_load_error(f, f->enc, "must be \"<|endoftext|>\"");
    free(s);
    const char *bad_alpha[] = {"a a", "aa aa", "a b", "Ġ a", "ab c", "x \xe4\xb8\xad"};
    char *e2 = make_encoder_json(bad_alpha, N_MERGES, "");
    files_write(f, e2, v);
    expect_load_error(f, f->enc, "not in GPT-2's byte alphabet");
    free(e2);
    // vocab.bpe problems
    for (size_t i = 0; i < sizeof BAD_VOCABS / sizeof BAD_VOCABS[0]; i++) {
        files_write(f, e, BAD_VOCABS[i].text);
        expect_load_error(f, f->voc, BAD_VOCABS[i].want);
    }
    free(v);
    free(e);
}

// The child of test_out_of_memory: encodes a 16 MiB run of digits (one pre-token, so the heap
// merge needs about 32 bytes per byte) with 64 MiB more address space than it uses now. Exit
// status 0 when the encoder returned -1 naming the lack of memory; prints what it got.
static int oom_child(Files *f) {
    Gpt2Bpe *t = load_good(f);
    const size_t len = (size_t)16 << 20;
    char *text = malloc(len);
    memset(text, '7', len);
    long pages = 0;
    FILE *statm = fopen("/proc/self/statm", "r");
    if (!statm || fscanf(statm, "%ld", &pages) != 1) return 3;
    fclose(statm);
    const struct rlimit rl = {(rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + ((rlim_t)64 << 20), RLIM_INFINITY};
    if (setrlimit(RLIMIT_AS, &rl) != 0) return 4;
    int *ids = NULL;
    size_t n = 0, cap = 0;
    char err[256] = "";
    const int rc = gpt2_bpe_encode(t, text, len, &ids, &n, &cap, err, sizeof err);
    printf("rc %d: %s\n", rc, err);
    return rc == -1 && strstr(err, "out of memory") ? 0 : 1;
}

// Out of memory is returned, not fatal: the encoder runs under an address-space limit in a child
// process (the test binary again, with AddressSanitizer told to return NULL like malloc does).
static void test_out_of_memory(void) {
    char exe[4096];
    const ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
    CHECK(k > 0);
    exe[k] = '\0';
    fflush(stdout);
    const pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        setenv("ASAN_OPTIONS", "allocator_may_return_null=1:detect_leaks=0", 1);
        execl(exe, exe, "--oom-child", (char *)NULL);
        _exit(5);
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0,
           "the encoder under a memory limit: exit status %d (0: -1 with an out-of-memory message)",
           WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status));
}

int main(int argc, char **argv) {
    Files f;
    snprintf(f.dir, sizeof f.dir, "/tmp/test_gpt2_bpe_XXXXXX");
    if (!mkdtemp(f.dir)) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(f.enc, sizeof f.enc, "%s/encoder.json", f.dir);
    snprintf(f.voc, sizeof f.voc, "%s/vocab.bpe", f.dir);
    if (argc > 1 && strcmp(argv[1], "--oom-child") == 0) {
        const int rc = oom_child(&f);
        unlink(f.enc);
        unlink(f.voc);
        rmdir(f.dir);
        return rc;
    }
    TEST_CASE("small vocabulary: merge order, heap path, U+FFFD", test_small_vocab(&f));
    TEST_CASE("parallel encode equals single-threaded", test_parallel(&f));
    TEST_CASE("documents equal eot + encode of each", test_documents(&f));
    TEST_CASE("bad encoder.json / vocab.bpe name the file and the problem", test_bad_files(&f));
    TEST_CASE("out of memory comes back as -1 and a message", test_out_of_memory());
    unlink(f.enc);
    unlink(f.voc);
    rmdir(f.dir);
    return TEST_SUMMARY();
}
