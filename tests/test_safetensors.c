// safetensors: round trip of every dtype and metadata, the on-disk layout byte for byte, and
// every corrupt-file case the reader must reject with a message naming the file and the problem.
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fileio.h"
#include "common/safetensors.h"
#include "tests/testlib.h"

// Writes an 8-byte length + header (padded as given) + data bytes to path.
static void write_raw(const char *path, const char *header, const void *data, size_t data_len) {
    FILE *fp = fopen(path, "wb");
    uint64_t n = strlen(header);
    unsigned char len[8];
    for (int i = 0; i < 8; i++) len[i] = (unsigned char)(n >> (8 * i));
    fwrite(len, 1, 8, fp);
    fwrite(header, 1, n, fp);
    if (data_len) fwrite(data, 1, data_len, fp);
    fclose(fp);
}

// A file of exactly these n bytes (headers too broken for write_raw to frame).
static void write_bytes(const char *path, const char *bytes, size_t n) {
    FILE *fp = fopen(path, "wb");
    fwrite(bytes, 1, n, fp);
    fclose(fp);
}

// Files in dir whose name marks an unfinished atomic write ("<name>.tmp.<pid>").
static int count_temp_files(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d)) != NULL;) n += strstr(e->d_name, ".tmp.") != NULL;
    if (d) closedir(d);
    return n;
}

// Expects st_read to fail with a message that names path and contains `needle`.
static void expect_reject(const char *path, const char *needle, const char *what) {
    StFile f;
    char err[512] = "";
    int rc = st_read(&f, path, err, sizeof err);
    EXPECT(rc == -1, "%s: corrupt file accepted", what);
    EXPECT(strstr(err, path) != NULL && strstr(err, needle) != NULL, "%s: message '%s' lacks '%s'", what, err,
           needle);
    EXPECT(f.tensors == NULL && f.file_data == NULL && f.n == 0, "%s: state not released", what);
}

static void test_round_trip(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/rt.safetensors", dir);
    float a[6] = {1.5f, -2.0f, 3.25f, 0.0f, -0.0f, 1e-30f};  // (2, 3)
    uint16_t h[3] = {0x3c00, 0xbc00, 0x7bff};                // (3) F16 bit patterns
    int32_t i32[4] = {-1, 0, 7, 2147483647};                 // (2, 2)
    int64_t i64[2] = {-5, 1LL << 40};                        // (2)
    uint8_t u8[5] = {1, 2, 3, 4, 255};                       // (5)
    float scalar = 42.0f;                                     // ()
    const int64_t sa[2] = {2, 3}, sh[1] = {3}, si[2] = {2, 2}, sl[1] = {2}, su[1] = {5}, sz[2] = {0, 7};
    StFile w;
    st_init(&w);
    st_add(&w, "u8", DTYPE_U8, 1, su, u8);  // added first, must still land after the wider types
    st_add(&w, "a.weight", DTYPE_F32, 2, sa, a);
    st_add(&w, "half", DTYPE_F16, 1, sh, h);
    st_add(&w, "bf", DTYPE_BF16, 1, sh, h);
    st_add(&w, "i32", DTYPE_I32, 2, si, i32);
    st_add(&w, "i64", DTYPE_I64, 1, sl, i64);
    st_add(&w, "scalar", DTYPE_F32, 0, NULL, &scalar);
    st_add(&w, "empty", DTYPE_F32, 2, sz, NULL);
    st_set_meta(&w, "format", "pt");
    st_set_meta(&w, "quote", "a \"quoted\"\nline");
    st_set_meta(&w, "format", "flashgpt");  // replaces the earlier value
    char err[512] = "";
    EXPECT(st_write(&w, path, err, sizeof err) == 0, "write: %s", err);
    st_free(&w);

    StFile r;
    EXPECT(st_read(&r, path, err, sizeof err) == 0, "read: %s", err);
    EXPECT(r.n == 8, "tensor count %d", r.n);
    const StTensor *ta = st_find(&r, "a.weight");
    EXPECT(ta && ta->dtype == DTYPE_F32 && ta->ndim == 2 && ta->shape[0] == 2 && ta->shape[1] == 3 &&
               ta->nbytes == sizeof a && memcmp(ta->data, a, sizeof a) == 0,
           "a.weight differs");
    const StTensor *th = st_find(&r, "half"), *tb = st_find(&r, "bf");
    EXPECT(th && th->dtype == DTYPE_F16 && memcmp(th->data, h, sizeof h) == 0, "half differs");
    EXPECT(tb && tb->dtype == DTYPE_BF16 && memcmp(tb->data, h, sizeof h) == 0, "bf differs");
    const StTensor *ti = st_find(&r, "i32"), *tl = st_find(&r, "i64"), *tu = st_find(&r, "u8");
    EXPECT(ti && ti->dtype == DTYPE_I32 && memcmp(ti->data, i32, sizeof i32) == 0, "i32 differs");
    EXPECT(tl && tl->dtype == DTYPE_I64 && memcmp(tl->data, i64, sizeof i64) == 0, "i64 differs");
    EXPECT(tu && tu->dtype == DTYPE_U8 && memcmp(tu->data, u8, sizeof u8) == 0, "u8 differs");
    const StTensor *ts = st_find(&r, "scalar"), *te = st_find(&r, "empty");
    EXPECT(ts && ts->ndim == 0 && ts->nbytes == 4 && *(const float *)ts->data == 42.0f, "scalar differs");
    EXPECT(te && te->ndim == 2 && te->shape[1] == 7 && te->nbytes == 0, "empty tensor differs");
    // Wider types first keeps every tensor aligned to its element size.
    for (int i = 0; i < r.n; i++) {
        uintptr_t at = (uintptr_t)r.tensors[i].data - (uintptr_t)r.file_data;
        EXPECT(at % dtype_size(r.tensors[i].dtype) == 0, "%s misaligned at %zu", r.tensors[i].name,
               (size_t)at);
    }
    EXPECT(st_find(&r, "missing") == NULL, "st_find invented a tensor");
    const char *fmt = st_meta(&r, "format"), *q = st_meta(&r, "quote");
    EXPECT(fmt && strcmp(fmt, "flashgpt") == 0, "metadata format '%s'", fmt ? fmt : "(null)");
    EXPECT(q && strcmp(q, "a \"quoted\"\nline") == 0, "metadata escaping lost");
    EXPECT(st_meta(&r, "absent") == NULL, "absent metadata found");
    EXPECT(r.meta_json && strstr(r.meta_json, "\"format\":\"flashgpt\"") != NULL, "meta_json '%s'",
           r.meta_json ? r.meta_json : "(null)");
    // Writing what was read gives the same bytes (the reader keeps everything the writer needs).
    char path2[600];
    snprintf(path2, sizeof path2, "%s.again", path);
    EXPECT(st_write(&r, path2, err, sizeof err) == 0, "rewrite: %s", err);
    st_free(&r);
    EXPECT(r.n == 0 && r.tensors == NULL && r.meta == NULL, "st_free left state");

    size_t n1, n2;
    FILE *f1 = fopen(path, "rb"), *f2 = fopen(path2, "rb");
    char b1[4096] = {0}, b2[4096] = {0};
    n1 = fread(b1, 1, sizeof b1, f1);
    n2 = fread(b2, 1, sizeof b2, f2);
    fclose(f1);
    fclose(f2);
    EXPECT(n1 == n2 && memcmp(b1, b2, n1) == 0, "rewrite differs (%zu vs %zu bytes)", n1, n2);
    // Layout: header length is a multiple of 8, padded with spaces, data follows directly.
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | (unsigned char)b1[i];
    EXPECT(hl % 8 == 0 && b1[8] == '{' && hl + 8 <= n1, "header length %llu", (unsigned long long)hl);
    EXPECT(b1[8 + hl - 1] == '}' || b1[8 + hl - 1] == ' ', "header tail byte 0x%02x", b1[8 + hl - 1]);
    EXPECT(strstr(b1 + 8, "\"I64\",\"shape\":[2],\"data_offsets\":[0,16]") != NULL,
           "i64 (widest) not first in the data");
    unlink(path2);
    EXPECT(count_temp_files(dir) == 0, "a temporary file was left in %s", dir);
}

static void test_empty_file_and_atomic(const char *dir) {
    char path[512], err[512] = "";
    snprintf(path, sizeof path, "%s/none.safetensors", dir);
    StFile w, r;
    st_init(&w);
    EXPECT(st_write(&w, path, err, sizeof err) == 0, "write empty: %s", err);
    EXPECT(st_read(&r, path, err, sizeof err) == 0, "read empty: %s", err);
    EXPECT(r.n == 0 && r.meta == NULL, "empty file has %d tensors", r.n);
    st_free(&r);
    // A failed write (directory missing) reports the path and leaves no temporary file behind.
    char bad[600];
    snprintf(bad, sizeof bad, "%s/no/such/dir/x.safetensors", dir);
    EXPECT(st_write(&w, bad, err, sizeof err) == -1 && strstr(err, "no/such/dir") != NULL,
           "write to a missing dir: '%s'", err);
    snprintf(bad, sizeof bad, "%s/absent.safetensors", dir);
    EXPECT(st_read(&r, bad, err, sizeof err) == -1 && strstr(err, bad) != NULL, "missing file: '%s'", err);
    EXPECT(count_temp_files(dir) == 0, "a failed write left a temporary file in %s", dir);
}

// Headers of bad.safetensors (before 8 bytes of data) that must be rejected: the header, what
// the message must contain, what is wrong.
typedef struct {
    const char *header, *want, *what;
} BadHeader;

static const BadHeader BAD_HEADERS[] = {
    {"{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}",
     "bad JSON", "unterminated JSON"},
    {"{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}} junk",
     "bad JSON", "text after the JSON"},
    {"[1, 2]  ", "not an object", "array header"},
    {"{\"x\":{\"dtype\":\"C64\",\"shape\":[1],\"data_offsets\":[0,8]}}",
     "unknown dtype 'C64'", "unknown dtype"},
    {"{\"x\":{\"shape\":[2],\"data_offsets\":[0,8]}}", "no dtype", "missing dtype"},
    {"{\"x\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", "no shape", "missing shape"},
    {"{\"x\":{\"dtype\":\"F32\",\"shape\":[2]}}", "data_offsets", "missing offsets"},
    {"{\"x\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}",
     "need 12 bytes", "shape larger than the span"},
    {"{\"x\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}",
     "shape[0]", "negative dimension"},
    {"{\"x\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,8]}}",
     "shape[0]", "fractional dimension"},
    {"{\"x\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,8],\"data_offsets\":[0,8]}}",
     "5 dimensions", "too many dimensions"},
    {"{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}",
     "begin 8 > end 0", "reversed offsets"},
    {"{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}}",
     "data_offsets", "negative offset"},
    {"{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,9]}}",
     "data_offsets", "three offsets"},
    {"{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
     "\"y\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
     "overlap", "overlapping tensors"},
    {"{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
     "belong to no tensor", "gap before a tensor"},
    {"{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
     "after the last tensor", "trailing bytes"},
    {"{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
     "\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
     "appears twice", "duplicate tensor name"},
    {"{\"__metadata__\":{\"a\":1},\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
     "not a string", "numeric metadata value"},
    {"{\"x\":[\"F32\"]}", "must be an object", "tensor entry not an object"},
};

static void test_corrupt(const char *dir) {
    char p[512];
    snprintf(p, sizeof p, "%s/bad.safetensors", dir);
    const float d[2] = {1, 2};
    const char *ok = "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";

    write_raw(p, ok, d, sizeof d);  // the well-formed base case, so rejections below are specific
    StFile f;
    char err[512];
    EXPECT(st_read(&f, p, err, sizeof err) == 0, "base case rejected: %s", err);
    st_free(&f);

    write_bytes(p, "\x10\0\0", 3);
    expect_reject(p, "truncated", "shorter than 8 bytes");

    write_raw(p, ok, d, sizeof d);
    truncate(p, 20);
    expect_reject(p, "truncated", "header cut short");

    write_raw(p, ok, d, 4);
    expect_reject(p, "out of range", "data cut short");

    for (size_t i = 0; i < sizeof BAD_HEADERS / sizeof BAD_HEADERS[0]; i++) {
        write_raw(p, BAD_HEADERS[i].header, d, sizeof d);
        expect_reject(p, BAD_HEADERS[i].want, BAD_HEADERS[i].what);
    }

    write_bytes(p, "\xff\xff\xff\xff\xff\xff\xff\x7f{}", 10);
    expect_reject(p, "header length", "absurd header length");

    char hdr[512];
    snprintf(hdr, sizeof hdr, "{\"%0200d\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 7);
    write_raw(p, hdr, d, sizeof d);
    expect_reject(p, "longer than", "name too long");

    write_bytes(p, "\x04\0\0\0\0\0\0\0{\0}}", 12);
    expect_reject(p, "NUL", "NUL inside the header");
}

int main(void) {
    char dir[] = "/tmp/test_safetensors.XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    TEST_CASE("round trip of every dtype, scalars, empty tensors, metadata", test_round_trip(dir));
    TEST_CASE("empty file, failed writes, missing file", test_empty_file_and_atomic(dir));
    TEST_CASE("corrupt files are rejected with the file and the problem named", test_corrupt(dir));
    remove_tree(dir);
    return TEST_SUMMARY();
}
