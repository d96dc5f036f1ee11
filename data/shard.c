#include "data/shard.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/check.h"
#include "common/fileio.h"

#define SHARD_HEADER_BYTES (SHARD_HEADER_INTS * sizeof(int32_t))
#define SHARD_CHECK_CHUNK_BYTES (64u << 20)   // validation window: bounds the resident set

static size_t token_bytes(ShardVersion v) { return v == SHARD_U16 ? sizeof(uint16_t) : sizeof(uint32_t); }

static uint32_t token_at(const Shard *s, uint64_t i) {
    if (s->version == SHARD_U16) {
        uint16_t t;
        memcpy(&t, s->tokens + i * sizeof t, sizeof t);
        return t;
    }
    uint32_t t;
    memcpy(&t, s->tokens + i * sizeof t, sizeof t);
    return t;
}

// Magic and version must come as one of the two llm.c pairs.
static int check_header(const char *path, const int32_t *h, ShardVersion *v, char *err, size_t errlen) {
    if (h[0] == SHARD_MAGIC_U16) {
        if (h[1] != SHARD_VERSION_U16)
            return set_error(err, errlen, "shard '%s': magic %d needs version %d, found version %d", path,
                          SHARD_MAGIC_U16, SHARD_VERSION_U16, h[1]);
        *v = SHARD_U16;
    } else if (h[0] == SHARD_MAGIC_U32) {
        if (h[1] != SHARD_VERSION_U32)
            return set_error(err, errlen, "shard '%s': magic %d needs version %d, found version %d", path,
                          SHARD_MAGIC_U32, SHARD_VERSION_U32, h[1]);
        *v = SHARD_U32;
    } else {
        return set_error(err, errlen,
                      "shard '%s': bad magic %d (expected %d or %d): not an llm.c token shard "
                      "(make one with train_gpt prepare)",
                      path, h[0], SHARD_MAGIC_U16, SHARD_MAGIC_U32);
    }
    if (h[2] < 0) return set_error(err, errlen, "shard '%s': negative token count %d in the header", path, h[2]);
    return 0;
}

// One pass over the mapped tokens, in chunks split over OpenMP threads; reports the first id >=
// vocab_size. Each chunk's pages are dropped from this process after the check (they stay in the
// page cache), so validating a shard far larger than RAM keeps the resident set at one chunk.
static int check_tokens(const Shard *s, int vocab_size, char *err, size_t errlen) {
    const uint64_t chunk = SHARD_CHECK_CHUNK_BYTES / token_bytes(s->version);
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    uint64_t first_bad = UINT64_MAX;
    for (uint64_t lo = 0; lo < s->n_tokens && first_bad == UINT64_MAX; lo += chunk) {
        uint64_t hi = lo + chunk < s->n_tokens ? lo + chunk : s->n_tokens;
#pragma omp parallel for schedule(static) reduction(min : first_bad)
        for (uint64_t i = lo; i < hi; i++)
            if (token_at(s, i) >= (uint32_t)vocab_size && i < first_bad) first_bad = i;
        size_t done = (SHARD_HEADER_BYTES + hi * token_bytes(s->version)) / page * page;
        madvise(s->map, done, MADV_DONTNEED);   // read-only file pages: re-read on the next access
    }
    if (first_bad == UINT64_MAX) return 0;
    return set_error(err, errlen,
                  "shard '%s': token %u at token offset %llu (byte offset %llu) is not below "
                  "model.vocab_size %d",
                  s->path, token_at(s, first_bad), (unsigned long long)first_bad,
                  (unsigned long long)(SHARD_HEADER_BYTES + first_bad * token_bytes(s->version)), vocab_size);
}

static int open_mapped(Shard *s, const char *path, char *err, size_t errlen) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return set_error(err, errlen, "cannot open shard '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return set_error(err, errlen, "cannot stat shard '%s': %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return set_error(err, errlen, "shard '%s' is not a regular file", path);
    }
    if ((size_t)st.st_size < SHARD_HEADER_BYTES) {
        close(fd);
        return set_error(err, errlen, "shard '%s' is truncated: %lld bytes, smaller than the %zu-byte header",
                      path, (long long)st.st_size, SHARD_HEADER_BYTES);
    }
    s->map_len = (size_t)st.st_size;
    s->map = mmap(NULL, s->map_len, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (s->map == MAP_FAILED) {
        s->map = NULL;
        return set_error(err, errlen, "cannot map shard '%s': %s", path, strerror(e));
    }
    return 0;
}

int shard_open(Shard *s, const char *path, int vocab_size, char *err, size_t errlen) {
    memset(s, 0, sizeof *s);
    if (open_mapped(s, path, err, errlen) != 0) return -1;
    s->path = xstrdup(path);
    int32_t h[SHARD_HEADER_INTS];
    memcpy(h, s->map, sizeof h);
    if (check_header(path, h, &s->version, err, errlen) != 0) goto fail;
    s->n_tokens = (uint64_t)h[2];
    s->tokens = (const unsigned char *)s->map + SHARD_HEADER_BYTES;
    uint64_t want = SHARD_HEADER_BYTES + s->n_tokens * token_bytes(s->version);
    if (s->map_len < want) {
        set_error(err, errlen, "shard '%s' is truncated: the header says %llu tokens (%llu bytes) but the file "
                            "has %zu bytes",
               path, (unsigned long long)s->n_tokens, (unsigned long long)want, s->map_len);
        goto fail;
    }
    if (s->map_len > want) {
        set_error(err, errlen, "shard '%s' has %zu bytes but its header says %llu tokens (%llu bytes): "
                            "trailing data or a corrupt header",
               path, s->map_len, (unsigned long long)s->n_tokens, (unsigned long long)want);
        goto fail;
    }
    if (vocab_size > 0 && check_tokens(s, vocab_size, err, errlen) != 0) goto fail;
    return 0;
fail:
    shard_close(s);
    return -1;
}

void shard_close(Shard *s) {
    if (s->map) munmap(s->map, s->map_len);
    free(s->path);
    memset(s, 0, sizeof *s);
}

void shard_read(const Shard *s, uint64_t start, size_t n, int *out) {
    CHECK(start + n <= s->n_tokens);
    for (size_t i = 0; i < n; i++) out[i] = (int)token_at(s, start + i);
}

ShardVersion shard_version_for_vocab(long vocab_size) {
    return vocab_size <= 65536 ? SHARD_U16 : SHARD_U32;
}

int shard_write(const char *path, const int *tokens, size_t n, ShardVersion version, char *err,
                size_t errlen) {
    if (n > INT32_MAX)
        return set_error(err, errlen, "shard '%s': %zu tokens do not fit the header's int32 count (max %d); "
                                   "split the data into several shards", path, n, INT32_MAX);
    long limit = version == SHARD_U16 ? 65536L : 2147483647L;
    size_t tb = token_bytes(version);
    size_t len = SHARD_HEADER_BYTES + n * tb;
    unsigned char *buf = xcalloc(len, 1);
    int32_t h[SHARD_HEADER_INTS] = {0};
    h[0] = version == SHARD_U16 ? SHARD_MAGIC_U16 : SHARD_MAGIC_U32;
    h[1] = version;
    h[2] = (int32_t)n;
    memcpy(buf, h, sizeof h);
    for (size_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= limit) {
            free(buf);
            return set_error(err, errlen, "shard '%s': token %d at offset %zu does not fit a version-%d shard",
                          path, tokens[i], i, version);
        }
        if (version == SHARD_U16) {
            uint16_t t = (uint16_t)tokens[i];
            memcpy(buf + SHARD_HEADER_BYTES + i * tb, &t, tb);
        } else {
            uint32_t t = (uint32_t)tokens[i];
            memcpy(buf + SHARD_HEADER_BYTES + i * tb, &t, tb);
        }
    }
    int rc = write_file_atomic(path, buf, len, err, errlen);
    free(buf);
    return rc;
}
