// digest: SHA-256 (OpenSSL's libcrypto) of files and buffers, as lowercase hex, for the
// checksums that checkpoints record of their files. Streaming (Sha256) for data written in
// pieces, one call for data in memory.
#pragma once
#include <stddef.h>
#include <stdint.h>

#define SHA256_HEX_LEN 64   // hex digits; buffers hold SHA256_HEX_LEN + 1 with the NUL

// What a checkpoint records of one of its files: the SHA-256 of its bytes and their count.
typedef struct {
    char sha256[SHA256_HEX_LEN + 1];
    uint64_t size;
} FileDigest;

typedef struct {
    void *ctx;        // EVP_MD_CTX
    uint64_t size;    // bytes hashed so far
} Sha256;

void sha256_begin(Sha256 *s);
void sha256_update(Sha256 *s, const void *data, size_t n);
// Ends the hash (and frees its state) into out.
void sha256_end(Sha256 *s, FileDigest *out);
// The digest of n bytes at data.
void sha256_buffer(const void *data, size_t n, FileDigest *out);
