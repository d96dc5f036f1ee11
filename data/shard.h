// shard: llm.c token shards. A header of 256 int32 ([0] magic, [1] version, [2] token count),
// then the tokens: magic 20240520 version 1 stores uint16 tokens, magic 20240801 version 7
// stores uint32 tokens (vocabularies over 65536). The reader memory-maps the file, so a shard set
// far larger than RAM can be read; the writer goes through a temporary file and a rename.
#pragma once
#include <stddef.h>
#include <stdint.h>

#define SHARD_HEADER_INTS 256
#define SHARD_MAGIC_U16 20240520
#define SHARD_VERSION_U16 1
#define SHARD_MAGIC_U32 20240801
#define SHARD_VERSION_U32 7

typedef enum { SHARD_U16 = 1, SHARD_U32 = 7 } ShardVersion;   // values are the header versions

typedef struct {
    char *path;                  // owned copy, for messages
    ShardVersion version;
    uint64_t n_tokens;
    void *map;                   // the whole file, read-only
    size_t map_len;
    const unsigned char *tokens; // (n_tokens,) uint16 or uint32 per version, inside map
} Shard;

// Maps and validates path: magic, version, file size against the token count, and (when
// vocab_size > 0) that every token is below vocab_size. Returns 0, or -1 with err naming the file
// (and the token offset of the first bad token).
int shard_open(Shard *s, const char *path, int vocab_size, char *err, size_t errlen);
void shard_close(Shard *s);
// Copies n tokens starting at token index start into out (as int); start + n <= n_tokens.
void shard_read(const Shard *s, uint64_t start, size_t n, int *out);
// The smallest version that holds every id below vocab_size.
ShardVersion shard_version_for_vocab(long vocab_size);
// Writes n tokens (each in [0, 65536) for SHARD_U16, non-negative for SHARD_U32) to path through
// a temporary file and rename. Returns 0, or -1 with err naming the file and the problem.
int shard_write(const char *path, const int *tokens, size_t n, ShardVersion version, char *err,
                size_t errlen);
