#include "data/byte_source.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/check.h"

#define SOURCE_BUF_BYTES (256u << 10)   // one read(2) of the file
#define SOURCE_MAGIC_BYTES 6            // the longest magic inflate_detect looks at

struct ByteSource {
    int fd, is_stdin;
    char *path;               // for messages
    Codec codec;
    Inflater *z;              // NULL for plain input
    unsigned char *in;        // (SOURCE_BUF_BYTES) bytes read from fd
    size_t in_len, in_pos;    // in[in_pos, in_len) not yet used
    uint64_t file_read;       // bytes read from fd
    int eof;
};

static const char *display(const ByteSource *s) { return s->is_stdin ? "standard input" : s->path; }

// Reads more of the file into in[in_len, cap) (after moving what is left to the front).
static int fill(ByteSource *s, char *err, size_t errlen) {
    if (s->in_pos > 0) {
        memmove(s->in, s->in + s->in_pos, s->in_len - s->in_pos);
        s->in_len -= s->in_pos;
        s->in_pos = 0;
    }
    for (;;) {
        ssize_t r = read(s->fd, s->in + s->in_len, SOURCE_BUF_BYTES - s->in_len);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return set_error(err, errlen, "cannot read '%s': %s", display(s), strerror(errno));
        if (r == 0) s->eof = 1;
        s->in_len += (size_t)r;
        s->file_read += (uint64_t)r;
        return 0;
    }
}

ByteSource *byte_source_open(const char *path, char *err, size_t errlen) {
    ByteSource *s = xcalloc(1, sizeof *s);
    s->is_stdin = strcmp(path, "-") == 0;
    s->path = xstrdup(path);
    s->fd = s->is_stdin ? STDIN_FILENO : open(path, O_RDONLY);
    s->in = xmalloc(SOURCE_BUF_BYTES);
    const char *unsupported = NULL;
    if (s->fd < 0) {
        set_error(err, errlen, "cannot open '%s': %s", path, strerror(errno));
        goto fail;
    }
    while (!s->eof && s->in_len < SOURCE_MAGIC_BYTES)   // a pipe may deliver the magic in pieces
        if (fill(s, err, errlen) != 0) goto fail;
    s->codec = inflate_detect(s->in, s->in_len, &unsupported);
    if (unsupported) {
        set_error(err, errlen, "'%s' is %s-compressed, which prepare cannot read (it reads plain, gzip and "
                               "zstd input): decompress it first, e.g. %s -dc FILE | train_gpt prepare --input - ...",
                  display(s), unsupported, unsupported);
        goto fail;
    }
    if (s->codec != CODEC_PLAIN && !(s->z = inflater_create(s->codec, err, errlen))) goto fail;
    return s;
fail:
    byte_source_close(s);
    return NULL;
}

void byte_source_close(ByteSource *s) {
    if (!s) return;
    if (!s->is_stdin && s->fd >= 0) close(s->fd);
    inflater_free(s->z);
    free(s->in);
    free(s->path);
    free(s);
}

static long read_plain(ByteSource *s, char *buf, size_t cap, char *err, size_t errlen) {
    if (s->in_pos == s->in_len) {
        if (s->eof) return 0;
        s->in_pos = s->in_len = 0;
        if (fill(s, err, errlen) != 0) return -1;
    }
    size_t n = s->in_len - s->in_pos < cap ? s->in_len - s->in_pos : cap;
    memcpy(buf, s->in + s->in_pos, n);
    s->in_pos += n;
    return (long)n;
}

static long read_compressed(ByteSource *s, char *buf, size_t cap, char *err, size_t errlen) {
    char sub[512];
    for (;;) {
        if (s->in_pos == s->in_len && !s->eof && fill(s, err, errlen) != 0) return -1;
        size_t before = s->in_pos;
        long n = inflater_run(s->z, s->in, s->in_len, &s->in_pos, buf, cap, sub, sizeof sub);
        if (n < 0)
            return set_error(err, errlen, "'%s': %s near compressed byte %llu", display(s), sub,
                             (unsigned long long)byte_source_consumed(s));
        if (n > 0) return n;
        if (s->in_pos == s->in_len && s->eof) {
            if (inflater_at_end(s->z)) return 0;
            return set_error(err, errlen, "'%s': the %s data ends in the middle of a stream: the file is "
                                          "truncated (an interrupted download or copy?)",
                             display(s), inflate_codec_name(s->codec));
        }
        // Neither output nor input consumed while bytes remain: the decoder wants more at once.
        if (s->in_pos == before) {
            if (s->eof || (s->in_pos == 0 && s->in_len == SOURCE_BUF_BYTES))
                return set_error(err, errlen, "'%s': the %s decoder stopped making progress", display(s),
                                 inflate_codec_name(s->codec));
            if (fill(s, err, errlen) != 0) return -1;
        }
    }
}

long byte_source_read(ByteSource *s, char *buf, size_t cap, char *err, size_t errlen) {
    return s->z ? read_compressed(s, buf, cap, err, errlen) : read_plain(s, buf, cap, err, errlen);
}

int byte_source_skip(ByteSource *s, uint64_t n, char *err, size_t errlen) {
    struct stat st;
    if (!s->z && !s->is_stdin && fstat(s->fd, &st) == 0 && S_ISREG(st.st_mode)) {
        size_t buffered = s->in_len - s->in_pos;
        if (n <= buffered) {
            s->in_pos += (size_t)n;
            return 0;
        }
        uint64_t ahead = n - buffered;
        if ((uint64_t)st.st_size < s->file_read + ahead)
            return set_error(err, errlen, "'%s' is shorter than before (%lld bytes)", display(s), (long long)st.st_size);
        if (lseek(s->fd, (off_t)ahead, SEEK_CUR) < 0)
            return set_error(err, errlen, "cannot seek in '%s': %s", display(s), strerror(errno));
        s->in_pos = s->in_len = 0;
        s->file_read += ahead;
        return 0;
    }
    char *scratch = xmalloc(SOURCE_BUF_BYTES);
    int rc = 0;
    while (n > 0 && rc == 0) {
        long got = byte_source_read(s, scratch, n < SOURCE_BUF_BYTES ? (size_t)n : SOURCE_BUF_BYTES, err, errlen);
        if (got < 0) rc = -1;
        else if (got == 0) rc = set_error(err, errlen, "'%s' ends before the position to resume from", display(s));
        else n -= (uint64_t)got;
    }
    free(scratch);
    return rc;
}

uint64_t byte_source_consumed(const ByteSource *s) { return s->file_read - (s->in_len - s->in_pos); }

Codec byte_source_codec(const ByteSource *s) { return s->codec; }
