// data module tests: shard round trips and every bad-shard case, dataset order (sequential,
// shuffled, ranks, epochs, exact resume), synthetic tasks (copy structure, Markov entropy floor
// against an empirical estimate, retrieval_spread's distances) and the llm.c tokenizer file.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/config.h"
#include "common/fileio.h"
#include "data/dataset.h"
#include "data/shard.h"
#include "common/check.h"
#include "data/synthetic.h"
#include "data/tokenizer.h"
#include "data/utf8.h"
#include "tests/testlib.h"

typedef struct {
    char dir[64];
} Tmp;

static void path_in(const Tmp *tmp, char *out, const char *name) {
    snprintf(out, 512, "%s/%s", tmp->dir, name);
}

static void write_raw(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    fwrite(data, 1, n, f);
    fclose(f);
}

// A version-1 shard whose header is h0, h1, h2 followed by n uint16 tokens 0, 1, ..., n-1.
static void write_shard_raw(const char *path, int32_t magic, int32_t version, int32_t count, int n) {
    size_t len = 1024 + (size_t)n * 2;
    unsigned char *buf = calloc(len, 1);
    int32_t h[3] = {magic, version, count};
    memcpy(buf, h, sizeof h);
    for (int i = 0; i < n; i++) {
        uint16_t t = (uint16_t)i;
        memcpy(buf + 1024 + 2 * i, &t, 2);
    }
    write_raw(path, buf, len);
    free(buf);
}

// Writes n tokens base, base+1, ... (mod 60000) as a version-1 shard.
static void write_counting_shard(const char *path, int n, int base) {
    int *tok = malloc(sizeof(int) * n);
    for (int i = 0; i < n; i++) tok[i] = (base + i) % 60000;
    char err[512];
    int rc = shard_write(path, tok, (size_t)n, SHARD_U16, err, sizeof err);
    EXPECT(rc == 0, "shard_write: %s", err);
    free(tok);
}

static void test_shard_round_trip(const Tmp *tmp) {
    char err[512], path[512];
    for (int k = 0; k < 2; k++) {
        ShardVersion v = k == 0 ? SHARD_U16 : SHARD_U32;
        int big = v == SHARD_U16 ? 65535 : 100000;   // the largest id each version must carry
        int tok[5] = {0, 1, 7, big, 42};
        path_in(tmp, path, k == 0 ? "rt16.bin" : "rt32.bin");
        EXPECT(shard_write(path, tok, 5, v, err, sizeof err) == 0, "write: %s", err);
        Shard s;
        EXPECT(shard_open(&s, path, big + 1, err, sizeof err) == 0, "open: %s", err);
        EXPECT(s.version == v && s.n_tokens == 5, "version %d tokens %llu", s.version,
               (unsigned long long)s.n_tokens);
        int back[5];
        shard_read(&s, 0, 5, back);
        EXPECT(memcmp(back, tok, sizeof tok) == 0, "tokens differ after the round trip");
        shard_close(&s);
        FILE *f = fopen(path, "rb");   // header words as llm.c writes them
        int32_t h[3];
        EXPECT(fread(h, 4, 3, f) == 3, "short header");
        fclose(f);
        EXPECT(h[0] == (v == SHARD_U16 ? 20240520 : 20240801) && h[1] == (int)v && h[2] == 5,
               "header %d %d %d", h[0], h[1], h[2]);
    }
    int too_big = 65536;
    path_in(tmp, path, "toobig.bin");
    EXPECT(shard_write(path, &too_big, 1, SHARD_U16, err, sizeof err) != 0 && !path_exists(path),
           "65536 must not fit a version-1 shard");
    EXPECT(shard_version_for_vocab(65536) == SHARD_U16 && shard_version_for_vocab(65537) == SHARD_U32,
           "version choice");
}

// Opens path expecting failure; the message must name the file and contain `want`.
static void expect_bad_shard(const char *path, int vocab, const char *want) {
    char err[1024] = "";
    Shard s;
    int rc = shard_open(&s, path, vocab, err, sizeof err);
    EXPECT(rc != 0, "'%s' should be rejected", path);
    EXPECT(strstr(err, path) != NULL, "message does not name the file: %s", err);
    EXPECT(strstr(err, want) != NULL, "message lacks '%s': %s", want, err);
}

// Shards with one thing wrong each (write_shard_raw's arguments), the vocabulary they are
// opened with and what the message must say.
typedef struct {
    const char *name;
    int32_t magic, version, count;
    int n, vocab;
    const char *want;
} BadShard;

static const BadShard BAD_SHARDS[] = {
    {"magic.bin", 12345, 1, 10, 10, 100, "bad magic 12345"},
    {"version.bin", SHARD_MAGIC_U16, 2, 10, 10, 100, "found version 2"},
    {"version7.bin", SHARD_MAGIC_U32, 1, 10, 10, 100, "found version 1"},
    {"truncated.bin", SHARD_MAGIC_U16, 1, 10, 9, 100, "truncated"},
    {"trailing.bin", SHARD_MAGIC_U16, 1, 9, 10, 100, "trailing"},
    // tokens 0..9: 5 is the first >= vocab 5
    {"range.bin", SHARD_MAGIC_U16, 1, 10, 10, 5, "token offset 5"},
};

static void test_shard_bad_input(const Tmp *tmp) {
    char path[512];
    path_in(tmp, path, "missing.bin");
    expect_bad_shard(path, 100, "No such file");
    path_in(tmp, path, "short_header.bin");
    write_raw(path, "abc", 3);
    expect_bad_shard(path, 100, "truncated");
    for (size_t i = 0; i < sizeof BAD_SHARDS / sizeof BAD_SHARDS[0]; i++) {
        const BadShard *b = &BAD_SHARDS[i];
        path_in(tmp, path, b->name);
        write_shard_raw(path, b->magic, b->version, b->count, b->n);
        expect_bad_shard(path, b->vocab, b->want);
    }
    path_in(tmp, path, "range.bin");
    Shard s;
    char err[512];
    EXPECT(shard_open(&s, path, 10, err, sizeof err) == 0, "tokens 0..9 fit vocab 10: %s", err);
    shard_close(&s);
}

static Config base_config(const char *train, const char *val, int vocab) {
    Config c;
    config_defaults(&c);
    c.model.vocab_size = vocab;
    snprintf(c.data.train, sizeof c.data.train, "%s", train);
    snprintf(c.data.val, sizeof c.data.val, "%s", val);
    c.train.seed = 1234;
    return c;
}

static void test_dataset_bad_input(const Tmp *tmp) {
    char err[1024], pat[512], path[512];
    path_in(tmp, pat, "nothing_*.bin");
    Config c = base_config(pat, "", 100);
    Dataset *d = dataset_open(&c, SPLIT_TRAIN, 2, 4, 0, 1, err, sizeof err);
    EXPECT(!d && strstr(err, pat) && strstr(err, "data.train"), "empty glob: %s", err);
    path_in(tmp, pat, "no_such_shard.bin");
    c = base_config("", pat, 100);
    d = dataset_open(&c, SPLIT_VAL, 2, 4, 0, 1, err, sizeof err);
    EXPECT(!d && strstr(err, pat) && strstr(err, "data.val"), "missing file: %s", err);
    d = dataset_open(&c, SPLIT_TRAIN, 2, 4, 0, 1, err, sizeof err);
    EXPECT(!d && strstr(err, "data.train is empty"), "empty pattern: %s", err);
    path_in(tmp, path, "tiny.bin");
    write_counting_shard(path, 4, 0);   // 4 tokens: no window of T+1 = 5
    c = base_config(path, "", 100);
    d = dataset_open(&c, SPLIT_TRAIN, 1, 4, 0, 1, err, sizeof err);
    EXPECT(!d && strstr(err, "train.seq_len + 1 = 5"), "too few tokens: %s", err);
    d = dataset_open(&c, SPLIT_TRAIN, 1, 3, 0, 1, err, sizeof err);
    EXPECT(d != NULL, "4 tokens hold one window of T=3: %s", err);
    dataset_close(d);
    path_in(tmp, path, "range_ds.bin");
    write_shard_raw(path, 20240520, 1, 10, 10);
    c = base_config(path, "", 8);
    d = dataset_open(&c, SPLIT_TRAIN, 1, 3, 0, 1, err, sizeof err);
    EXPECT(!d && strstr(err, path) && strstr(err, "token offset 8"), "out-of-range token: %s", err);
}

// Two shards of counting tokens: a: 0..99 (windows of T=8: 12), b: 1000..1049 (6 windows).
// A window that crossed the boundary would jump from 99 to 1000.
#define DS_T 8
#define DS_WINDOWS 18
static void make_two_shards(const Tmp *tmp, char *pattern) {
    char path[512];
    path_in(tmp, path, "ds_a.bin");
    write_counting_shard(path, 100, 0);
    path_in(tmp, path, "ds_b.bin");
    write_counting_shard(path, 50, 1000);
    path_in(tmp, pattern, "ds_*.bin");
}

// The first input token of each of the B windows of one batch; checks the window is contiguous
// and its targets are the inputs shifted by one.
static void read_batch(Dataset *d, int B, int T, int *starts) {
    int *in = malloc(sizeof(int) * B * T), *tg = malloc(sizeof(int) * B * T);
    dataset_next(d, in, tg);
    for (int b = 0; b < B; b++) {
        int ok = 1;
        for (int t = 0; t < T; t++) {
            ok &= in[b * T + t] == in[b * T] + t;
            ok &= tg[b * T + t] == in[b * T + t] + 1;
        }
        EXPECT(ok, "window %d starting at %d is not contiguous", b, in[b * T]);
        starts[b] = in[b * T];
    }
    free(in);
    free(tg);
}

static int window_start(int w) { return w < 12 ? w * DS_T : 1000 + (w - 12) * DS_T; }

static void test_dataset_sequential(const char *pattern) {
    char err[1024];
    Config c = base_config(pattern, pattern, 2000);
    Dataset *d = dataset_open(&c, SPLIT_TRAIN, 4, DS_T, 0, 1, err, sizeof err);
    EXPECT(d != NULL, "open: %s", err);
    if (!d) return;
    EXPECT(dataset_num_tokens(d) == 150 && dataset_loss_floor(d) < 0, "num tokens / floor");
    int starts[4], ok = 1;
    for (int n = 0; n < 9; n++) {   // 36 windows: two epochs of 18, wrapping inside batch 4
        read_batch(d, 4, DS_T, starts);
        for (int b = 0; b < 4; b++) ok &= starts[b] == window_start((n * 4 + b) % DS_WINDOWS);
    }
    EXPECT(ok, "sequential order with stride T, both shards, wrapping to the next epoch");
    dataset_rewind(d);
    read_batch(d, 4, DS_T, starts);
    EXPECT(starts[0] == 0 && starts[3] == 3 * DS_T, "rewind starts again at window 0");
    dataset_close(d);
}

static void test_dataset_shuffled(const char *pattern) {
    char err[1024];
    Config c = base_config(pattern, pattern, 2000);
    c.data.shuffle = 1;
    Dataset *d1 = dataset_open(&c, SPLIT_TRAIN, 1, DS_T, 0, 1, err, sizeof err);
    Dataset *d2 = dataset_open(&c, SPLIT_TRAIN, 1, DS_T, 0, 1, err, sizeof err);
    c.train.seed = 99;
    Dataset *d3 = dataset_open(&c, SPLIT_TRAIN, 1, DS_T, 0, 1, err, sizeof err);
    EXPECT(d1 && d2 && d3, "open: %s", err);
    if (!d1 || !d2 || !d3) return;
    int order[3][DS_WINDOWS], order2[DS_WINDOWS];
    int same = 1, perm_ok = 1, differs_seed = 0, differs_epoch = 0, not_sequential = 0, shifted = 0;
    for (int e = 0; e < 3; e++) {   // three epochs
        int seen[DS_WINDOWS] = {0};
        for (int w = 0; w < DS_WINDOWS; w++) {
            int s1, s2, s3;
            read_batch(d1, 1, DS_T, &s1);
            read_batch(d2, 1, DS_T, &s2);
            read_batch(d3, 1, DS_T, &s3);
            same &= s1 == s2;
            differs_seed |= s1 != s3;
            not_sequential |= s1 != window_start(w);
            order[e][w] = s1;
            // Shuffled windows start at a keyed offset in [0, T) after their window's start.
            for (int k = 0; k < DS_WINDOWS; k++) seen[k] += s1 >= window_start(k) && s1 < window_start(k) + DS_T;
            shifted |= s1 != window_start(s1 < 1000 ? s1 / DS_T : 12 + (s1 - 1000) / DS_T);
        }
        for (int k = 0; k < DS_WINDOWS; k++) perm_ok &= seen[k] == 1;
        if (e > 0) differs_epoch |= memcmp(order[e], order[0], sizeof order[0]) != 0;
    }
    EXPECT(same, "same seed, same shuffled batches");
    EXPECT(perm_ok, "each epoch visits every window exactly once");
    EXPECT(shifted, "shuffled windows are shifted by random offsets");
    EXPECT(differs_seed && not_sequential && differs_epoch, "order depends on seed and epoch");
    dataset_rewind(d1);   // training data rewound reads epoch 0 again
    for (int w = 0; w < DS_WINDOWS; w++) read_batch(d1, 1, DS_T, &order2[w]);
    EXPECT(memcmp(order2, order[0], sizeof order2) == 0, "rewind restarts epoch 0");
    Dataset *val = dataset_open(&c, SPLIT_VAL, 1, DS_T, 0, 1, err, sizeof err);
    int s;
    read_batch(val, 1, DS_T, &s);
    EXPECT(s == 0, "val is read sequentially even with data.shuffle");
    dataset_close(val);
    dataset_close(d1);
    dataset_close(d2);
    dataset_close(d3);
}

// Ranks of a world of 3 with B=2 read disjoint windows that together are the B=6 world-1 batch.
static void test_dataset_ranks(const char *pattern, int shuffle) {
    char err[1024];
    Config c = base_config(pattern, pattern, 2000);
    c.data.shuffle = shuffle;
    Dataset *all = dataset_open(&c, SPLIT_TRAIN, 6, DS_T, 0, 1, err, sizeof err);
    Dataset *r[3];
    for (int i = 0; i < 3; i++) r[i] = dataset_open(&c, SPLIT_TRAIN, 2, DS_T, i, 3, err, sizeof err);
    int ok = 1, disjoint = 1;
    for (int n = 0; n < 3; n++) {   // 18 windows = one epoch in 3 global batches
        int want[6], got[6];
        read_batch(all, 6, DS_T, want);
        for (int i = 0; i < 3; i++) read_batch(r[i], 2, DS_T, got + 2 * i);
        ok &= memcmp(want, got, sizeof want) == 0;
        for (int a = 0; a < 6; a++)
            for (int b = a + 1; b < 6; b++) disjoint &= got[a] != got[b];
    }
    EXPECT(ok, "ranks together read the global batch (shuffle=%d)", shuffle);
    EXPECT(disjoint, "ranks read disjoint windows (shuffle=%d)", shuffle);
    dataset_close(all);
    for (int i = 0; i < 3; i++) dataset_close(r[i]);
}

// A run that saves its state after `split` batches and a fresh dataset restored from it read
// bitwise the same batches afterwards.
static void test_dataset_resume(const Config *c, const char *what) {
    enum { B = 3, T = 8, FIRST = 7, THEN = 20 };
    char err[1024];
    Dataset *a = dataset_open(c, SPLIT_TRAIN, B, T, 0, 1, err, sizeof err);
    Dataset *b = dataset_open(c, SPLIT_TRAIN, B, T, 0, 1, err, sizeof err);
    EXPECT(a && b, "open: %s", err);
    if (!a || !b) return;
    int in_a[B * T], tg_a[B * T], in_b[B * T], tg_b[B * T];
    for (int i = 0; i < FIRST; i++) dataset_next(a, in_a, tg_a);
    dataset_set_state(b, dataset_get_state(a));
    int same = 1;
    for (int i = 0; i < THEN; i++) {
        dataset_next(a, in_a, tg_a);
        dataset_next(b, in_b, tg_b);
        same &= memcmp(in_a, in_b, sizeof in_a) == 0 && memcmp(tg_a, tg_b, sizeof tg_a) == 0;
    }
    EXPECT(same, "%s: restored state reads the same batches", what);
    dataset_close(a);
    dataset_close(b);
}

static Config synthetic_config(const char *task, int vocab) {
    Config c = base_config("", "", vocab);
    {
        char kv[96], why[256];
        snprintf(kv, sizeof kv, "data.synthetic=%s", task);
        CHECK(config_set(&c, kv, why, sizeof why) == 0);
    }
    return c;
}

static void test_copy_task(void) {
    enum { B = 4, T = 33, H = T / 2 };
    char err[1024];
    Config c = synthetic_config("copy", 50257);
    Dataset *d = dataset_open(&c, SPLIT_TRAIN, B, T, 0, 1, err, sizeof err);
    Dataset *v = dataset_open(&c, SPLIT_VAL, B, T, 0, 1, err, sizeof err);
    Dataset *r1 = dataset_open(&c, SPLIT_TRAIN, B, T, 1, 2, err, sizeof err);
    EXPECT(d && v && r1, "open: %s", err);
    if (!d || !v || !r1) return;
    EXPECT(dataset_loss_floor(d) == 0 && dataset_num_tokens(d) == 0, "copy floor 0, infinite stream");
    int in[B * T], tg[B * T], in_v[B * T], tg_v[B * T], in_r[B * T], tg_r[B * T];
    int structure = 1, range = 1, varied = 0;
    for (int n = 0; n < 10; n++) {
        dataset_next(d, in, tg);
        for (int b = 0; b < B; b++) {
            const int *x = in + b * T, *y = tg + b * T;
            for (int t = 0; t < T; t++) {
                range &= x[t] >= 0 && x[t] < 256;
                if (t >= H) structure &= x[t] == x[t - H];
                structure &= t < H ? y[t] == -1 : y[t] == x[(t + 1) % H];
                if (t + 1 < T && t >= H) structure &= y[t] == x[t + 1];
                if (t > 0 && t < H) varied |= x[t] != x[0];
            }
        }
    }
    EXPECT(structure, "second half repeats the first, first-half targets are -1");
    EXPECT(range && varied, "ids random in [0, 256)");
    dataset_rewind(d);
    dataset_next(d, in, tg);
    dataset_next(v, in_v, tg_v);
    dataset_next(r1, in_r, tg_r);
    EXPECT(memcmp(in, in_v, sizeof in) != 0, "train and val streams differ");
    dataset_next(v, in_r, tg_r);
    dataset_rewind(v);
    dataset_next(v, in_r, tg_r);
    EXPECT(memcmp(in_v, in_r, sizeof in_v) == 0, "rewound val gives the same first batch (same eval set)");
    EXPECT(memcmp(in, in_r, sizeof in) != 0, "ranks get different sequences");
    dataset_close(d);
    dataset_close(v);
    dataset_close(r1);
    char e2[256];
    c = synthetic_config("copy", 100);
    EXPECT(!dataset_open(&c, SPLIT_TRAIN, 1, 1, 0, 1, e2, sizeof e2) && strstr(e2, "seq_len"),
           "copy with T=1 is refused: %s", e2);
}

// retrieval_spread: every sequence is a valid retrieval sequence (K pairs, then filler, then the
// same pairs shuffled at the very end, only the closing keys scored, each answer determined by
// the opening pair with that key), but the opening block moves, so over many sequences the
// answer distances cover nearly all of [1, T); plain retrieval keeps its block at 0.
static void test_retrieval_spread(void) {
    enum { T = 300, V = 128, K = 16, S = 128, N = 400 };
    char err[256];
    Synthetic *sp = synthetic_create("retrieval_spread", V, T, 9, err, sizeof err);
    Synthetic *fixed = synthetic_create("retrieval", V, T, 9, err, sizeof err);
    EXPECT(sp && fixed, "%s", err);
    if (!sp || !fixed) return;
    int in[T], tg[T], ok = 1, min_dist = T, max_dist = 0, fixed_at_0 = 1;
    for (int n = 0; n < N; n++) {
        synthetic_sequence(fixed, 1000 + n, in, tg);
        for (int i = 0; i < 2 * K; i += 2) fixed_at_0 &= in[i] < S / 4 && in[i + 1] >= S / 4;
        synthetic_sequence(sp, 1000 + n, in, tg);
        int o = -1, n_keys = 0;
        for (int t = 0; t < T - 2 * K; t++)
            if (in[t] < S / 2 && o < 0) o = t;   // first non-filler: the opening block
        ok &= o >= 0 && o <= T - 4 * K;
        if (!(o >= 0 && o <= T - 4 * K)) continue;
        for (int t = 0; t < T - 2 * K; t++) {
            const int in_block = t >= o && t < o + 2 * K;
            ok &= in_block ? (in[t] < S / 2) : (in[t] >= S / 2 && in[t] < S);
            ok &= tg[t] == -1;
        }
        for (int t = T - 2 * K; t < T; t++) {
            const int is_query_key = (t - (T - 2 * K)) % 2 == 0;
            ok &= (tg[t] >= 0) == is_query_key;
            if (tg[t] < 0) continue;
            n_keys++;
            int def = -1;
            for (int j = o; j < o + 2 * K; j += 2)
                if (in[j] == in[t]) def = j;
            ok &= def >= 0 && in[def] < S / 4 && in[def + 1] == tg[t] && in[t + 1] == tg[t];
            if (def < 0) continue;
            if (t - def - 1 < min_dist) min_dist = t - def - 1;
            if (t - def - 1 > max_dist) max_dist = t - def - 1;
        }
        ok &= n_keys == K;
    }
    EXPECT(ok, "retrieval_spread: every sequence is a valid retrieval sequence");
    EXPECT(fixed_at_0, "retrieval keeps its opening pairs at positions 0..2K-1");
    EXPECT(min_dist < 2 * K && max_dist > T - 2 * K, "answer distances %d..%d span nearly [1, T)",
           min_dist, max_dist);
    synthetic_free(sp);
    synthetic_free(fixed);
    EXPECT(synthetic_create("retrieval_spread", V, 4 * K, 9, err, sizeof err) == NULL &&
               strstr(err, "retrieval_spread") && strstr(err, "train.seq_len"),
           "a too short sequence is refused with a message naming the task and key: %s", err);
}

// The floor must equal an independent estimate: the plug-in conditional entropy H(Y|X) of the
// observed bigram counts, with the Miller-Madow correction (+ (cells - rows) / 2N) that removes
// its O(1/N) downward bias.
static void test_markov_floor(void) {
    enum { B = 64, T = 256, BATCHES = 64, S = 256 };   // N = 2^20 targets
    char err[1024];
    Config c = synthetic_config("markov", 50257);
    Dataset *d = dataset_open(&c, SPLIT_TRAIN, B, T, 0, 1, err, sizeof err);
    EXPECT(d != NULL, "open: %s", err);
    if (!d) return;
    double floor = dataset_loss_floor(d);
    EXPECT(floor > 0 && floor < log(4.0), "floor %.6f must lie in (0, ln 4)", floor);
    uint32_t *count = calloc((size_t)S * S, sizeof(uint32_t));   // (S, S) bigram counts
    int *in = malloc(sizeof(int) * B * T), *tg = malloc(sizeof(int) * B * T);
    int chained = 1, range = 1;
    for (int n = 0; n < BATCHES; n++) {
        dataset_next(d, in, tg);
        for (int i = 0; i < B * T; i++) {
            range &= in[i] >= 0 && in[i] < S && tg[i] >= 0 && tg[i] < S;
            if (i % T != T - 1) chained &= tg[i] == in[i + 1];
            count[(size_t)in[i] * S + tg[i]]++;
        }
    }
    EXPECT(range && chained, "targets are the next token of the chain, ids in [0, 256)");
    double N = (double)B * T * BATCHES, h = 0, h2 = 0;
    int cells = 0, rows = 0;
    for (int x = 0; x < S; x++) {
        double row = 0;
        for (int y = 0; y < S; y++) row += count[(size_t)x * S + y];
        rows += row > 0;
        for (int y = 0; y < S; y++) {
            double k = count[(size_t)x * S + y];
            if (k == 0) continue;
            cells++;
            double l = -log(k / row);
            h += k * l;
            h2 += k * l * l;
        }
    }
    h /= N;
    double sd = sqrt(h2 / N - h * h), est = h + (cells - rows) / (2 * N);
    // Standard error sd/sqrt(N) of a mean of N per-token losses; 4 sigma, times 2 because tokens
    // of one sequence are correlated (the chain mixes in a few steps, so the variance inflation
    // is small).
    double tol = 2 * 4 * sd / sqrt(N);
    EXPECT(fabs(est - floor) < tol, "floor %.5f vs empirical %.5f (tol %.5f)", floor, est, tol);
    printf("markov floor %.5f nats, empirical %.5f, tolerance %.5f\n", floor, est, tol);
    EXPECT(cells <= S * 4, "at most 4 successors per state (%d bigrams)", cells);
    Dataset *v = dataset_open(&c, SPLIT_VAL, B, T, 0, 1, err, sizeof err);
    int same_task = 1;
    for (int n = 0; n < 4; n++) {
        dataset_next(v, in, tg);
        for (int i = 0; i < B * T; i++) same_task &= count[(size_t)in[i] * S + tg[i]] > 0;
    }
    EXPECT(same_task, "val follows the same transitions as train");
    dataset_close(v);
    free(count);
    free(in);
    free(tg);
    dataset_close(d);
}

static void test_tokenizer_round_trip(const Tmp *tmp) {
    char err[1024], path[512];
    const char *text = "h\xC3\xA9llo w\xE2\x82\xACrld\n";   // é (2 bytes) and € (3 bytes)
    Tokenizer *t = tokenizer_build_char(text, strlen(text), err, sizeof err);
    EXPECT(t != NULL, "char build: %s", err);
    if (!t) return;
    // distinct: \n ' ' d h l o r w é € -> 10, sorted by code point
    EXPECT(tokenizer_vocab_size(t) == 10 && tokenizer_eot(t) == -1, "vocab %d eot %d",
           tokenizer_vocab_size(t), tokenizer_eot(t));
    int len;
    const unsigned char *b0 = tokenizer_decode(t, 0, &len);
    const unsigned char *b9 = tokenizer_decode(t, 9, &len);
    EXPECT(b0[0] == '\n' && len == 3 && memcmp(b9, "\xE2\x82\xAC", 3) == 0, "sorted characters");
    EXPECT(tokenizer_decode(t, 10, &len) == NULL && tokenizer_decode(t, -1, &len) == NULL, "out of range");
    path_in(tmp, path, "char_tok.bin");
    EXPECT(tokenizer_save(t, path, err, sizeof err) == 0, "save: %s", err);
    Tokenizer *u = tokenizer_load(path, err, sizeof err);
    EXPECT(u != NULL, "load: %s", err);
    int ids[64];
    long n = tokenizer_encode_simple(u, text, ids, 64);
    EXPECT(n == 12, "12 characters, got %ld", n);
    char back[64] = "";
    size_t pos = 0;
    for (long i = 0; i < n; i++) {
        const unsigned char *p = tokenizer_decode(u, ids[i], &len);
        memcpy(back + pos, p, (size_t)len);
        pos += (size_t)len;
    }
    EXPECT(strcmp(back, text) == 0, "decode(encode(text)) == text");
    EXPECT(tokenizer_encode_simple(u, "hex", ids, 64) == -1, "'x' is not in the vocabulary");
    EXPECT(tokenizer_encode_simple(u, "hllo", ids, 2) == 2, "stops at the capacity");
    tokenizer_free(t);
    tokenizer_free(u);

    t = tokenizer_build_byte();
    path_in(tmp, path, "byte_tok.bin");
    EXPECT(tokenizer_save(t, path, err, sizeof err) == 0, "save: %s", err);
    u = tokenizer_load(path, err, sizeof err);
    EXPECT(u && tokenizer_vocab_size(u) == 256 && tokenizer_eot(u) == -1, "byte vocab: %s", err);
    n = tokenizer_encode_bytes(u, "a\0\xFF", 3, ids, 64);
    EXPECT(n == 3 && ids[0] == 'a' && ids[1] == 0 && ids[2] == 255, "byte ids");
    tokenizer_free(t);
    tokenizer_free(u);

    const unsigned char *tab[3] = {(const unsigned char *)"ab", (const unsigned char *)"a",
                                   (const unsigned char *)"<|end|>"};
    int lens[3] = {2, 1, 7};
    t = tokenizer_build_table(3, tab, lens, 2, err, sizeof err);
    path_in(tmp, path, "table_tok.bin");
    EXPECT(t && tokenizer_save(t, path, err, sizeof err) == 0, "table: %s", err);
    u = tokenizer_load(path, err, sizeof err);
    EXPECT(u && tokenizer_eot(u) == 2 && tokenizer_vocab_size(u) == 3, "eot kept: %s", err);
    n = tokenizer_encode_simple(u, "aba", ids, 8);
    EXPECT(n == 2 && ids[0] == 0 && ids[1] == 1, "greedy longest match");
    tokenizer_free(t);
    tokenizer_free(u);
    int zero[1] = {0};
    EXPECT(!tokenizer_build_table(1, tab, zero, -1, err, sizeof err), "empty token refused");
}

// A version-2 header with n tokens and eot, then `body` bytes.
static void write_tok_raw(const char *path, uint32_t magic, uint32_t version, uint32_t n, uint32_t eot,
                          const char *body, size_t body_len) {
    unsigned char buf[2048] = {0};
    uint32_t h[4] = {magic, version, n, eot};
    memcpy(buf, h, sizeof h);
    memcpy(buf + 1024, body, body_len);
    write_raw(path, buf, 1024 + body_len);
}

static void expect_bad_tokenizer(const char *path, const char *want) {
    char err[1024] = "";
    Tokenizer *t = tokenizer_load(path, err, sizeof err);
    EXPECT(!t && strstr(err, path) && strstr(err, want), "want '%s': %s", want, err);
    tokenizer_free(t);
}

// Tokenizer files with one thing wrong each (write_tok_raw's arguments) and what the message
// must say.
typedef struct {
    const char *name;
    uint32_t magic, version, n, eot;
    const char *body;
    size_t body_len;
    const char *want;
} BadTokenizer;

static const BadTokenizer BAD_TOKENIZERS[] = {
    {"tok_magic.bin", 1234, 2, 2, 0xFFFFFFFF, "\1a\1b", 4, "bad magic"},
    {"tok_version.bin", TOKENIZER_MAGIC, 3, 2, 0xFFFFFFFF, "\1a\1b", 4, "version 3"},
    {"tok_v1.bin", TOKENIZER_MAGIC, 1, 2, 0, "\1a\1b", 4, "GPT-2"},
    {"tok_eot.bin", TOKENIZER_MAGIC, 2, 2, 2, "\1a\1b", 4, "end-of-text id 2"},
    {"tok_zero.bin", TOKENIZER_MAGIC, 2, 2, 0xFFFFFFFF, "\1a\0x", 4, "length 0"},
    {"tok_trunc.bin", TOKENIZER_MAGIC, 2, 3, 0xFFFFFFFF, "\1a\3bc", 5, "truncated"},
    {"tok_count.bin", TOKENIZER_MAGIC, 2, 1000000, 0xFFFFFFFF, "\1a\1b", 4, "truncated"},
    {"tok_trailing.bin", TOKENIZER_MAGIC, 2, 2, 0xFFFFFFFF, "\1a\1bxyz", 7, "after its last token"},
};

static void test_tokenizer_bad_files(const Tmp *tmp) {
    char path[512];
    path_in(tmp, path, "tok_missing.bin");
    expect_bad_tokenizer(path, "No such file");
    for (size_t i = 0; i < sizeof BAD_TOKENIZERS / sizeof BAD_TOKENIZERS[0]; i++) {
        const BadTokenizer *b = &BAD_TOKENIZERS[i];
        path_in(tmp, path, b->name);
        write_tok_raw(path, b->magic, b->version, b->n, b->eot, b->body, b->body_len);
        expect_bad_tokenizer(path, b->want);
    }
    path_in(tmp, path, "tok_header.bin");
    write_raw(path, "short", 5);
    expect_bad_tokenizer(path, "truncated");
    char err[256];
    EXPECT(!tokenizer_build_char("ab\xC0\x80", 4, err, sizeof err) && strstr(err, "byte offset 2"),
           "overlong UTF-8 refused: %s", err);
}

static void test_utf8(void) {
    EXPECT(utf8_char_len("a", 1, NULL) == 1, "ascii");
    EXPECT(utf8_char_len("\xC3\xA9", 2, NULL) == 2, "2 bytes");
    EXPECT(utf8_char_len("\xE2\x82\xAC", 3, NULL) == 3, "3 bytes");
    EXPECT(utf8_char_len("\xF0\x9F\x98\x80", 4, NULL) == 4, "4 bytes");
    EXPECT(utf8_char_len("\xE2\x82", 2, NULL) == -1, "cut short");
    EXPECT(utf8_char_len("\xED\xA0\x80", 3, NULL) == -1, "surrogate");
    EXPECT(utf8_char_len("\xE0\x80\x80", 3, NULL) == -1, "overlong");
    EXPECT(utf8_char_len("\xF4\x90\x80\x80", 4, NULL) == -1, "above U+10FFFF");
    EXPECT(utf8_char_len("\x80", 1, NULL) == -1, "stray continuation byte");
}

int main(void) {
    Tmp tmp;
    snprintf(tmp.dir, sizeof tmp.dir, "/tmp/test_data_XXXXXX");
    if (!mkdtemp(tmp.dir)) return 1;
    char pattern[512];
    make_two_shards(&tmp, pattern);
    Config shuffled = base_config(pattern, pattern, 2000);
    shuffled.data.shuffle = 1;
    Config copy = synthetic_config("copy", 300), markov = synthetic_config("markov", 300);

    TEST_CASE("shard round trip (versions 1 and 7)", test_shard_round_trip(&tmp));
    TEST_CASE("shard bad input names file and offset", test_shard_bad_input(&tmp));
    TEST_CASE("dataset bad input", test_dataset_bad_input(&tmp));
    TEST_CASE("dataset sequential windows and epochs", test_dataset_sequential(pattern));
    TEST_CASE("dataset shuffled order", test_dataset_shuffled(pattern));
    TEST_CASE("dataset ranks (sequential)", test_dataset_ranks(pattern, 0));
    TEST_CASE("dataset ranks (shuffled)", test_dataset_ranks(pattern, 1));
    TEST_CASE("dataset resume (shuffled shards)", test_dataset_resume(&shuffled, "shuffled"));
    TEST_CASE("dataset resume (copy)", test_dataset_resume(&copy, "copy"));
    TEST_CASE("dataset resume (markov)", test_dataset_resume(&markov, "markov"));
    TEST_CASE("synthetic copy structure", test_copy_task());
    TEST_CASE("synthetic markov floor", test_markov_floor());
    TEST_CASE("synthetic retrieval_spread distances", test_retrieval_spread());
    TEST_CASE("tokenizer round trip", test_tokenizer_round_trip(&tmp));
    TEST_CASE("tokenizer bad files", test_tokenizer_bad_files(&tmp));
    TEST_CASE("utf-8 validation", test_utf8());
    remove_tree(tmp.dir);
    return TEST_SUMMARY();
}
