#include "data/shard_set.h"

#include <stdio.h>
#include <string.h>

#include "common/check.h"

void shard_set_init(ShardSet *s, const char *base, int numbered, uint64_t shard_tokens, ShardVersion v) {
    memset(s, 0, sizeof *s);
    snprintf(s->base, sizeof s->base, "%s", base);
    s->numbered = numbered;
    s->shard_tokens = numbered ? shard_tokens : INT32_MAX;
    s->version = v;
    CHECK(s->shard_tokens >= 1 && s->shard_tokens <= INT32_MAX);
}

void shard_set_path(const ShardSet *s, int index, char *out, size_t n) {
    if (s->numbered) snprintf(out, n, "%s_%06d.bin", s->base, index);
    else snprintf(out, n, "%s.bin", s->base);
}

static uint64_t in_open(const ShardSet *s) { return s->open ? s->cur.n : 0; }

int shard_set_full(const ShardSet *s) { return in_open(s) == s->shard_tokens; }

int shard_set_write(ShardSet *s, const int *ids, size_t n, size_t *taken, char *err, size_t errlen) {
    *taken = 0;
    if (n == 0) return 0;
    if (!s->open) {
        char path[SHARD_SET_PATH_MAX + 16];
        shard_set_path(s, s->done, path, sizeof path);
        if (shard_out_open(&s->cur, path, s->version, err, errlen) != 0) return -1;
        s->open = 1;
    }
    uint64_t room = s->shard_tokens - s->cur.n;
    size_t k = n < room ? n : (size_t)room;
    if (shard_out_write(&s->cur, ids, k, err, errlen) != 0) return -1;
    s->tokens += k;
    *taken = k;
    return 0;
}

int shard_set_finish(ShardSet *s, int commit, char *err, size_t errlen) {
    if (!s->open || s->cur.n == 0) return 0;
    if (shard_out_close(&s->cur, err, errlen) != 0) return -1;
    if (!commit) return 0;
    return shard_set_commit(s, err, errlen);
}

int shard_set_commit(ShardSet *s, char *err, size_t errlen) {
    if (!s->open) return 0;
    if (shard_out_commit(&s->cur, err, errlen) != 0) return -1;
    shard_out_discard(&s->cur);   // frees the names; the temporary file is gone already
    s->open = 0;
    s->done++;
    return 0;
}

void shard_set_discard(ShardSet *s) {
    if (s->open) shard_out_discard(&s->cur);
    s->open = 0;
}
