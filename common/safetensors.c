// safetensors reader and writer. Layout of a file:
//   [8 bytes] N, the header length, little-endian u64
//   [N bytes] JSON object {name: {"dtype", "shape", "data_offsets": [begin, end]}, ...} with an
//             optional "__metadata__" object of strings; padded with spaces so 8 + N is a
//             multiple of 8
//   [rest]    tensor data; offsets are relative to the start of this section, and the tensors
//             cover it exactly (no gaps, no overlaps, nothing after the last one)
#include "common/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/check.h"

// Refuse headers larger than this (the limit Hugging Face's reader uses): a larger "length" is
// almost certainly not a safetensors file, and we would otherwise try to parse garbage.
#define ST_MAX_HEADER (100u * 1000 * 1000)
// Offsets and sizes travel as JSON numbers (doubles in cJSON): integers are exact up to 2^53.
#define ST_MAX_JSON_INT 9007199254740992.0

// The format's names of the element types (common/dtype.h).
static const char *const ST_NAMES[DTYPE_COUNT] = {
    [DTYPE_F32] = "F32", [DTYPE_BF16] = "BF16", [DTYPE_F16] = "F16", [DTYPE_F64] = "F64",
    [DTYPE_I32] = "I32", [DTYPE_I64] = "I64",   [DTYPE_U8] = "U8",
};

void st_init(StFile *f) { memset(f, 0, sizeof *f); }

static size_t numel_of(int ndim, const int64_t *shape) {
    size_t n = 1;
    for (int d = 0; d < ndim; d++) n *= (size_t)shape[d];
    return n;
}

void st_add(StFile *f, const char *name, DType dt, int ndim, const int64_t *shape, const void *data) {
    CHECK(strlen(name) < sizeof f->tensors[0].name && strcmp(name, "__metadata__") != 0);
    CHECK(ndim >= 0 && ndim <= 4);
    CHECK(st_find(f, name) == NULL);
    if (f->n == f->cap) {
        f->cap = f->cap ? 2 * f->cap : 16;
        f->tensors = xrealloc(f->tensors, (size_t)f->cap * sizeof(StTensor));
    }
    StTensor *t = &f->tensors[f->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dt;
    t->ndim = ndim;
    for (int d = 0; d < ndim; d++) {
        CHECK(shape[d] >= 0);
        t->shape[d] = shape[d];
    }
    t->nbytes = numel_of(ndim, shape) * dtype_size(dt);
    t->data = data;
}

static void refresh_meta_json(StFile *f) {
    if (f->meta_json) cJSON_free(f->meta_json);
    f->meta_json = f->meta ? cJSON_PrintUnformatted(f->meta) : NULL;
}

void st_set_meta(StFile *f, const char *key, const char *value) {
    if (!f->meta) f->meta = cJSON_CreateObject();
    cJSON *item = cJSON_CreateString(value);
    CHECK(item != NULL);
    if (cJSON_GetObjectItemCaseSensitive(f->meta, key))
        cJSON_ReplaceItemInObjectCaseSensitive(f->meta, key, item);
    else
        cJSON_AddItemToObject(f->meta, key, item);
    refresh_meta_json(f);
}

const char *st_meta(const StFile *f, const char *key) {
    if (!f->meta) return NULL;
    const cJSON *item = cJSON_GetObjectItemCaseSensitive((const cJSON *)f->meta, key);
    return cJSON_IsString(item) ? item->valuestring : NULL;
}

const StTensor *st_find(const StFile *f, const char *name) {
    for (int i = 0; i < f->n; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

void st_free(StFile *f) {
    free(f->tensors);
    if (f->meta_json) cJSON_free(f->meta_json);
    cJSON_Delete(f->meta);
    free(f->file_data);
    st_init(f);
}

// ---- writer ----

// Data order: larger element sizes first (stable), so with the 8-byte aligned data section
// every tensor starts at a multiple of its element size, as Hugging Face's writer arranges.
static int *data_order(const StFile *f) {
    int *order = xmalloc((size_t)(f->n ? f->n : 1) * sizeof(int));
    int k = 0;
    for (size_t size = 8; size >= 1; size /= 2)
        for (int i = 0; i < f->n; i++)
            if (dtype_size(f->tensors[i].dtype) == size) order[k++] = i;
    CHECK(k == f->n);
    return order;
}

static cJSON *raw_int(long long v) {
    char text[32];
    snprintf(text, sizeof text, "%lld", v);
    return cJSON_CreateRaw(text);
}

// The padded header (8-byte length + JSON + spaces), malloc'ed; *len receives its size.
static char *build_header(const StFile *f, const int *order, size_t *len) {
    cJSON *root = cJSON_CreateObject();
    if (f->meta) cJSON_AddItemToObject(root, "__metadata__", cJSON_Duplicate(f->meta, 1));
    size_t offset = 0;
    for (int k = 0; k < f->n; k++) {
        const StTensor *t = &f->tensors[order[k]];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "dtype", ST_NAMES[t->dtype]);
        cJSON *shape = cJSON_AddArrayToObject(e, "shape");
        for (int d = 0; d < t->ndim; d++) cJSON_AddItemToArray(shape, raw_int(t->shape[d]));
        cJSON *offs = cJSON_AddArrayToObject(e, "data_offsets");
        cJSON_AddItemToArray(offs, raw_int((long long)offset));
        cJSON_AddItemToArray(offs, raw_int((long long)(offset + t->nbytes)));
        offset += t->nbytes;
        cJSON_AddItemToObject(root, t->name, e);
    }
    char *json = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    CHECK(json != NULL);
    const size_t n = strlen(json), padded = (n + 7) / 8 * 8;
    char *hdr = xmalloc(8 + padded);
    for (int i = 0; i < 8; i++) hdr[i] = (char)(((uint64_t)padded >> (8 * i)) & 0xff);
    memcpy(hdr + 8, json, n);
    memset(hdr + 8 + n, ' ', padded - n);
    cJSON_free(json);
    *len = 8 + padded;
    return hdr;
}

static int write_all(int fd, const void *data, size_t len) {
    const char *p = data;
    while (len > 0) {
        ssize_t w = write(fd, p, len);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

// Streams header and tensors into "path.tmp.<pid>", fsyncs it and renames it over path (the
// streaming form of write_file_atomic: tensors are written from the caller's memory directly).
int st_write(const StFile *f, const char *path, char *err, size_t errlen) {
    return st_write_digest(f, path, NULL, err, errlen);
}

int st_write_digest(const StFile *f, const char *path, FileDigest *digest, char *err, size_t errlen) {
    int *order = data_order(f);
    size_t hlen;
    char *hdr = build_header(f, order, &hlen);
    Sha256 sha;
    if (digest) sha256_begin(&sha);
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    int rc = 0;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        rc = set_error(err, errlen, "cannot create '%s': %s", tmp, strerror(errno));
        goto done;
    }
    // The digest is taken on a second thread while the bytes go out (the same bytes in the same
    // order), so hashing adds nothing to the time of the writes.
    int bad = 0, e = 0;
#pragma omp parallel sections num_threads(2) if (digest)
    {
#pragma omp section
        {
            bad = write_all(fd, hdr, hlen);
            for (int k = 0; k < f->n && !bad; k++)
                bad = write_all(fd, f->tensors[order[k]].data, f->tensors[order[k]].nbytes);
            e = bad ? errno : 0;   // errno is the writing thread's
        }
#pragma omp section
        if (digest) {
            sha256_update(&sha, hdr, hlen);
            for (int k = 0; k < f->n; k++)
                sha256_update(&sha, f->tensors[order[k]].data, f->tensors[order[k]].nbytes);
        }
    }
    if (bad) {
        rc = set_error(err, errlen, "cannot write '%s': %s%s", tmp, strerror(e),
                    e == ENOSPC ? " (disk full: free space or write elsewhere)" : "");
    } else if (fsync(fd) != 0) {
        rc = set_error(err, errlen, "cannot flush '%s': %s", tmp, strerror(errno));
    }
    if (close(fd) != 0 && rc == 0) rc = set_error(err, errlen, "cannot close '%s': %s", tmp, strerror(errno));
    if (rc == 0 && rename(tmp, path) != 0)
        rc = set_error(err, errlen, "cannot rename '%s' to '%s': %s", tmp, path, strerror(errno));
    if (rc != 0) unlink(tmp);
done:
    if (digest) sha256_end(&sha, digest);
    free(hdr);
    free(order);
    return rc;
}

// ---- reader ----

// A non-negative integer JSON number (exact in a double).
static int json_uint(const cJSON *x, double *out) {
    if (!cJSON_IsNumber(x)) return 0;
    const double v = x->valuedouble;
    if (!(v >= 0 && v <= ST_MAX_JSON_INT) || v != floor(v)) return 0;
    *out = v;
    return 1;
}

static int parse_dtype(const char *s, DType *dt) {
    for (int i = 0; i < DTYPE_COUNT; i++)
        if (strcmp(s, ST_NAMES[i]) == 0) {
            *dt = (DType)i;
            return 1;
        }
    return 0;
}

// One header entry into t (data pointer still relative: begin offset stored in *begin).
static int parse_entry(const char *path, const cJSON *e, size_t data_size, StTensor *t, size_t *begin,
                       char *err, size_t errlen) {
    const char *name = e->string;
    if (strlen(name) >= sizeof t->name)
        return set_error(err, errlen, "%s: tensor name '%.40s...' is longer than %zu bytes", path, name,
                      sizeof t->name - 1);
    if (!cJSON_IsObject(e))
        return set_error(err, errlen, "%s: tensor '%s' must be an object with dtype, shape, data_offsets",
                      path, name);
    snprintf(t->name, sizeof t->name, "%s", name);
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dtype)) return set_error(err, errlen, "%s: tensor '%s' has no dtype string", path, name);
    if (!parse_dtype(dtype->valuestring, &t->dtype))
        return set_error(err, errlen, "%s: tensor '%s' has unknown dtype '%s' (supported: F32 BF16 F16 I32 I64 U8)",
                      path, name, dtype->valuestring);
    if (!cJSON_IsArray(shape)) return set_error(err, errlen, "%s: tensor '%s' has no shape array", path, name);
    t->ndim = cJSON_GetArraySize(shape);
    if (t->ndim > 4)
        return set_error(err, errlen, "%s: tensor '%s' has %d dimensions (at most 4 supported)", path, name, t->ndim);
    double numel = 1;
    for (int d = 0; d < t->ndim; d++) {
        double v;
        if (!json_uint(cJSON_GetArrayItem(shape, d), &v))
            return set_error(err, errlen, "%s: tensor '%s': shape[%d] is not a non-negative integer", path, name, d);
        t->shape[d] = (int64_t)v;
        numel *= v;
    }
    double b, en;
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 || !json_uint(cJSON_GetArrayItem(offs, 0), &b) ||
        !json_uint(cJSON_GetArrayItem(offs, 1), &en))
        return set_error(err, errlen, "%s: tensor '%s': data_offsets must be [begin, end] non-negative integers",
                      path, name);
    if (b > en) return set_error(err, errlen, "%s: tensor '%s': data_offsets begin %.0f > end %.0f", path, name, b, en);
    if (en > (double)data_size)
        return set_error(err, errlen, "%s: tensor '%s': data_offsets [%.0f, %.0f) out of range: the data section has "
                      "%zu bytes (file truncated?)", path, name, b, en, data_size);
    const double expect = numel * (double)dtype_size(t->dtype);
    if (expect != en - b)
        return set_error(err, errlen, "%s: tensor '%s': shape and dtype %s need %.0f bytes but data_offsets span %.0f",
                      path, name, dtype->valuestring, expect, en - b);
    t->nbytes = (size_t)(en - b);
    *begin = (size_t)b;
    return 0;
}

static int parse_meta(const char *path, StFile *f, const cJSON *m, char *err, size_t errlen) {
    if (!cJSON_IsObject(m)) return set_error(err, errlen, "%s: __metadata__ must be an object of strings", path);
    for (const cJSON *x = m->child; x; x = x->next)
        if (!cJSON_IsString(x))
            return set_error(err, errlen, "%s: __metadata__ value '%s' is not a string", path, x->string);
    f->meta = cJSON_Duplicate(m, 1);
    refresh_meta_json(f);
    return 0;
}

// Tensors must tile the data section: sorted by begin, each starts where the previous ended.
static int check_coverage(const char *path, const StFile *f, const size_t *begin, size_t data_size,
                          char *err, size_t errlen) {
    int *idx = xmalloc((size_t)(f->n ? f->n : 1) * sizeof(int));
    for (int i = 0; i < f->n; i++) {  // insertion sort by begin (headers hold few hundred entries)
        int j = i;
        while (j > 0 && begin[idx[j - 1]] > begin[i]) {
            idx[j] = idx[j - 1];
            j--;
        }
        idx[j] = i;
    }
    size_t pos = 0;
    int rc = 0, prev = -1;
    for (int k = 0; k < f->n && rc == 0; k++) {
        const int i = idx[k];
        if (begin[i] < pos)
            rc = set_error(err, errlen, "%s: tensors '%s' and '%s' overlap (data_offsets [%zu, ...) starts before %zu)",
                        path, f->tensors[prev].name, f->tensors[i].name, begin[i], pos);
        else if (begin[i] > pos)
            rc = set_error(err, errlen, "%s: bytes [%zu, %zu) of the data section belong to no tensor", path, pos,
                        begin[i]);
        pos = begin[i] + f->tensors[i].nbytes;
        prev = i;
    }
    if (rc == 0 && pos != data_size)
        rc = set_error(err, errlen, "%s: %zu bytes after the last tensor (data section %zu bytes, tensors end at %zu)",
                    path, data_size - pos, data_size, pos);
    free(idx);
    return rc;
}

static int parse_header(const char *path, StFile *f, const char *json, size_t data_size, char *err,
                        size_t errlen) {
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(json, &end, 1);
    if (!root) {
        const long at = end ? (long)(end - json) : 0;
        return set_error(err, errlen, "%s: bad JSON header near byte %ld: '%.20s'", path, at, end ? end : "");
    }
    int rc = 0;
    size_t *begin = NULL;
    if (!cJSON_IsObject(root)) {
        rc = set_error(err, errlen, "%s: the JSON header is not an object", path);
        goto done;
    }
    const int n = cJSON_GetArraySize(root);
    f->tensors = xcalloc((size_t)(n ? n : 1), sizeof(StTensor));
    f->cap = n;
    begin = xcalloc((size_t)(n ? n : 1), sizeof(size_t));
    for (const cJSON *e = root->child; e && rc == 0; e = e->next) {
        if (strcmp(e->string, "__metadata__") == 0) {
            rc = f->meta ? set_error(err, errlen, "%s: __metadata__ appears twice", path)
                         : parse_meta(path, f, e, err, errlen);
            continue;
        }
        if (st_find(f, e->string)) {
            rc = set_error(err, errlen, "%s: tensor '%s' appears twice in the header", path, e->string);
            break;
        }
        rc = parse_entry(path, e, data_size, &f->tensors[f->n], &begin[f->n], err, errlen);
        if (rc == 0) f->n++;
    }
    if (rc == 0) rc = check_coverage(path, f, begin, data_size, err, errlen);
    if (rc == 0) {
        const char *data = (const char *)f->file_data + (f->file_size - data_size);
        for (int i = 0; i < f->n; i++) f->tensors[i].data = data + begin[i];
    }
done:
    free(begin);
    cJSON_Delete(root);
    return rc;
}

int st_read_buffer(StFile *f, void *data, size_t size, const char *path, char *err, size_t errlen) {
    st_init(f);
    f->file_data = data;
    f->file_size = size;
    const unsigned char *b = f->file_data;
    int rc = 0;
    if (f->file_size < 8) {
        rc = set_error(err, errlen, "%s: truncated: %zu bytes, shorter than the 8-byte header length", path,
                    f->file_size);
        goto done;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | b[i];
    if (hlen > ST_MAX_HEADER) {
        rc = set_error(err, errlen, "%s: header length %llu exceeds %u bytes: not a safetensors file?", path,
                    (unsigned long long)hlen, ST_MAX_HEADER);
        goto done;
    }
    if (hlen > f->file_size - 8) {
        rc = set_error(err, errlen, "%s: truncated: the header needs %llu bytes but only %zu follow", path,
                    (unsigned long long)hlen, f->file_size - 8);
        goto done;
    }
    char *json = xmalloc(hlen + 1);
    memcpy(json, b + 8, hlen);
    json[hlen] = '\0';
    if (strlen(json) != hlen)
        rc = set_error(err, errlen, "%s: bad JSON header: it contains a NUL byte", path);
    else
        rc = parse_header(path, f, json, f->file_size - 8 - hlen, err, errlen);
    free(json);
done:
    if (rc != 0) st_free(f);
    return rc;
}

int st_read(StFile *f, const char *path, char *err, size_t errlen) {
    st_init(f);
    size_t size;
    char *data = read_file(path, &size, err, errlen);
    if (!data) return -1;
    return st_read_buffer(f, data, size, path, err, errlen);
}
