#include "data/inflate.h"

#include <string.h>
#include <zlib.h>
#include <zstd.h>

#include "common/check.h"

struct Inflater {
    Codec codec;
    z_stream gz;
    ZSTD_DStream *zs;
    int at_end;    // the last member or frame is complete
    int started;   // some input has been consumed since the last end
};

Codec inflate_detect(const unsigned char *head, size_t n, const char **unsupported) {
    *unsupported = NULL;
    if (n >= 2 && head[0] == 0x1F && head[1] == 0x8B) return CODEC_GZIP;
    if (n >= 4 && head[0] == 0x28 && head[1] == 0xB5 && head[2] == 0x2F && head[3] == 0xFD) return CODEC_ZSTD;
    if (n >= 6 && memcmp(head, "\xFD" "7zXZ\0", 6) == 0) *unsupported = "xz";
    else if (n >= 3 && memcmp(head, "BZh", 3) == 0 && n >= 4 && head[3] >= '1' && head[3] <= '9') *unsupported = "bzip2";
    return CODEC_PLAIN;
}

const char *inflate_codec_name(Codec c) { return c == CODEC_GZIP ? "gzip" : c == CODEC_ZSTD ? "zstd" : "plain"; }

Inflater *inflater_create(Codec c, char *err, size_t errlen) {
    CHECK(c == CODEC_GZIP || c == CODEC_ZSTD);
    Inflater *z = xcalloc(1, sizeof *z);
    z->codec = c;
    z->at_end = 1;
    if (c == CODEC_GZIP) {
        if (inflateInit2(&z->gz, 16 + MAX_WBITS) != Z_OK) {   // 16: gzip wrapper only
            free(z);
            set_error(err, errlen, "zlib cannot start (out of memory)");
            return NULL;
        }
    } else if (!(z->zs = ZSTD_createDStream()) || ZSTD_isError(ZSTD_initDStream(z->zs))) {
        ZSTD_freeDStream(z->zs);
        free(z);
        set_error(err, errlen, "libzstd cannot start (out of memory)");
        return NULL;
    }
    return z;
}

void inflater_free(Inflater *z) {
    if (!z) return;
    if (z->codec == CODEC_GZIP) inflateEnd(&z->gz);
    else ZSTD_freeDStream(z->zs);
    free(z);
}

static long run_gzip(Inflater *z, const unsigned char *in, size_t len, size_t *pos, char *out, size_t cap,
                     char *err, size_t errlen) {
    // A member just ended and more bytes follow: they start the next member.
    if (z->at_end && z->started && *pos < len) {
        inflateReset(&z->gz);
        z->started = 0;
    }
    z->gz.next_in = (unsigned char *)in + *pos;   // zlib's API is not const-correct; it only reads
    z->gz.avail_in = (uInt)(len - *pos);
    z->gz.next_out = (unsigned char *)out;
    z->gz.avail_out = (uInt)cap;
    int rc = inflate(&z->gz, Z_NO_FLUSH);
    size_t used = (len - *pos) - z->gz.avail_in;
    *pos += used;
    if (used) z->started = 1;
    if (rc == Z_STREAM_END) z->at_end = 1;
    else if (rc == Z_OK || rc == Z_BUF_ERROR) z->at_end = 0;
    else return set_error(err, errlen, "corrupt gzip data (%s)", z->gz.msg ? z->gz.msg : zError(rc));
    return (long)(cap - z->gz.avail_out);
}

static long run_zstd(Inflater *z, const unsigned char *in, size_t len, size_t *pos, char *out, size_t cap,
                     char *err, size_t errlen) {
    ZSTD_inBuffer ib = {in, len, *pos};
    ZSTD_outBuffer ob = {out, cap, 0};
    size_t rc = ZSTD_decompressStream(z->zs, &ob, &ib);
    if (ZSTD_isError(rc)) return set_error(err, errlen, "corrupt zstd data (%s)", ZSTD_getErrorName(rc));
    // 0: a frame is complete and flushed. A call that moves nothing says nothing: after the
    // last frame it returns the size of the header of a next one, which never comes.
    if (ib.pos > *pos || ob.pos > 0) z->at_end = rc == 0;
    if (ib.pos > *pos) z->started = 1;
    *pos = ib.pos;
    return (long)ob.pos;
}

long inflater_run(Inflater *z, const unsigned char *in, size_t len, size_t *pos, char *out, size_t cap,
                  char *err, size_t errlen) {
    if (cap > (1u << 30)) cap = 1u << 30;   // zlib counts in uInt
    return z->codec == CODEC_GZIP ? run_gzip(z, in, len, pos, out, cap, err, errlen)
                                  : run_zstd(z, in, len, pos, out, cap, err, errlen);
}

int inflater_at_end(const Inflater *z) { return z->at_end; }
