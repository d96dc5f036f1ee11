// fuzz_safetensors: the safetensors reader (st_read_buffer: the header length, the JSON header,
// dtypes, shapes, offsets that must tile the data section, __metadata__). Input: a file.
// Promises: every tensor an accepted file lists lies inside the file and has the bytes its
// shape and dtype need; written back (st_write) and read again, the file gives the same
// tensors, bytes and metadata.
#include <cjson/cJSON.h>

#include "common/check.h"
#include "common/safetensors.h"
#include "tests/fuzz/fuzz.h"

static size_t numel(const StTensor *t) {
    size_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[ERR_LEN], path[256];
    uint8_t *copy = malloc(size ? size : 1);
    if (size) memcpy(copy, data, size);
    StFile f;
    if (st_read_buffer(&f, copy, size, "fuzz.safetensors", err, sizeof err) != 0) {   // owns copy
        FUZZ_ASSERT(err[0] != '\0');
        return 0;
    }
    const uint8_t *lo = f.file_data, *hi = lo + f.file_size;
    for (int i = 0; i < f.n; i++) {
        const StTensor *t = &f.tensors[i];
        const uint8_t *p = t->data;
        FUZZ_ASSERT(p >= lo && p <= hi && t->nbytes <= (size_t)(hi - p));
        FUZZ_ASSERT(t->nbytes == numel(t) * dtype_size(t->dtype));
        FUZZ_ASSERT(st_find(&f, t->name) == t);
    }
    StFile out;
    st_init(&out);
    for (int i = 0; i < f.n; i++)
        st_add(&out, f.tensors[i].name, f.tensors[i].dtype, f.tensors[i].ndim, f.tensors[i].shape,
               f.tensors[i].data);
    // The metadata: each key once, with the value st_meta gives (the first of duplicates).
    for (const cJSON *m = f.meta ? ((const cJSON *)f.meta)->child : NULL; m; m = m->next)
        if (!st_meta(&out, m->string)) st_set_meta(&out, m->string, st_meta(&f, m->string));
    FUZZ_ASSERT(st_write(&out, fuzz_scratch("st.safetensors", path, sizeof path), err, sizeof err) == 0);
    StFile back;
    FUZZ_ASSERT(st_read(&back, path, err, sizeof err) == 0);
    FUZZ_ASSERT(back.n == f.n);
    for (int i = 0; i < f.n; i++) {
        const StTensor *a = &f.tensors[i], *b = st_find(&back, a->name);
        FUZZ_ASSERT(b && b->dtype == a->dtype && b->ndim == a->ndim && b->nbytes == a->nbytes);
        FUZZ_ASSERT(memcmp(a->shape, b->shape, (size_t)a->ndim * sizeof a->shape[0]) == 0);
        FUZZ_ASSERT(a->nbytes == 0 || memcmp(a->data, b->data, a->nbytes) == 0);
    }
    for (const cJSON *m = f.meta ? ((const cJSON *)f.meta)->child : NULL; m; m = m->next)
        FUZZ_ASSERT(strcmp(st_meta(&back, m->string), st_meta(&f, m->string)) == 0);
    unlink(path);
    st_free(&back);
    st_free(&out);
    st_free(&f);
    return 0;
}
