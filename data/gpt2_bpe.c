// gpt2_bpe: GPT-2's byte-level BPE. Loading checks encoder.json and vocab.bpe against each other
// the way tiktoken's data_gym_to_mergeable_bpe_ranks does; encoding follows tiktoken's CoreBPE
// (whole pre-token lookup first, then merges by the rank of the concatenated bytes), so the ids
// are tiktoken's token for token.
#include "data/gpt2_bpe.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <omp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "common/check.h"

// GPT-2's pre-tokenizer regex, as released. \s is spelled \p{White_Space} because PCRE2's UCP
// \s leaves out U+0085 (NEL), which the Rust regex under tiktoken counts as whitespace.
#define WS "\\p{White_Space}"
static const char GPT2_PATTERN[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" WS
                                   "\\p{L}\\p{N}]+|" WS "+(?!\\P{White_Space})|" WS "+";
#undef WS

// Pre-tokens up to this many bytes merge with a linear scan per merge (tiktoken's loop, fastest
// for words); longer ones use a heap so a 1 MB run of digits or letters stays O(n log n).
#define BPE_LINEAR_MAX 128
// The per-call cache of merged pre-tokens is dropped when its arenas pass these sizes, which
// bounds memory on inputs with endless distinct pre-tokens (numbers, hashes).
#define CACHE_MAX_ENTRIES (1u << 20)
#define CACHE_MAX_BYTES (64u << 20)
// The parallel encoder gives each chunk at least this many bytes (smaller chunks cost more in
// thread start-up and lost cache hits than they gain).
#define PAR_MIN_CHUNK (256u << 10)

// ----------------------------------------------------------------------------------------------
// hashing and the two read-only maps (bytes -> id, (left id, right id) -> merged id)

static uint64_t hash_bytes(const unsigned char *p, size_t n) {
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

static uint64_t hash_u64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xFF51AFD7ED558CCDull;
    x ^= x >> 33;
    return x;
}

static size_t pow2_at_least(size_t n) {
    size_t p = 16;
    while (p < n) p <<= 1;
    return p;
}

// Open addressing, ids into the token arena; -1 = empty slot.
typedef struct {
    int32_t *slot;
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

static const unsigned char *tok_ptr(const Gpt2Bpe *t, int id, int *len) {
    *len = (int)(t->tok_off[id + 1] - t->tok_off[id]);
    return t->tok_bytes + t->tok_off[id];
}

static int vocab_find(const Gpt2Bpe *t, const unsigned char *p, size_t n) {
    size_t i = hash_bytes(p, n) & t->vocab.mask;
    for (;; i = (i + 1) & t->vocab.mask) {
        int id = t->vocab.slot[i];
        if (id < 0) return -1;
        int len;
        const unsigned char *q = tok_ptr(t, id, &len);
        if ((size_t)len == n && memcmp(p, q, n) == 0) return id;
    }
}

// Inserts id (its bytes are already in the arena); returns the id already holding the same
// bytes, or -1 when the insert happened.
static int vocab_insert(Gpt2Bpe *t, int id) {
    int len;
    const unsigned char *p = tok_ptr(t, id, &len);
    size_t i = hash_bytes(p, (size_t)len) & t->vocab.mask;
    for (;; i = (i + 1) & t->vocab.mask) {
        int other = t->vocab.slot[i];
        if (other < 0) {
            t->vocab.slot[i] = id;
            return -1;
        }
        int olen;
        const unsigned char *q = tok_ptr(t, other, &olen);
        if (olen == len && memcmp(p, q, (size_t)len) == 0) return other;
    }
}

static inline int pair_find(const PairMap *m, int left, int right) {
    uint64_t k = ((uint64_t)(uint32_t)left << 32 | (uint32_t)right) + 1;
    for (size_t i = hash_u64(k) & m->mask;; i = (i + 1) & m->mask) {
        if (m->key[i] == k) return m->val[i];
        if (m->key[i] == 0) return -1;
    }
}

static void pair_insert(PairMap *m, int left, int right, int merged) {
    uint64_t k = ((uint64_t)(uint32_t)left << 32 | (uint32_t)right) + 1;
    size_t i = hash_u64(k) & m->mask;
    while (m->key[i] != 0 && m->key[i] != k) i = (i + 1) & m->mask;
    m->key[i] = k;
    m->val[i] = merged;
}

// ----------------------------------------------------------------------------------------------
// loading

// GPT-2 spells bytes as printable characters: a byte that Python's str.isprintable() accepts
// (and that is not a space) stands for itself, the other 68 bytes become U+0100.. in byte order.
// The one-byte tokens get ids in that same order: printable bytes first, then the rest.
static int byte_is_printable(int b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b != 0xAD); }

static void byte_alphabet(int byte_of_cp[324], int rank_byte[256]) {
    int n = 0;
    for (int cp = 0; cp < 324; cp++) byte_of_cp[cp] = -1;
    for (int b = 0; b < 256; b++)
        if (byte_is_printable(b)) {
            byte_of_cp[b] = b;
            rank_byte[n++] = b;
        }
    for (int b = 0, extra = 0; b < 256; b++)
        if (!byte_is_printable(b)) {
            byte_of_cp[256 + extra++] = b;
            rank_byte[n++] = b;
        }
}

static void set_err(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || !errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static char *read_whole(const char *path, size_t *len, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        set_err(err, errlen, "%s: cannot open: %s (the GPT-2 tokenizer needs OpenAI's encoder.json "
                "and vocab.bpe)", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 20, n = 0, got;
    char *buf = xmalloc(cap);
    while ((got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (cap - n - 1 == 0) buf = xrealloc(buf, cap *= 2);
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        set_err(err, errlen, "%s: read error", path);
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

// Decodes a GPT-2 alphabet string (UTF-8) into raw bytes at out; returns the byte count, or -1
// for a character outside the alphabet or broken UTF-8.
static int alphabet_decode(const int byte_of_cp[324], const char *s, size_t n, unsigned char *out) {
    const unsigned char *p = (const unsigned char *)s;
    int k = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        if (p[i] < 0x80) {
            cp = p[i++];
        } else if ((p[i] & 0xE0) == 0xC0 && i + 1 < n && (p[i + 1] & 0xC0) == 0x80) {
            cp = (uint32_t)(p[i] & 0x1F) << 6 | (p[i + 1] & 0x3F);
            i += 2;
        } else {
            return -1;   // every alphabet character is below U+0144: one or two UTF-8 bytes
        }
        if (cp >= 324 || byte_of_cp[cp] < 0) return -1;
        out[k++] = (unsigned char)byte_of_cp[cp];
    }
    return k;
}

static void line_col(const char *text, size_t pos, int *line) {
    *line = 1;
    for (size_t i = 0; i < pos && text[i]; i++)
        if (text[i] == '\n') (*line)++;
}

// Fills tok_off/tok_bytes/vocab from encoder.json. n_expect is 256 + merges + 1 (from vocab.bpe).
static int load_encoder(Gpt2Bpe *t, const char *path, const char *vocab_path,
                        const int byte_of_cp[324], char *err, size_t errlen) {
    size_t len;
    char *text = read_whole(path, &len, err, errlen);
    if (!text) return -1;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    int rc = -1;
    if (!root) {
        int line;
        size_t pos = end ? (size_t)(end - text) : 0;
        line_col(text, pos, &line);
        set_err(err, errlen, "%s: malformed JSON at line %d (byte %zu)", path, line, pos);
        goto done;
    }
    if (!cJSON_IsObject(root)) {
        set_err(err, errlen, "%s: expected a JSON object token -> id", path);
        goto done;
    }
    int n = cJSON_GetArraySize(root);
    if (n != t->n_vocab) {
        set_err(err, errlen, "%s: has %d tokens but the %d merges of %s need %d (256 bytes + "
                "merges + <|endoftext|>): the two files do not belong together",
                path, n, t->n_vocab - 257, vocab_path, t->n_vocab);
        goto done;
    }
    // First pass: sizes, so that the arena is one allocation.
    char **key_of = xcalloc((size_t)n, sizeof(char *));
    size_t total = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, root) {
        double v = cJSON_IsNumber(it) ? it->valuedouble : -1;
        if (!cJSON_IsNumber(it) || v != (double)(int)v || v < 0 || v >= n) {
            set_err(err, errlen, "%s: token \"%s\" has id %s; ids must be integers in [0, %d)",
                    path, it->string, cJSON_IsNumber(it) ? "out of range" : "that is not a number",
                    n);
            free(key_of);
            goto done;
        }
        int id = (int)v;
        if (key_of[id]) {
            set_err(err, errlen, "%s: id %d is given to both \"%s\" and \"%s\"", path, id,
                    key_of[id], it->string);
            free(key_of);
            goto done;
        }
        key_of[id] = it->string;
        total += strlen(it->string);   // decoded bytes are never more than the UTF-8 bytes
    }
    if (strcmp(key_of[t->eot], "<|endoftext|>") != 0) {
        set_err(err, errlen, "%s: id %d (the last) must be \"<|endoftext|>\", found \"%s\"", path,
                t->eot, key_of[t->eot]);
        free(key_of);
        goto done;
    }
    t->tok_off = xmalloc(((size_t)n + 1) * sizeof(uint32_t));
    t->tok_bytes = xmalloc(total + 1);
    uint32_t off = 0;
    for (int id = 0; id < n; id++) {
        t->tok_off[id] = off;
        const char *k = key_of[id];
        int m = id == t->eot ? (int)strlen(k) : alphabet_decode(byte_of_cp, k, strlen(k),
                                                                t->tok_bytes + off);
        if (id == t->eot) memcpy(t->tok_bytes + off, k, (size_t)m);
        if (m <= 0) {
            set_err(err, errlen, "%s: token \"%s\" (id %d) is %s", path, k, id,
                    m == 0 ? "empty" : "not in GPT-2's byte alphabet");
            free(key_of);
            goto done;
        }
        off += (uint32_t)m;
    }
    t->tok_off[n] = off;
    t->vocab.mask = pow2_at_least(2 * (size_t)n) - 1;
    t->vocab.slot = xmalloc((t->vocab.mask + 1) * sizeof(int32_t));
    memset(t->vocab.slot, 0xFF, (t->vocab.mask + 1) * sizeof(int32_t));
    for (int id = 0; id < t->eot; id++) {
        int other = vocab_insert(t, id);
        if (other >= 0) {
            set_err(err, errlen, "%s: \"%s\" and \"%s\" (ids %d and %d) are the same bytes", path,
                    key_of[other], key_of[id], other, id);
            free(key_of);
            goto done;
        }
    }
    free(key_of);
    rc = 0;
done:
    cJSON_Delete(root);
    free(text);
    return rc;
}

// Counts the merge lines of vocab.bpe (after the '#version' line), checking the header.
static int count_merges(const char *path, const char *text, size_t len, char *err, size_t errlen) {
    if (len < 8 || memcmp(text, "#version", 8) != 0) {
        set_err(err, errlen, "%s:1: expected the '#version: 0.2' header of OpenAI's vocab.bpe",
                path);
        return -1;
    }
    int n = 0;
    const char *p = memchr(text, '\n', len), *end = text + len;
    while (p && p + 1 < end) {
        const char *q = memchr(p + 1, '\n', (size_t)(end - p - 1));
        if ((q ? q : end) > p + 1) n++;
        p = q;
    }
    return n;
}

// Checks every merge against encoder.json: merge i joins two tokens into the token of id 256 + i.
// Fills the byte tokens and the pair map (every split of a token into two tokens, as tiktoken
// merges by the rank of the concatenated bytes, not by the merge list).
static int check_merges(Gpt2Bpe *t, const char *path, const char *text, size_t len,
                        const int byte_of_cp[324], const int rank_byte[256], char *err,
                        size_t errlen) {
    for (int r = 0; r < 256; r++) {
        int m;
        const unsigned char *p = tok_ptr(t, r, &m);
        if (m != 1 || *p != rank_byte[r]) {
            set_err(err, errlen, "%s: id %d must be the one-byte token 0x%02X in GPT-2's order",
                    path, r, rank_byte[r]);
            return -1;
        }
        t->byte_token[rank_byte[r]] = r;
    }
    unsigned char *buf = xmalloc(len + 1);
    const char *line = memchr(text, '\n', len), *end = text + len;
    int lineno = 1, id = 256, rc = -1;
    while (line && line + 1 < end) {
        line++;
        lineno++;
        const char *eol = memchr(line, '\n', (size_t)(end - line));
        if (!eol) eol = end;
        if (eol == line) {
            line = eol < end ? eol : NULL;
            continue;
        }
        const char *sp = memchr(line, ' ', (size_t)(eol - line));
        int a = -1, b = -1, na = -1, nb = -1;
        if (sp && !memchr(sp + 1, ' ', (size_t)(eol - sp - 1))) {
            na = alphabet_decode(byte_of_cp, line, (size_t)(sp - line), buf);
            nb = na > 0 ? alphabet_decode(byte_of_cp, sp + 1, (size_t)(eol - sp - 1), buf + na) : -1;
        }
        if (na <= 0 || nb <= 0) {
            set_err(err, errlen, "%s:%d: expected two tokens in GPT-2's byte alphabet separated "
                    "by one space: \"%.*s\"", path, lineno, (int)(eol - line), line);
            goto done;
        }
        a = vocab_find(t, buf, (size_t)na);
        b = vocab_find(t, buf + na, (size_t)nb);
        int ab = vocab_find(t, buf, (size_t)(na + nb));
        if (a < 0 || b < 0) {
            set_err(err, errlen, "%s:%d: merge \"%.*s\" uses \"%.*s\", which is not a token of "
                    "encoder.json", path, lineno, (int)(eol - line), line,
                    a < 0 ? (int)(sp - line) : (int)(eol - sp - 1), a < 0 ? line : sp + 1);
            goto done;
        }
        if (ab < 0) {
            set_err(err, errlen, "%s:%d: merge \"%.*s\" makes a token that encoder.json does not "
                    "have: the merges and the vocabulary disagree", path, lineno,
                    (int)(eol - line), line);
            goto done;
        }
        if (ab != id) {
            set_err(err, errlen, "%s:%d: merge \"%.*s\" is number %d, so its token should have "
                    "id %d, but encoder.json gives it id %d: the merges and the vocabulary "
                    "disagree", path, lineno, (int)(eol - line), line, id - 256, id, ab);
            goto done;
        }
        id++;
        line = eol < end ? eol : NULL;
    }
    size_t n_pairs = 0;
    for (int tok = 256; tok < t->eot; tok++) n_pairs += t->tok_off[tok + 1] - t->tok_off[tok] - 1;
    t->pairs.mask = pow2_at_least(2 * n_pairs) - 1;
    t->pairs.key = xcalloc(t->pairs.mask + 1, sizeof(uint64_t));
    t->pairs.val = xmalloc((t->pairs.mask + 1) * sizeof(int32_t));
    for (int tok = 256; tok < t->eot; tok++) {
        int m;
        const unsigned char *p = tok_ptr(t, tok, &m);
        for (int k = 1; k < m; k++) {
            int l = vocab_find(t, p, (size_t)k), r = vocab_find(t, p + k, (size_t)(m - k));
            if (l >= 0 && r >= 0) pair_insert(&t->pairs, l, r, tok);
        }
    }
    rc = 0;
done:
    free(buf);
    return rc;
}

static int compile_pattern(Gpt2Bpe *t, char *err, size_t errlen) {
    int code;
    PCRE2_SIZE off;
    t->re = pcre2_compile((PCRE2_SPTR)GPT2_PATTERN, PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &code, &off, NULL);
    if (!t->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        set_err(err, errlen, "PCRE2 cannot compile GPT-2's pattern at offset %zu: %s (PCRE2 must "
                "be built with Unicode support)", (size_t)off, (const char *)msg);
        return -1;
    }
    t->jit = pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE) == 0;
    return 0;
}

Gpt2Bpe *gpt2_bpe_load(const char *encoder_json, const char *vocab_bpe, char *err, size_t errlen) {
    int byte_of_cp[324], rank_byte[256];
    byte_alphabet(byte_of_cp, rank_byte);
    size_t len;
    char *merges = read_whole(vocab_bpe, &len, err, errlen);
    if (!merges) return NULL;
    Gpt2Bpe *t = xcalloc(1, sizeof *t);
    int n_merges = count_merges(vocab_bpe, merges, len, err, errlen);
    if (n_merges < 0) goto fail;
    t->n_vocab = 256 + n_merges + 1;
    t->eot = t->n_vocab - 1;
    if (load_encoder(t, encoder_json, vocab_bpe, byte_of_cp, err, errlen) != 0) goto fail;
    if (check_merges(t, vocab_bpe, merges, len, byte_of_cp, rank_byte, err, errlen) != 0)
        goto fail;
    if (compile_pattern(t, err, errlen) != 0) goto fail;
    free(merges);
    return t;
fail:
    free(merges);
    gpt2_bpe_free(t);
    return NULL;
}

void gpt2_bpe_free(Gpt2Bpe *t) {
    if (!t) return;
    free(t->tok_off);
    free(t->tok_bytes);
    free(t->vocab.slot);
    free(t->pairs.key);
    free(t->pairs.val);
    if (t->re) pcre2_code_free(t->re);
    free(t);
}

int gpt2_bpe_vocab_size(const Gpt2Bpe *t) { return t->n_vocab; }
int gpt2_bpe_eot(const Gpt2Bpe *t) { return t->eot; }

const unsigned char *gpt2_bpe_token_bytes(const Gpt2Bpe *t, int id, int *len) {
    if (id < 0 || id >= t->n_vocab) return NULL;
    return tok_ptr(t, id, len);
}

// ----------------------------------------------------------------------------------------------
// invalid UTF-8 -> U+FFFD, exactly as Python's bytes.decode('utf-8', errors='replace')

// Length of the valid sequence at p (1-4), or 0 when invalid; *bad is then the number of bytes
// that one U+FFFD replaces (the maximal subpart: the lead byte and the continuation bytes that
// were still acceptable).
static int utf8_seq(const unsigned char *p, size_t n, int *bad) {
    unsigned c = p[0];
    if (c < 0x80) return 1;
    int need;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;   // no UTF-16 surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;   // nothing above U+10FFFF
    } else {
        *bad = 1;
        return 0;
    }
    for (int k = 1; k <= need; k++) {
        if ((size_t)k >= n || p[k] < lo || p[k] > hi) {
            *bad = k;
            return 0;
        }
        lo = 0x80;
        hi = 0xBF;
    }
    return need + 1;
}

// Returns text itself when it is valid UTF-8, else a malloc'd copy with replacements.
static const char *utf8_sanitize(const char *text, size_t len, size_t *out_len) {
    const unsigned char *p = (const unsigned char *)text;
    size_t i = 0;
    int bad;
    while (i < len) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        int k = utf8_seq(p + i, len - i, &bad);
        if (!k) break;
        i += (size_t)k;
    }
    *out_len = len;
    if (i == len) return text;
    char *out = xmalloc(i + 3 * (len - i) + 1);   // each bad byte grows to at most 3
    memcpy(out, text, i);
    size_t o = i;
    while (i < len) {
        int k = utf8_seq(p + i, len - i, &bad);
        if (k) {
            memcpy(out + o, p + i, (size_t)k);
            o += (size_t)k;
            i += (size_t)k;
        } else {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i += (size_t)bad;
        }
    }
    *out_len = o;
    return out;
}

// ----------------------------------------------------------------------------------------------
// merging one pre-token

typedef struct {
    int **ids;
    size_t *n, *cap;
} IdSink;

static void sink_push(IdSink *s, const int *v, size_t k) {
    if (*s->n + k > *s->cap) {
        size_t c = *s->cap ? *s->cap : 1024;
        while (c < *s->n + k) c *= 2;
        *s->ids = xrealloc(*s->ids, c * sizeof(int));
        *s->cap = c;
    }
    memcpy(*s->ids + *s->n, v, k * sizeof(int));
    *s->n += k;
}

// tiktoken's loop: start from bytes, repeatedly merge the leftmost adjacent pair of lowest rank.
// ids: (n) scratch in, merged ids out; rank: (n) scratch. Returns the number of ids.
static int merge_linear(const Gpt2Bpe *t, const unsigned char *p, int n, int *ids, int *rank) {
    for (int i = 0; i < n; i++) ids[i] = t->byte_token[p[i]];
    for (int i = 0; i + 1 < n; i++) {
        int r = pair_find(&t->pairs, ids[i], ids[i + 1]);
        rank[i] = r < 0 ? INT_MAX : r;
    }
    while (n > 1) {
        int best = 0;
        for (int i = 1; i + 1 < n; i++)
            if (rank[i] < rank[best]) best = i;
        if (rank[best] == INT_MAX) break;
        ids[best] = rank[best];
        memmove(ids + best + 1, ids + best + 2, (size_t)(n - best - 2) * sizeof(int));
        memmove(rank + best + 1, rank + best + 2, (size_t)(n - best - 2) * sizeof(int));
        n--;
        if (best + 1 < n) {
            int r = pair_find(&t->pairs, ids[best], ids[best + 1]);
            rank[best] = r < 0 ? INT_MAX : r;
        } else {
            rank[best] = INT_MAX;
        }
        if (best > 0) {
            int r = pair_find(&t->pairs, ids[best - 1], ids[best]);
            rank[best - 1] = r < 0 ? INT_MAX : r;
        }
    }
    return n;
}

// A candidate merge of node `left` with the node after it; stale once either node changed.
typedef struct {
    int rank, left, right;
    unsigned ver_left, ver_right;
} HeapItem;

static int heap_less(const HeapItem *a, const HeapItem *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static void heap_push(HeapItem *h, int *n, HeapItem x) {
    int i = (*n)++;
    while (i > 0 && heap_less(&x, &h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = x;
}

static HeapItem heap_pop(HeapItem *h, int *n) {
    HeapItem top = h[0], x = h[--(*n)];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && heap_less(&h[c + 1], &h[c])) c++;
        if (!heap_less(&h[c], &x)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0) h[i] = x;
    return top;
}

typedef struct {
    int *id, *next, *prev;
    unsigned *ver;
    HeapItem *heap;
} HeapScratch;

static void heap_offer(const Gpt2Bpe *t, HeapScratch *s, int *hn, int left, int right) {
    int r = pair_find(&t->pairs, s->id[left], s->id[right]);
    if (r >= 0) heap_push(s->heap, hn, (HeapItem){r, left, right, s->ver[left], s->ver[right]});
}

// The same merges as merge_linear in O(n log n): nodes are byte positions in a linked list,
// candidates sit in a heap ordered by (rank, position), which is the linear scan's choice.
static int merge_heap(const Gpt2Bpe *t, const unsigned char *p, int n, int *out) {
    HeapScratch s = {xmalloc((size_t)n * sizeof(int)), xmalloc((size_t)n * sizeof(int)),
                     xmalloc((size_t)n * sizeof(int)), xcalloc((size_t)n, sizeof(unsigned)),
                     xmalloc((size_t)n * 2 * sizeof(HeapItem))};
    int hn = 0;
    for (int i = 0; i < n; i++) {
        s.id[i] = t->byte_token[p[i]];
        s.next[i] = i + 1 < n ? i + 1 : -1;
        s.prev[i] = i - 1;
    }
    for (int i = 0; i + 1 < n; i++) heap_offer(t, &s, &hn, i, i + 1);
    while (hn > 0) {
        HeapItem c = heap_pop(s.heap, &hn);
        if (s.ver[c.left] != c.ver_left || s.next[c.left] != c.right || s.ver[c.right] != c.ver_right)
            continue;
        int l = c.left, r = c.right;
        s.id[l] = c.rank;
        s.ver[l]++;
        s.ver[r]++;   // r is gone: every candidate naming it is now stale
        s.next[l] = s.next[r];
        if (s.next[l] >= 0) {
            s.prev[s.next[l]] = l;
            heap_offer(t, &s, &hn, l, s.next[l]);
        }
        if (s.prev[l] >= 0) heap_offer(t, &s, &hn, s.prev[l], l);
    }
    int k = 0;
    for (int i = 0; i >= 0; i = s.next[i]) out[k++] = s.id[i];
    free(s.id);
    free(s.next);
    free(s.prev);
    free(s.ver);
    free(s.heap);
    return k;
}

// ----------------------------------------------------------------------------------------------
// per-call cache: pre-token bytes -> merged ids, for pre-tokens that are not one token

typedef struct {
    uint64_t hash;
    uint32_t key_off, key_len, ids_off, ids_len;
} CacheEntry;

typedef struct {
    CacheEntry *slot;   // hash 0 = empty
    size_t mask, count;
    unsigned char *keys;
    size_t keys_len, keys_cap;
    int *ids;
    size_t ids_len, ids_cap;
} Cache;

static void cache_free(Cache *c) {
    free(c->slot);
    free(c->keys);
    free(c->ids);
    memset(c, 0, sizeof *c);
}

static const CacheEntry *cache_find(const Cache *c, uint64_t h, const unsigned char *p, size_t n) {
    if (!c->slot) return NULL;
    for (size_t i = h & c->mask;; i = (i + 1) & c->mask) {
        const CacheEntry *e = &c->slot[i];
        if (e->hash == 0) return NULL;
        if (e->hash == h && e->key_len == n && memcmp(c->keys + e->key_off, p, n) == 0) return e;
    }
}

static void cache_put_slot(Cache *c, CacheEntry e) {
    size_t i = e.hash & c->mask;
    while (c->slot[i].hash != 0) i = (i + 1) & c->mask;
    c->slot[i] = e;
}

static void cache_insert(Cache *c, uint64_t h, const unsigned char *p, size_t n, const int *ids,
                         int k) {
    if (c->count >= CACHE_MAX_ENTRIES || c->keys_len + n > CACHE_MAX_BYTES) cache_free(c);
    if (!c->slot || 2 * (c->count + 1) > c->mask + 1) {
        size_t old = c->slot ? c->mask + 1 : 0;
        CacheEntry *prev = c->slot;
        c->mask = (old ? 2 * old : 4096) - 1;
        c->slot = xcalloc(c->mask + 1, sizeof(CacheEntry));
        for (size_t i = 0; i < old; i++)
            if (prev[i].hash) cache_put_slot(c, prev[i]);
        free(prev);
    }
    if (c->keys_len + n > c->keys_cap) {
        c->keys_cap = 2 * (c->keys_len + n) + 4096;
        c->keys = xrealloc(c->keys, c->keys_cap);
    }
    if (c->ids_len + (size_t)k > c->ids_cap) {
        c->ids_cap = 2 * (c->ids_len + (size_t)k) + 1024;
        c->ids = xrealloc(c->ids, c->ids_cap * sizeof(int));
    }
    memcpy(c->keys + c->keys_len, p, n);
    memcpy(c->ids + c->ids_len, ids, (size_t)k * sizeof(int));
    cache_put_slot(c, (CacheEntry){h, (uint32_t)c->keys_len, (uint32_t)n, (uint32_t)c->ids_len,
                                   (uint32_t)k});
    c->keys_len += n;
    c->ids_len += (size_t)k;
    c->count++;
}

// ----------------------------------------------------------------------------------------------
// encoding

typedef struct {
    Cache cache;
    int *scratch;   // (2 * scratch_cap) ids and ranks for one pre-token
    size_t scratch_cap;
    pcre2_match_data *md;
} EncodeState;

static void encode_piece(const Gpt2Bpe *t, EncodeState *st, const unsigned char *p, size_t n,
                         IdSink *out) {
    int id = vocab_find(t, p, n);
    if (id >= 0) {
        sink_push(out, &id, 1);
        return;
    }
    uint64_t h = hash_bytes(p, n) | 1;   // never 0, the empty-slot mark
    const CacheEntry *e = cache_find(&st->cache, h, p, n);
    if (e) {
        sink_push(out, st->cache.ids + e->ids_off, e->ids_len);
        return;
    }
    if (n > st->scratch_cap) {
        st->scratch_cap = 2 * n;
        st->scratch = xrealloc(st->scratch, 2 * st->scratch_cap * sizeof(int));
    }
    int k = n <= BPE_LINEAR_MAX
                ? merge_linear(t, p, (int)n, st->scratch, st->scratch + st->scratch_cap)
                : merge_heap(t, p, (int)n, st->scratch);
    sink_push(out, st->scratch, (size_t)k);
    cache_insert(&st->cache, h, p, n, st->scratch, k);
}

// Encodes valid UTF-8.
static void encode_valid(const Gpt2Bpe *t, EncodeState *st, const char *text, size_t len,
                         IdSink *out) {
    const unsigned char *s = (const unsigned char *)text;
    PCRE2_SIZE pos = 0;
    while (pos < len) {
        int rc = t->jit ? pcre2_jit_match(t->re, s, len, pos, PCRE2_NO_UTF_CHECK, st->md, NULL)
                        : pcre2_match(t->re, s, len, pos, PCRE2_NO_UTF_CHECK, st->md, NULL);
        // Every character is a letter, a number, whitespace or none of these, so some branch
        // matches at pos: a failure here is a PCRE2 resource error, not a property of the text.
        if (rc < 0) fatal(EXIT_RUNTIME, "gpt2_bpe: PCRE2 match failed at byte %zu (code %d)",
                          (size_t)pos, rc);
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(st->md);
        CHECK(ov[0] == pos && ov[1] > pos);
        encode_piece(t, st, s + ov[0], ov[1] - ov[0], out);
        pos = ov[1];
    }
}

static void encode_chunk(const Gpt2Bpe *t, const char *text, size_t len, IdSink *out) {
    size_t clean_len;
    const char *clean = utf8_sanitize(text, len, &clean_len);
    EncodeState st = {0};
    st.md = pcre2_match_data_create_from_pattern(t->re, NULL);
    if (!st.md) fatal(EXIT_RUNTIME, "gpt2_bpe: out of memory for PCRE2 match data");
    encode_valid(t, &st, clean, clean_len, out);
    pcre2_match_data_free(st.md);
    cache_free(&st.cache);
    free(st.scratch);
    if (clean != text) free((char *)clean);
}

int gpt2_bpe_encode(const Gpt2Bpe *t, const char *text, size_t len, int **ids, size_t *n,
                    size_t *cap) {
    IdSink out = {ids, n, cap};
    encode_chunk(t, text, len, &out);
    return 0;
}

// A place to cut where the pre-tokenizer always ends a match, whatever surrounds the cut: just
// after a '\n' that has a non-space ASCII character on both sides. The '\n' is then a match of
// its own (\s+(?!\S) fails, \s+ takes one character) and nothing on either side can reach over it.
static int is_cut_ascii(unsigned char c) { return c > 0x20 && c < 0x7F; }

static size_t next_cut(const char *text, size_t len, size_t from) {
    const unsigned char *s = (const unsigned char *)text;
    for (size_t i = from < 1 ? 1 : from; i + 1 < len; i++) {
        const unsigned char *nl = memchr(s + i, '\n', len - 1 - i);
        if (!nl) break;
        i = (size_t)(nl - s);
        if (is_cut_ascii(s[i - 1]) && is_cut_ascii(s[i + 1])) return i + 1;
    }
    return len;
}

int gpt2_bpe_encode_parallel(const Gpt2Bpe *t, const char *text, size_t len, int n_threads,
                             int **ids, size_t *n, size_t *cap) {
    if (n_threads <= 0) n_threads = omp_get_max_threads();
    size_t target = len / ((size_t)n_threads * 4);
    if (target < PAR_MIN_CHUNK) target = PAR_MIN_CHUNK;
    if (n_threads == 1 || len <= target) return gpt2_bpe_encode(t, text, len, ids, n, cap);
    size_t max_chunks = len / target + 2, n_chunks = 0;
    size_t *start = xmalloc((max_chunks + 1) * sizeof(size_t));
    for (size_t pos = 0; pos < len && n_chunks < max_chunks;) {
        start[n_chunks++] = pos;
        pos = n_chunks == max_chunks ? len : next_cut(text, len, pos + target);
    }
    start[n_chunks] = len;
    int **part = xcalloc(n_chunks, sizeof(int *));
    size_t *part_n = xcalloc(n_chunks, sizeof(size_t)), *part_cap = xcalloc(n_chunks, sizeof(size_t));
#pragma omp parallel for schedule(dynamic, 1) num_threads(n_threads)
    for (size_t c = 0; c < n_chunks; c++) {
        IdSink out = {&part[c], &part_n[c], &part_cap[c]};
        encode_chunk(t, text + start[c], start[c + 1] - start[c], &out);
    }
    for (size_t c = 0; c < n_chunks; c++) {
        IdSink out = {ids, n, cap};
        sink_push(&out, part[c], part_n[c]);
        free(part[c]);
    }
    free(part);
    free(part_n);
    free(part_cap);
    free(start);
    return 0;
}
