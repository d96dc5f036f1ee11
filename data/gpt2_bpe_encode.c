// gpt2_bpe_encode: text -> ids. Invalid UTF-8 becomes U+FFFD, PCRE2 cuts the text into
// pre-tokens, and each pre-token is one token when the vocabulary has it, else merged the way
// tiktoken's CoreBPE merges (by the rank of the concatenated bytes, leftmost lowest first).
// Out of memory and PCRE2 failures come back as the entry points' -1 and message: the work
// stops at the first one (a cache that cannot grow is dropped instead, which only costs time).
#define _GNU_SOURCE   // memmem
#include <limits.h>
#include <stdarg.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "data/gpt2_bpe_impl.h"
#include "data/pretok_cut.h"
#include "data/utf8.h"

// Pre-tokens up to this many bytes merge with a linear scan per merge (tiktoken's loop, fastest
// for words) and are cached; longer ones use a heap so that a 1 MB run of digits or letters
// stays O(n log n), and are not cached (they rarely repeat).
#define BPE_LINEAR_MAX 128
// The cache is dropped when it passes these sizes, which bounds memory on inputs with endless
// distinct pre-tokens (numbers, hashes).
#define CACHE_MAX_ENTRIES (1u << 20)
#define CACHE_MAX_BYTES (64u << 20)
// Parallel work items hold at least this many bytes: smaller ones cost more in scheduling than
// they gain.
#define PAR_MIN_CHUNK (256u << 10)

// ----------------------------------------------------------------------------------------------
// invalid UTF-8 -> U+FFFD, exactly as Python's bytes.decode('utf-8', errors='replace')

// Returns text itself when it is valid UTF-8, else a malloc'd copy with replacements; NULL when
// there is no memory for the copy.
static const char *utf8_sanitize(const char *text, size_t len, size_t *out_len) {
    const unsigned char *p = (const unsigned char *)text;
    size_t i = 0;
    int bad;
    while (i < len) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        int k = utf8_char_len(text + i, len - i, &bad);
        if (k < 0) break;
        i += (size_t)k;
    }
    *out_len = len;
    if (i == len) return text;
    char *out = malloc(i + 3 * (len - i) + 1);   // each bad byte grows to at most 3
    if (!out) return NULL;
    memcpy(out, text, i);
    size_t o = i;
    while (i < len) {
        int k = utf8_char_len(text + i, len - i, &bad);
        if (k > 0) {
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
    int oom;   // an append found no memory: the ids stop there
} IdSink;

static void sink_push(IdSink *s, const int *v, size_t k) {
    if (s->oom) return;
    if (*s->n + k > *s->cap) {
        size_t c = *s->cap ? *s->cap : 1024;
        while (c < *s->n + k) c *= 2;
        int *grown = realloc(*s->ids, c * sizeof(int));
        if (!grown) {
            s->oom = 1;
            return;
        }
        *s->ids = grown;
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

// Min-heap of merge candidates, each packed as rank << 32 | position of its left node, so the
// smallest key is the linear scan's choice: lowest rank, then leftmost.
static void heap_push(uint64_t *h, size_t *n, uint64_t x) {
    size_t i = (*n)++;
    while (i > 0 && x < h[(i - 1) / 2]) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = x;
}

static uint64_t heap_pop(uint64_t *h, size_t *n) {
    uint64_t top = h[0], x = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && h[c + 1] < h[c]) c++;
        if (h[c] >= x) break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0) h[i] = x;
    return top;
}

typedef struct {
    int *id, *next, *prev;   // (n) linked list of the current tokens, indexed by first byte
    int *rank;               // (n) rank of the pair (node, next node); INT_MAX: none or dead
    uint64_t *heap;          // (2n) candidates; at most n-1 at the start and one more per merge
    size_t heap_n;
} HeapMerge;

// Recomputes the rank of the pair starting at node i and offers it to the heap.
static void heap_update(const Gpt2Bpe *t, HeapMerge *m, int i) {
    int r = m->next[i] < 0 ? -1 : pair_find(&t->pairs, m->id[i], m->id[m->next[i]]);
    m->rank[i] = r < 0 ? INT_MAX : r;
    if (r >= 0) heap_push(m->heap, &m->heap_n, (uint64_t)r << 32 | (uint32_t)i);
}

// The same merges as merge_linear in O(n log n). A candidate popped from the heap is stale when
// its rank is no longer the rank at its node; if it is equal, the pair there is a real candidate
// with exactly that key, so taking it is still the linear scan's choice. Returns -1 when there
// is no memory for its lists.
static int merge_heap(const Gpt2Bpe *t, const unsigned char *p, int n, int *out) {
    HeapMerge m = {malloc((size_t)n * sizeof(int)), malloc((size_t)n * sizeof(int)),
                   malloc((size_t)n * sizeof(int)), malloc((size_t)n * sizeof(int)),
                   malloc((size_t)n * 2 * sizeof(uint64_t)), 0};
    int k = -1;
    if (!m.id || !m.next || !m.prev || !m.rank || !m.heap) goto done;
    for (int i = 0; i < n; i++) {
        m.id[i] = t->byte_token[p[i]];
        m.next[i] = i + 1 < n ? i + 1 : -1;
        m.prev[i] = i - 1;
    }
    for (int i = 0; i < n; i++) heap_update(t, &m, i);
    while (m.heap_n > 0) {
        uint64_t c = heap_pop(m.heap, &m.heap_n);
        int l = (int)(uint32_t)c, rank = (int)(c >> 32);
        if (m.rank[l] != rank) continue;
        int r = m.next[l];
        m.id[l] = rank;
        m.rank[r] = INT_MAX;   // r is gone
        m.next[l] = m.next[r];
        if (m.next[l] >= 0) m.prev[m.next[l]] = l;
        heap_update(t, &m, l);
        if (m.prev[l] >= 0) heap_update(t, &m, m.prev[l]);
    }
    k = 0;
    for (int i = 0; i >= 0; i = m.next[i]) out[k++] = m.id[i];
done:
    free(m.id);
    free(m.next);
    free(m.prev);
    free(m.rank);
    free(m.heap);
    return k;
}

// ----------------------------------------------------------------------------------------------
// cache: pre-token bytes -> merged ids, for short pre-tokens that are not one token; one per
// thread and call

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

// Grows *buf (capacity *cap elements of size el) to hold need, with slack; 0 when there is no
// memory (then *buf is unchanged).
static int cache_grow(void **buf, size_t *cap, size_t need, size_t slack, size_t el) {
    if (need <= *cap) return 1;
    void *grown = realloc(*buf, (2 * need + slack) * el);
    if (!grown) return 0;
    *buf = grown;
    *cap = 2 * need + slack;
    return 1;
}

// Remembers the ids of pre-token p; with no memory to grow, the whole cache is dropped.
static void cache_insert(Cache *c, uint64_t h, const unsigned char *p, size_t n, const int *ids,
                         int k) {
    if (c->count >= CACHE_MAX_ENTRIES || c->keys_len + n > CACHE_MAX_BYTES) cache_free(c);
    if (!c->slot || 2 * (c->count + 1) > c->mask + 1) {
        size_t old = c->slot ? c->mask + 1 : 0;
        CacheEntry *prev = c->slot;
        c->mask = (old ? 2 * old : 256) - 1;
        c->slot = calloc(c->mask + 1, sizeof(CacheEntry));
        if (!c->slot) {
            c->slot = prev;
            cache_free(c);
            return;
        }
        for (size_t i = 0; i < old; i++)
            if (prev[i].hash) cache_put_slot(c, prev[i]);
        free(prev);
    }
    if (!cache_grow((void **)&c->keys, &c->keys_cap, c->keys_len + n, 4096, 1) ||
        !cache_grow((void **)&c->ids, &c->ids_cap, c->ids_len + (size_t)k, 1024, sizeof(int))) {
        cache_free(c);
        return;
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
    int ids[BPE_LINEAR_MAX], rank[BPE_LINEAR_MAX];   // (n) of one short pre-token
    pcre2_match_data *md;
    char err[192];   // the first failure's message
} EncodeState;

#define OOM_MESSAGE "gpt2_bpe: out of memory while encoding"

// st->err := the message; returns -1.
static int state_fail(EncodeState *st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int state_fail(EncodeState *st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(st->err, sizeof st->err, fmt, ap);
    va_end(ap);
    return -1;
}

static int state_init(const Gpt2Bpe *t, EncodeState *st) {
    memset(st, 0, sizeof *st);
    st->md = pcre2_match_data_create_from_pattern(t->re, NULL);
    return st->md ? 0 : state_fail(st, "gpt2_bpe: out of memory for PCRE2 match data");
}

static void state_free(EncodeState *st) {
    pcre2_match_data_free(st->md);
    cache_free(&st->cache);
}

// Appends the ids of pre-token p[0..n). Returns 0, or -1 with st->err.
static int encode_piece(const Gpt2Bpe *t, EncodeState *st, const unsigned char *p, size_t n,
                        IdSink *out) {
    uint64_t h = hash_bytes(p, n);
    int id = vocab_find_hashed(t, p, n, h);
    if (id >= 0) {
        sink_push(out, &id, 1);
        return 0;
    }
    if (n > BPE_LINEAR_MAX) {
        if (n >= INT_MAX) return state_fail(st, "gpt2_bpe: a pre-token of %zu bytes is too long", n);
        int *ids = malloc(n * sizeof(int));
        const int k = ids ? merge_heap(t, p, (int)n, ids) : -1;
        if (k >= 0) sink_push(out, ids, (size_t)k);
        free(ids);
        return k >= 0 ? 0 : state_fail(st, OOM_MESSAGE " a pre-token of %zu bytes", n);
    }
    h |= 1;   // never 0, the cache's empty-slot mark
    const CacheEntry *e = cache_find(&st->cache, h, p, n);
    if (e) {
        sink_push(out, st->cache.ids + e->ids_off, e->ids_len);
        return 0;
    }
    int k = merge_linear(t, p, (int)n, st->ids, st->rank);
    sink_push(out, st->ids, (size_t)k);
    cache_insert(&st->cache, h, p, n, st->ids, k);
    return 0;
}

// Encodes any bytes: invalid UTF-8 is replaced first, then every pre-token is encoded. Returns 0,
// or -1 with st->err.
static int encode_text(const Gpt2Bpe *t, EncodeState *st, const char *text, size_t len, IdSink *out) {
    size_t clean_len;
    const char *clean = utf8_sanitize(text, len, &clean_len);
    if (!clean) return state_fail(st, OOM_MESSAGE " %zu bytes with invalid UTF-8", len);
    const unsigned char *s = (const unsigned char *)clean;
    PCRE2_SIZE pos = 0;
    int rc = 0;
    while (pos < clean_len && rc == 0 && !out->oom) {
        const int m = t->jit ? pcre2_jit_match(t->re, s, clean_len, pos, PCRE2_NO_UTF_CHECK, st->md, NULL)
                             : pcre2_match(t->re, s, clean_len, pos, PCRE2_NO_UTF_CHECK, st->md, NULL);
        // Every character is a letter, a number, whitespace or none of these, so some branch
        // matches at pos: a failure here is a PCRE2 resource error, not a property of the text.
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(st->md);
        if (m < 0 || ov[0] != pos || ov[1] <= pos) {
            PCRE2_UCHAR msg[96] = "no match at the position";
            if (m < 0) pcre2_get_error_message(m, msg, sizeof msg);
            rc = state_fail(st, "gpt2_bpe: the PCRE2 pre-tokenizer failed at byte %zu: %s", (size_t)pos,
                            (const char *)msg);
            break;
        }
        rc = encode_piece(t, st, s + ov[0], ov[1] - ov[0], out);
        pos = ov[1];
    }
    if (clean != text) free((char *)clean);
    return rc == 0 && out->oom ? state_fail(st, OOM_MESSAGE ": no room for %zu more ids", *out->n) : rc;
}

// The entry points' result: 0, or -1 with st's message in err.
static int state_result(const EncodeState *st, int rc, char *err, size_t errlen) {
    if (rc != 0) snprintf(err, errlen, "%s", st->err);
    return rc;
}

int gpt2_bpe_encode(const Gpt2Bpe *t, const char *text, size_t len, int **ids, size_t *n, size_t *cap,
                    char *err, size_t errlen) {
    EncodeState st;
    int rc = state_init(t, &st);
    IdSink out = {ids, n, cap, 0};
    if (rc == 0) rc = encode_text(t, &st, text, len, &out);
    state_free(&st);
    return state_result(&st, rc, err, errlen);
}

// ----------------------------------------------------------------------------------------------
// parallel encoding: documents, and long stretches of text cut where the pre-tokenizer always
// splits, are encoded by OpenMP threads and the ids joined in order

// A place to cut where the pre-tokenizer always ends a match, whatever surrounds the cut: just
// after a lone '\n' between printable characters (data/pretok_cut.h).
static size_t next_cut(const char *text, size_t len, size_t from) {
    const unsigned char *s = (const unsigned char *)text;
    for (size_t i = from < 1 ? 1 : from; i + 1 < len; i++) {
        const unsigned char *nl = memchr(s + i, '\n', len - 1 - i);
        if (!nl) break;
        i = (size_t)(nl - s);
        if (pretok_newline_cut(s[i - 1], s[i + 1])) return i + 1;
    }
    return len;
}

// A stretch of text encoded on its own, after an <|endoftext|> when it starts a document.
typedef struct {
    size_t start, end;
    int eot_first;
} Segment;

typedef struct {
    Segment *seg;
    size_t n, cap;
} Segments;

// 0, or -1 when there is no memory for another segment.
static int segments_push(Segments *s, size_t start, size_t end, int eot_first) {
    if (s->n == s->cap) {
        Segment *grown = realloc(s->seg, (2 * s->cap + 64) * sizeof(Segment));
        if (!grown) return -1;
        s->seg = grown;
        s->cap = 2 * s->cap + 64;
    }
    s->seg[s->n++] = (Segment){start, end, eot_first};
    return 0;
}

// One document [start, end) as segments of about `target` bytes; -1 when out of memory.
static int segments_add_document(Segments *s, const char *text, size_t start, size_t end,
                                 size_t target, int eot_first) {
    size_t pos = start;
    do {
        size_t cut = end - pos > 2 * target ? pos + next_cut(text + pos, end - pos, target) : end;
        if (segments_push(s, pos, cut, eot_first && pos == start) != 0) return -1;
        pos = cut;
    } while (pos < end);
    return 0;
}

// Encodes the segments in order into out. Returns 0, or -1 with the first failure's message in err.
static int encode_segments(const Gpt2Bpe *t, const char *text, const Segments *segs,
                           size_t target, int n_threads, IdSink *out, char *err, size_t errlen) {
    // Work items: runs of whole segments of about target bytes; item w is segs [first[w], first[w+1]).
    size_t *first = malloc((segs->n + 1) * sizeof(size_t)), n_items = 0;
    int **part = calloc(segs->n + 1, sizeof(int *));
    size_t *part_n = calloc(segs->n + 1, sizeof(size_t));
    int failed = !first || !part || !part_n;
    if (failed) {
        snprintf(err, errlen, OOM_MESSAGE " %zu segments", segs->n);
        n_items = 0;
        goto done;
    }
    for (size_t i = 0, bytes = target; i < segs->n; i++) {
        if (bytes >= target) {
            first[n_items++] = i;
            bytes = 0;
        }
        bytes += segs->seg[i].end - segs->seg[i].start;
    }
    first[n_items] = segs->n;
    if (n_threads <= 0) n_threads = omp_get_max_threads();
    if ((size_t)n_threads > n_items) n_threads = (int)(n_items ? n_items : 1);
#pragma omp parallel num_threads(n_threads)
    {
        EncodeState st;   // per thread: its cache stays warm across the thread's items
        int rc = state_init(t, &st);
#pragma omp for schedule(dynamic, 1)
        for (size_t w = 0; w < n_items; w++) {
            // The sink works on locals: neighbouring items run on other threads, and their
            // counters in part_n[] share cache lines (false sharing on every id costs 4x).
            int *ids = NULL;
            size_t n = 0, cap = 0;
            IdSink sink = {&ids, &n, &cap, 0};
            for (size_t i = first[w]; i < first[w + 1] && rc == 0; i++) {
                const Segment *g = &segs->seg[i];
                if (g->eot_first) sink_push(&sink, &t->eot, 1);
                rc = encode_text(t, &st, text + g->start, g->end - g->start, &sink);
            }
            part[w] = ids;
            part_n[w] = n;
        }
        if (rc != 0) {
#pragma omp critical(gpt2_bpe_error)
            if (!failed) {
                failed = 1;
                snprintf(err, errlen, "%s", st.err);
            }
        }
        state_free(&st);
    }
    for (size_t w = 0; w < n_items && !failed; w++) sink_push(out, part[w], part_n[w]);
    if (!failed && out->oom) {
        failed = 1;
        snprintf(err, errlen, OOM_MESSAGE ": no room for %zu more ids", *out->n);
    }
done:
    for (size_t w = 0; part && w < n_items; w++) free(part[w]);
    free(part);
    free(part_n);
    free(first);
    return failed ? -1 : 0;
}

static size_t chunk_target(size_t len, int n_threads) {
    size_t threads = (size_t)(n_threads > 0 ? n_threads : omp_get_max_threads());
    size_t target = len / (threads * 4);   // a few items per thread evens out the load
    return target < PAR_MIN_CHUNK ? PAR_MIN_CHUNK : target;
}

// The segments' encoding into the caller's ids, or the failure to cut them.
static int encode_cut(const Gpt2Bpe *t, const char *text, Segments *segs, int cut_rc, size_t target,
                      int n_threads, int **ids, size_t *n, size_t *cap, char *err, size_t errlen) {
    IdSink out = {ids, n, cap, 0};
    int rc = cut_rc == 0 ? encode_segments(t, text, segs, target, n_threads, &out, err, errlen)
                         : set_error(err, errlen, OOM_MESSAGE ": no room to cut the text into segments");
    free(segs->seg);
    return rc;
}

int gpt2_bpe_encode_parallel(const Gpt2Bpe *t, const char *text, size_t len, int n_threads,
                             int **ids, size_t *n, size_t *cap, char *err, size_t errlen) {
    size_t target = chunk_target(len, n_threads);
    if (n_threads == 1 || len <= target) return gpt2_bpe_encode(t, text, len, ids, n, cap, err, errlen);
    Segments segs = {0};
    const int rc = segments_add_document(&segs, text, 0, len, target, 0);
    return encode_cut(t, text, &segs, rc, target, n_threads, ids, n, cap, err, errlen);
}

int gpt2_bpe_encode_documents(const Gpt2Bpe *t, const char *text, size_t len, const char *sep,
                              int n_threads, int **ids, size_t *n, size_t *cap, char *err,
                              size_t errlen) {
    size_t target = chunk_target(len, n_threads), sl = strlen(sep), start = 0;
    CHECK(sl > 0);
    Segments segs = {0};
    int rc = 0;
    while (rc == 0) {
        const char *hit = memmem(text + start, len - start, sep, sl);
        size_t end = hit ? (size_t)(hit - text) + sl : len;
        rc = segments_add_document(&segs, text, start, end, target, 1);
        if (!hit) break;
        start = end;
    }
    return encode_cut(t, text, &segs, rc, target, n_threads, ids, n, cap, err, errlen);
}
