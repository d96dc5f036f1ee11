// byte_source: the bytes of one prepare input, a file or standard input ("-"), decompressed on
// the fly when it starts with gzip's or zstd's magic bytes (whatever the file's name).
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "data/inflate.h"

typedef struct ByteSource ByteSource;   // opaque

// Opens path ("-": standard input) and reads its first bytes to pick the codec. NULL with err
// naming the path on a missing or unreadable file, or a compression it cannot read (xz, bzip2).
ByteSource *byte_source_open(const char *path, char *err, size_t errlen);
void byte_source_close(ByteSource *s);
// Reads up to cap decompressed bytes into buf: the count (> 0), 0 at the end, or -1 with err
// (a read error, corrupt or truncated compressed data).
long byte_source_read(ByteSource *s, char *buf, size_t cap, char *err, size_t errlen);
// Passes over the next n decompressed bytes (a seek for a plain file); -1 with err when the
// input ends first.
int byte_source_skip(ByteSource *s, uint64_t n, char *err, size_t errlen);
// Bytes taken from the file itself so far (compressed bytes for gzip and zstd): progress.
uint64_t byte_source_consumed(const ByteSource *s);
Codec byte_source_codec(const ByteSource *s);
