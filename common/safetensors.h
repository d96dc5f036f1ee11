// safetensors: reader and writer of the safetensors format (8-byte little-endian header length,
// a JSON header of {name: {dtype, shape, data_offsets}} plus optional "__metadata__", then the
// raw data). Used for checkpoints, the PyTorch oracle tests and the Hugging Face export.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "common/digest.h"
#include "common/dtype.h"

typedef struct {
    char name[128];
    DType dtype;
    int ndim;
    int64_t shape[4];
    size_t nbytes;
    const void *data;  // writer: caller's memory; reader: inside the loaded file
} StTensor;

typedef struct {
    StTensor *tensors;
    int n, cap;
    char *meta_json;       // "__metadata__" object as JSON text (string values only) or NULL
    void *meta;            // the same object parsed (cJSON *), behind st_meta; NULL when none
    void *file_data;       // reader: the whole file
    size_t file_size;
} StFile;

void st_init(StFile *f);
void st_add(StFile *f, const char *name, DType dt, int ndim, const int64_t *shape, const void *data);
void st_set_meta(StFile *f, const char *key, const char *value);
// Writes to path (through a temporary file, fsync, rename). Returns 0, or -1 with err set.
int st_write(const StFile *f, const char *path, char *err, size_t errlen);
// st_write that also hashes the bytes as they are written: *digest (not NULL) receives the
// file's SHA-256 and size.
int st_write_digest(const StFile *f, const char *path, FileDigest *digest, char *err, size_t errlen);
// Reads and validates path (header JSON, dtypes, offsets inside the file, sizes match shapes).
// Returns 0, or -1 with err naming the file and the problem.
int st_read(StFile *f, const char *path, char *err, size_t errlen);
// st_read of a file already in memory: takes ownership of data (size bytes, malloc'ed; freed by
// st_free, or here on failure); name is the file's name in messages.
int st_read_buffer(StFile *f, void *data, size_t size, const char *name, char *err, size_t errlen);
const StTensor *st_find(const StFile *f, const char *name);
const char *st_meta(const StFile *f, const char *key);   // NULL when absent
void st_free(StFile *f);
