// gpt2_bpe_impl: what data/gpt2_bpe.c (loading) and data/gpt2_bpe_encode.c (encoding) share:
// the tokenizer struct and its two read-only lookups. Private to those two files.
#pragma once
#include <stdint.h>
#include <string.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "data/gpt2_bpe.h"

static inline uint64_t hash_bytes(const unsigned char *p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xFF51AFD7ED558CCDull);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xC4CEB9FE1A85EC53ull;
        h ^= h >> 29;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, n);
    h = (h ^ w) * 0xC4CEB9FE1A85EC53ull;
    h ^= h >> 32;
    return h;
}

static inline uint64_t hash_u64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xFF51AFD7ED558CCDull;
    x ^= x >> 33;
    return x;
}

// Open addressing. A slot holds the high 32 bits of the hash above the id, so that most
// mismatches are rejected without reading the token's bytes; VOCAB_EMPTY marks a free slot.
#define VOCAB_EMPTY UINT64_MAX
typedef struct {
    uint64_t *slot;
    size_t mask;
} BytesMap;

// Keys are (left << 32 | right) + 1 so that 0 marks an empty slot.
typedef struct {
    uint64_t *key;
    int32_t *val;   // merged token id, which is also the merge's rank
    size_t mask;
} PairMap;

struct Gpt2Bpe {
    int n_vocab;                 // 256 byte tokens + merges + <|endoftext|>
    int eot;                     // n_vocab - 1
    uint32_t *tok_off;           // (n_vocab + 1) offsets into tok_bytes
    unsigned char *tok_bytes;    // every token's bytes, back to back
    int32_t byte_token[256];     // id of the one-byte token of each byte value
    BytesMap vocab;              // mergeable tokens only: <|endoftext|> in text is plain text
    PairMap pairs;
    pcre2_code *re;
    int jit;                     // 1 when the pattern was JIT-compiled
};

static inline const unsigned char *tok_ptr(const Gpt2Bpe *t, int id, int *len) {
    *len = (int)(t->tok_off[id + 1] - t->tok_off[id]);
    return t->tok_bytes + t->tok_off[id];
}

// The id of the token with bytes p[0..n), or -1; h is hash_bytes(p, n).
static inline int vocab_find_hashed(const Gpt2Bpe *t, const unsigned char *p, size_t n,
                                    uint64_t h) {
    uint32_t tag = (uint32_t)(h >> 32);
    for (size_t i = h & t->vocab.mask;; i = (i + 1) & t->vocab.mask) {
        uint64_t s = t->vocab.slot[i];
        if (s == VOCAB_EMPTY) return -1;
        if ((uint32_t)(s >> 32) != tag) continue;
        int id = (int)(uint32_t)s, len;
        const unsigned char *q = tok_ptr(t, id, &len);
        if ((size_t)len == n && memcmp(p, q, n) == 0) return id;
    }
}

static inline int vocab_find(const Gpt2Bpe *t, const unsigned char *p, size_t n) {
    return vocab_find_hashed(t, p, n, hash_bytes(p, n));
}

static inline int pair_find(const PairMap *m, int left, int right) {
    uint64_t k = ((uint64_t)(uint32_t)left << 32 | (uint32_t)right) + 1;
    for (size_t i = hash_u64(k) & m->mask;; i = (i + 1) & m->mask) {
        if (m->key[i] == k) return m->val[i];
        if (m->key[i] == 0) return -1;
    }
}
