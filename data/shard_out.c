#include "data/shard_out.h"

#include <errno.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/check.h"
#include "common/fileio.h"

#define SHARD_OUT_CHUNK 65536   // tokens converted to the file's width at a time

static int io_error(const ShardOut *o, const char *what, char *err, size_t errlen) {
    int e = errno;
    return set_error(err, errlen, "cannot %s '%s': %s%s", what, o->tmp, strerror(e),
                     e == ENOSPC ? " (the disk is full: free space, then run again with --resume)" : "");
}

static int write_header(ShardOut *o, char *err, size_t errlen) {
    int32_t h[SHARD_HEADER_INTS] = {0};
    h[0] = o->version == SHARD_U16 ? SHARD_MAGIC_U16 : SHARD_MAGIC_U32;
    h[1] = o->version;
    h[2] = (int32_t)o->n;
    if (fseek(o->f, 0, SEEK_SET) != 0 || fwrite(h, sizeof h, 1, o->f) != 1) return io_error(o, "write", err, errlen);
    return 0;
}

int shard_out_open(ShardOut *o, const char *path, ShardVersion version, char *err, size_t errlen) {
    memset(o, 0, sizeof *o);
    o->path = xstrdup(path);
    size_t len = strlen(path) + 32;
    o->tmp = xmalloc(len);
    snprintf(o->tmp, len, "%s.tmp.%d", path, (int)getpid());
    o->version = version;
    if (!(o->f = fopen(o->tmp, "wb"))) {
        int rc = io_error(o, "create", err, errlen);
        shard_out_discard(o);
        return rc;
    }
    setvbuf(o->f, NULL, _IOFBF, 1u << 20);
    if (write_header(o, err, errlen) != 0) {
        shard_out_discard(o);
        return -1;
    }
    return 0;
}

int shard_out_write(ShardOut *o, const int *ids, size_t n, char *err, size_t errlen) {
    if (o->n + n > INT32_MAX)
        return set_error(err, errlen, "'%s' would hold more than %d tokens, the most a shard's int32 count allows",
                         o->path, INT32_MAX);
    const long limit = o->version == SHARD_U16 ? 65536L : 2147483648L;
    unsigned char buf[SHARD_OUT_CHUNK * sizeof(uint32_t)];
    for (size_t done = 0; done < n;) {
        size_t k = n - done < SHARD_OUT_CHUNK ? n - done : SHARD_OUT_CHUNK;
        for (size_t i = 0; i < k; i++) {
            int t = ids[done + i];
            CHECK(t >= 0 && t < limit);   // ids come from the vocabulary that chose the version
            if (o->version == SHARD_U16) {
                uint16_t v = (uint16_t)t;
                memcpy(buf + i * sizeof v, &v, sizeof v);
            } else {
                uint32_t v = (uint32_t)t;
                memcpy(buf + i * sizeof v, &v, sizeof v);
            }
        }
        size_t width = o->version == SHARD_U16 ? sizeof(uint16_t) : sizeof(uint32_t);
        if (fwrite(buf, width, k, o->f) != k) return io_error(o, "write", err, errlen);
        done += k;
    }
    o->n += n;
    return 0;
}

int shard_out_close(ShardOut *o, char *err, size_t errlen) {
    if (write_header(o, err, errlen) != 0) return -1;
    if (fflush(o->f) != 0 || fsync(fileno(o->f)) != 0) return io_error(o, "flush", err, errlen);
    FILE *f = o->f;
    o->f = NULL;
    if (fclose(f) != 0) return io_error(o, "close", err, errlen);
    return 0;
}

int shard_out_commit(ShardOut *o, char *err, size_t errlen) {
    CHECK(!o->f);
    if (rename(o->tmp, o->path) != 0)
        return set_error(err, errlen, "cannot rename '%s' to '%s': %s", o->tmp, o->path, strerror(errno));
    free(o->tmp);
    o->tmp = NULL;
    char *dir = xstrdup(o->path);
    fsync_dir(dirname(dir));   // the rename itself becomes durable; a failure here loses nothing written
    free(dir);
    return 0;
}

void shard_out_discard(ShardOut *o) {
    if (o->f) fclose(o->f);
    if (o->tmp) unlink(o->tmp);
    free(o->tmp);
    free(o->path);
    memset(o, 0, sizeof *o);
}
