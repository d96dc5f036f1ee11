// gpt2_bpe: loading GPT-2's tokenizer files. encoder.json and vocab.bpe are checked against each
// other the way tiktoken's data_gym_to_mergeable_bpe_ranks does; encoding lives in
// gpt2_bpe_encode.c.
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/check.h"
#include "data/gpt2_bpe_impl.h"
#include "data/utf8.h"

// GPT-2's pre-tokenizer regex, as released. \s is spelled \p{White_Space}, which is what the Rust
// regex under tiktoken means by \s: PCRE2's own \s (with UCP) also takes U+180E, which Unicode
// has not counted as whitespace since 6.3. \p{L} and \p{N} follow PCRE2's Unicode tables (14.0 in
// Debian 12), which can class a character added later differently from tiktoken's; that changes
// no id in the contexts where tests/test_gpt2_bpe.py tries every code point (after and before
// letters and digits, after spaces).
#define WS "\\p{White_Space}"
static const char GPT2_PATTERN[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" WS
                                   "\\p{L}\\p{N}]+|" WS "+(?!\\P{White_Space})|" WS "+";
#undef WS

// ----------------------------------------------------------------------------------------------
// building the maps

static size_t pow2_at_least(size_t n) {
    size_t p = 16;
    while (p < n) p <<= 1;
    return p;
}

// Inserts id (its bytes are already in the arena); returns the id already holding the same
// bytes, or -1 when the insert happened.
static int vocab_insert(Gpt2Bpe *t, int id) {
    int len;
    const unsigned char *p = tok_ptr(t, id, &len);
    uint64_t h = hash_bytes(p, (size_t)len);
    int other = vocab_find_hashed(t, p, (size_t)len, h);
    if (other >= 0) return other;
    size_t i = h & t->vocab.mask;
    while (t->vocab.slot[i] != VOCAB_EMPTY) i = (i + 1) & t->vocab.mask;
    t->vocab.slot[i] = (h >> 32) << 32 | (uint32_t)id;
    return -1;
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
    char why[ERR_LEN];
    char *text = read_file(path, len, why, sizeof why);
    if (!text)
        set_err(err, errlen, "%s (the GPT-2 tokenizer needs OpenAI's encoder.json and vocab.bpe)", why);
    return text;
}

// Decodes a GPT-2 alphabet string (UTF-8) into raw bytes at out; returns the byte count, or -1
// for a character outside the alphabet (every one is below U+0144) or broken UTF-8.
static int alphabet_decode(const int byte_of_cp[324], const char *s, size_t n, unsigned char *out) {
    int k = 0;
    for (size_t i = 0; i < n;) {
        const int len = utf8_char_len(s + i, n - i, NULL);
        if (len < 0) return -1;
        const uint32_t cp = utf8_decode(s + i, len);
        i += (size_t)len;
        if (cp >= 324 || byte_of_cp[cp] < 0) return -1;
        out[k++] = (unsigned char)byte_of_cp[cp];
    }
    return k;
}

static int line_of(const char *text, size_t pos) {
    int line = 1;
    for (size_t i = 0; i < pos && text[i]; i++) line += text[i] == '\n';
    return line;
}

// Fills tok_off, tok_bytes and vocab from encoder.json, which must have t->n_vocab tokens (the
// count that vocab.bpe implies).
static int load_encoder(Gpt2Bpe *t, const char *text, size_t len, const char *path,
                        const char *vocab_path, const int byte_of_cp[324], char *err,
                        size_t errlen) {
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    int rc = -1;
    if (!root) {
        size_t pos = end ? (size_t)(end - text) : 0;
        set_err(err, errlen, "%s: malformed JSON at line %d (byte %zu)", path, line_of(text, pos),
                pos);
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
        if (!cJSON_IsNumber(it) || v < 0 || v >= n || v != (double)(int)v) {   // range first
            if (cJSON_IsNumber(it))
                set_err(err, errlen, "%s: token \"%s\" has id %g; ids must be integers in [0, %d)",
                        path, it->string, v, n);
            else
                set_err(err, errlen, "%s: token \"%s\" has an id that is not a number", path,
                        it->string);
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
    t->vocab.slot = xmalloc((t->vocab.mask + 1) * sizeof(uint64_t));
    for (size_t i = 0; i <= t->vocab.mask; i++) t->vocab.slot[i] = VOCAB_EMPTY;
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

Gpt2Bpe *gpt2_bpe_load_buffers(const char *encoder, size_t encoder_len, const char *encoder_name,
                               const char *merges, size_t merges_len, const char *merges_name,
                               char *err, size_t errlen) {
    int byte_of_cp[324], rank_byte[256];
    byte_alphabet(byte_of_cp, rank_byte);
    Gpt2Bpe *t = xcalloc(1, sizeof *t);
    int n_merges = count_merges(merges_name, merges, merges_len, err, errlen);
    if (n_merges < 0) goto fail;
    t->n_vocab = 256 + n_merges + 1;
    t->eot = t->n_vocab - 1;
    if (load_encoder(t, encoder, encoder_len, encoder_name, merges_name, byte_of_cp, err, errlen) != 0)
        goto fail;
    if (check_merges(t, merges_name, merges, merges_len, byte_of_cp, rank_byte, err, errlen) != 0)
        goto fail;
    if (compile_pattern(t, err, errlen) != 0) goto fail;
    return t;
fail:
    gpt2_bpe_free(t);
    return NULL;
}

Gpt2Bpe *gpt2_bpe_load(const char *encoder_json, const char *vocab_bpe, char *err, size_t errlen) {
    size_t merges_len, encoder_len;
    char *merges = read_whole(vocab_bpe, &merges_len, err, errlen);
    if (!merges) return NULL;
    char *encoder = read_whole(encoder_json, &encoder_len, err, errlen);
    Gpt2Bpe *t = encoder ? gpt2_bpe_load_buffers(encoder, encoder_len, encoder_json, merges, merges_len,
                                                 vocab_bpe, err, errlen)
                         : NULL;
    free(encoder);
    free(merges);
    return t;
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

#define GPT2_URL "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main"
#define GPT2_DIR_ENV "FLASHGPT_GPT2_DIR"

// GPT-2's files sit in $FLASHGPT_GPT2_DIR when that is set, else in data_cache/gpt2/ (where
// scripts/fetch_data.sh puts them).
static const char *default_gpt2_file(const char *name, char *buf, size_t n) {
    const char *dir = getenv(GPT2_DIR_ENV);
    snprintf(buf, n, "%s/%s", dir && *dir ? dir : "data_cache/gpt2", name);
    return buf;
}

Gpt2Bpe *gpt2_bpe_load_default(const char *encoder_json, const char *vocab_bpe, char *err, size_t errlen) {
    char enc_buf[1024], bpe_buf[1024], inner[1024];
    const char *enc = encoder_json ? encoder_json : default_gpt2_file("encoder.json", enc_buf, sizeof enc_buf);
    const char *bpe = vocab_bpe ? vocab_bpe : default_gpt2_file("vocab.bpe", bpe_buf, sizeof bpe_buf);
    Gpt2Bpe *t = gpt2_bpe_load(enc, bpe, inner, sizeof inner);
    if (!t)
        set_error(err, errlen, "%s\nRun scripts/fetch_data.sh, which puts GPT-2's files into data_cache/gpt2/ (or "
                               "set " GPT2_DIR_ENV " to their directory, or pass their paths); "
                               "their public source:\n"
                               "  %s/encoder.json\n  %s/vocab.bpe", inner, GPT2_URL, GPT2_URL);
    return t;
}
