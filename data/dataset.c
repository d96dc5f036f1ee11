// The dataset is an endless stream of windows (each T+1 tokens, or one synthetic sequence).
// Stream index k is window k mod W of epoch k / W (W windows per epoch); shuffled training data
// maps the position through a keyed permutation of the epoch. Global batch n is stream indices
// [n*G, (n+1)*G) with G = B * world; rank r takes [n*G + r*B, n*G + (r+1)*B). So the state is one
// number, the stream index of the next global batch, and it does not depend on B or world.
#include "data/dataset.h"

#include <glob.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "data/shard.h"
#include "data/synthetic.h"

struct Dataset {
    int B, T, rank, world;
    Split split;
    uint64_t seed;           // train.seed
    uint64_t next;           // stream index of the next global batch's first window
    // shards (synth == NULL)
    int n_shards;
    Shard *shards;           // (n_shards,)
    uint64_t *first_window;  // (n_shards + 1,) prefix sums of windows per shard
    uint64_t n_windows;      // W: windows per epoch
    uint64_t n_tokens;
    int shuffle;
    int perm_half_bits;      // Feistel halves: the permutation domain is 4^perm_half_bits >= W
    // synthetic task
    Synthetic *synth;
};

static uint64_t mix64(uint64_t x) {   // splitmix64's finaliser: a bijective 64-bit hash
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static uint64_t hash3(uint64_t a, uint64_t b, uint64_t c) {
    return mix64(a ^ mix64(b ^ mix64(c + 0x9E3779B97F4A7C15ull)));
}

// A seeded permutation of [0, W) for one epoch, without storing it: a 4-round Feistel network
// over 2*h bits (a bijection of [0, 4^h)) applied repeatedly until the value lands below W
// ("cycle walking", which keeps it a bijection of [0, W)). 4^h < 4W, so it takes < 4 rounds of
// walking on average. Memory is O(1) even for billions of windows.
static uint64_t permute(const Dataset *d, uint64_t epoch, uint64_t x) {
    int h = d->perm_half_bits;
    uint64_t mask = (1ull << h) - 1;
    do {
        uint64_t l = x >> h, r = x & mask;
        for (uint64_t round = 0; round < 4; round++) {
            uint64_t f = hash3(d->seed, epoch * 4 + round, r) & mask;
            uint64_t t = l ^ f;
            l = r;
            r = t;
        }
        x = (l << h) | r;
    } while (x >= d->n_windows);
    return x;
}

static const char *split_key(Split s) { return s == SPLIT_TRAIN ? "data.train" : "data.val"; }

static int open_shards(Dataset *d, const char *pattern, int vocab_size, char *err, size_t errlen) {
    const char *key = split_key(d->split);
    if (pattern[0] == '\0')
        return set_error(err, errlen, "%s is empty: give a glob pattern of token shards (see train_gpt prepare)",
                      key);
    glob_t g;
    int rc = glob(pattern, GLOB_ERR, NULL, &g);
    if (rc == GLOB_NOMATCH)
        return set_error(err, errlen, "%s: no file matches '%s' (missing file or empty glob)", key, pattern);
    if (rc != 0) {
        globfree(&g);
        return set_error(err, errlen, "%s: cannot expand '%s' (read error or out of memory)", key, pattern);
    }
    d->n_shards = (int)g.gl_pathc;
    d->shards = xcalloc((size_t)d->n_shards, sizeof(Shard));
    d->first_window = xcalloc((size_t)d->n_shards + 1, sizeof(uint64_t));
    char sub[1024];
    for (int i = 0; i < d->n_shards; i++) {
        if (shard_open(&d->shards[i], g.gl_pathv[i], vocab_size, sub, sizeof sub) != 0) {
            set_error(err, errlen, "%s: %s", key, sub);
            globfree(&g);
            return -1;
        }
        uint64_t n = d->shards[i].n_tokens;
        d->n_tokens += n;
        d->first_window[i + 1] = d->first_window[i] + (n > (uint64_t)d->T ? (n - 1) / (uint64_t)d->T : 0);
    }
    globfree(&g);
    d->n_windows = d->first_window[d->n_shards];
    if (d->n_windows == 0)
        return set_error(err, errlen,
                      "%s: the %llu tokens in %d shard(s) matching '%s' give no sequence: a window needs "
                      "train.seq_len + 1 = %d tokens inside one shard; prepare more data or lower train.seq_len",
                      key, (unsigned long long)d->n_tokens, d->n_shards, pattern, d->T + 1);
    while ((1ull << (2 * d->perm_half_bits)) < d->n_windows) d->perm_half_bits++;
    return 0;
}

Dataset *dataset_open(const Config *c, Split split, int B, int T, int rank, int world, char *err,
                      size_t errlen) {
    if (B < 1 || T < 1 || world < 1 || rank < 0 || rank >= world) {
        set_error(err, errlen, "dataset: bad batch shape B=%d T=%d or rank %d of world %d", B, T, rank, world);
        return NULL;
    }
    Dataset *d = xcalloc(1, sizeof *d);
    d->B = B;
    d->T = T;
    d->rank = rank;
    d->world = world;
    d->split = split;
    d->seed = (uint64_t)c->train.seed;
    int rc = 0;
    if (c->data.synthetic != SYNTH_NONE) {
        d->synth = synthetic_create(config_choice_name("data.synthetic", c->data.synthetic),
                                    c->model.vocab_size, T, d->seed, err, errlen);
        rc = d->synth ? 0 : -1;
    } else {
        d->shuffle = split == SPLIT_TRAIN && c->data.shuffle;
        rc = open_shards(d, split == SPLIT_TRAIN ? c->data.train : c->data.val, c->model.vocab_size, err,
                         errlen);
    }
    if (rc != 0) {
        dataset_close(d);
        return NULL;
    }
    return d;
}

void dataset_close(Dataset *d) {
    if (!d) return;
    for (int i = 0; i < d->n_shards; i++) shard_close(&d->shards[i]);
    free(d->shards);
    free(d->first_window);
    synthetic_free(d->synth);
    free(d);
}

// Fills one sequence (T inputs, T targets) from stream index k.
static void read_window(Dataset *d, uint64_t k, int *inputs, int *targets) {
    if (d->synth) {
        synthetic_sequence(d->synth, hash3(d->seed, (uint64_t)d->split + 1, k), inputs, targets);
        return;
    }
    uint64_t epoch = k / d->n_windows, w = k % d->n_windows;
    if (d->shuffle) w = permute(d, epoch, w);
    int lo = 0, hi = d->n_shards - 1;   // the shard i with first_window[i] <= w < first_window[i+1]
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (d->first_window[mid] <= w) lo = mid;
        else hi = mid - 1;
    }
    uint64_t start = (w - d->first_window[lo]) * (uint64_t)d->T;
    if (d->shuffle) {
        // Shift the window by a keyed offset in [0, T), so every epoch shows the model new
        // alignments of the text (as random sampling of start positions does), clamped so the
        // window stays inside its shard.
        uint64_t last = d->shards[lo].n_tokens - 1 - (uint64_t)d->T;
        start += hash3(d->seed ^ 0x6F6666736574ull, epoch, w) % (uint64_t)d->T;
        if (start > last) start = last;
    }
    shard_read(&d->shards[lo], start, (size_t)d->T, inputs);
    shard_read(&d->shards[lo], start + 1, (size_t)d->T, targets);
}

void dataset_next(Dataset *d, int *inputs, int *targets) {
    uint64_t first = d->next + (uint64_t)d->rank * (uint64_t)d->B;
    for (int b = 0; b < d->B; b++)
        read_window(d, first + (uint64_t)b, inputs + (size_t)b * d->T, targets + (size_t)b * d->T);
    d->next += (uint64_t)d->B * (uint64_t)d->world;
}

void dataset_rewind(Dataset *d) { d->next = 0; }

// a: stream index of the next global batch; b: windows per epoch (0 for synthetic tasks), kept to
// notice data that changed between save and restore; c: unused, 0.
DatasetState dataset_get_state(const Dataset *d) {
    DatasetState s = {d->next, d->synth ? 0 : d->n_windows, 0};
    return s;
}

void dataset_set_state(Dataset *d, DatasetState s) {
    uint64_t w = d->synth ? 0 : d->n_windows;
    if (s.b != w)
        warnf("%s: the saved data position counts %llu windows per epoch but the data now has %llu "
              "(shards or train.seq_len changed): the resumed run will not read the same batches",
              split_key(d->split), (unsigned long long)s.b, (unsigned long long)w);
    d->next = s.a;
}

uint64_t dataset_num_tokens(const Dataset *d) { return d->synth ? 0 : d->n_tokens; }

double dataset_loss_floor(const Dataset *d) { return d->synth ? synthetic_loss_floor(d->synth) : -1.0; }
