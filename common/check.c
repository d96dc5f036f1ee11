#include "common/check.h"
#include <errno.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>

void fatal(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    fflush(stdout);
    exit(code);
}

void warnf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("warning: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

int set_error(char *err, size_t errlen, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) fatal(EXIT_RUNTIME, "out of host memory allocating %zu bytes", n);
    return p;
}

void *xcalloc(size_t n, size_t s) {
    void *p = calloc(n ? n : 1, s ? s : 1);
    if (!p) fatal(EXIT_RUNTIME, "out of host memory allocating %zu x %zu bytes", n, s);
    return p;
}

void *xrealloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) fatal(EXIT_RUNTIME, "out of host memory reallocating %zu bytes", n);
    return q;
}

char *xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = xmalloc(n);
    memcpy(d, s, n);
    return d;
}

FILE *fopen_or_die(const char *path, const char *mode) {
    FILE *f = fopen(path, mode);
    if (!f)
        fatal(EXIT_USAGE, "cannot open '%s' (mode %s): %s; check the path and its permissions", path,
              mode, strerror(errno));
    return f;
}

char *read_file(const char *path, size_t *len_out, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        set_error(err, errlen, "cannot open '%s': %s; check the path and its permissions", path,
                  strerror(errno));
        return NULL;
    }
    // A regular file's size sizes the buffer (room for the NUL and one more byte, so the read
    // that meets the end needs no growth); pipes and files that grow take the doubling path.
    struct stat st;
    size_t cap = 1 << 16, len = 0;
    if (fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode) && (size_t)st.st_size + 2 > cap)
        cap = (size_t)st.st_size + 2;
    char *buf = xmalloc(cap);
    size_t got;
    while ((got = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += got;
        if (cap - len - 1 == 0) buf = xrealloc(buf, cap *= 2);
    }
    const int bad = ferror(f), e = errno;
    fclose(f);
    if (bad) {
        free(buf);
        set_error(err, errlen, "cannot read '%s': %s", path, strerror(e));
        return NULL;
    }
    buf[len] = '\0';
    if (len_out) *len_out = len;
    return buf;
}

char *read_file_or_die(const char *path, size_t *len_out) {
    char err[ERR_LEN];
    char *buf = read_file(path, len_out, err, sizeof err);
    if (!buf) fatal(EXIT_USAGE, "%s", err);
    return buf;
}
