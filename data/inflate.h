// inflate: gzip and zstd decompression behind one streaming interface (zlib, libzstd), for the
// readers of prepare's inputs. Concatenated gzip members and zstd frames are read as one stream,
// as gzip -dc and zstd -dc read them.
#pragma once
#include <stddef.h>

typedef enum { CODEC_PLAIN = 0, CODEC_GZIP, CODEC_ZSTD } Codec;

typedef struct Inflater Inflater;   // opaque

// The codec whose magic bytes start `head` (n bytes, n >= 4 unless the file is shorter); formats
// it knows but cannot read (xz, bzip2) set *unsupported to their name.
Codec inflate_detect(const unsigned char *head, size_t n, const char **unsupported);
const char *inflate_codec_name(Codec c);
// NULL with err when the library cannot start (out of memory).
Inflater *inflater_create(Codec c, char *err, size_t errlen);
void inflater_free(Inflater *z);
// Decompresses from in[*pos, len) into out[0, cap); advances *pos over what it consumed and
// returns the bytes written (0 when it needs more input), or -1 with err on corrupt data.
long inflater_run(Inflater *z, const unsigned char *in, size_t len, size_t *pos, char *out, size_t cap,
                  char *err, size_t errlen);
// Whether the data so far ends at the end of a gzip member or zstd frame: the file may end here
// (anywhere else it was cut short).
int inflater_at_end(const Inflater *z);
