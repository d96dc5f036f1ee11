// prepare's streaming pieces: the JSONL reader (every kind of odd line), the segmenter's cuts
// (GPT-2's ids of the segments one after the other equal the whole text's, for random tricky
// text and tiny targets, whatever the pieces the text arrives in), gzip and zstd readers
// (multi-member, multi-frame, truncated, corrupt), many short documents encoded by the threads,
// the document stream (separators across read windows, seeking back to a piece) and the shard
// writer (nothing under the final name before the commit; the result opens with shard_open).
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include "data/byte_source.h"
#include "data/doc_stream.h"
#include "data/gpt2_bpe.h"
#include "data/jsonl.h"
#include "data/segment_encode.h"
#include "data/segmenter.h"
#include "data/shard.h"
#include "data/shard_out.h"
#include "tests/testlib.h"

typedef struct {
    char dir[64];
} Tmp;

static void path_in(const Tmp *t, char *out, const char *name) { snprintf(out, 512, "%s/%s", t->dir, name); }

static void write_raw(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    fwrite(data, 1, n, f);
    fclose(f);
}

// ---------------------------------------------------------------------------------------------
// JSONL

static void expect_text(const char *line, const char *field, const char *want, size_t want_len) {
    ByteBuf out = {0};
    char err[256] = "";
    JsonlResult r = jsonl_field_text(line, strlen(line), field, &out, err, sizeof err);
    EXPECT(r == JSONL_TEXT && out.len == want_len &&
               (want_len == 0 || memcmp(out.p, want, want_len) == 0), "%s -> %d %s", line, r, err);
    bytebuf_free(&out);
}

static void expect_bad(const char *line, size_t len, const char *message) {
    ByteBuf out = {0};
    char err[256] = "";
    JsonlResult r = jsonl_field_text(line, len, "text", &out, err, sizeof err);
    EXPECT(r == JSONL_BAD && strstr(err, message), "%.*s -> %d '%s' (wanted '%s')", (int)len, line, r, err, message);
    bytebuf_free(&out);
}

static void test_jsonl(void) {
    expect_text("{\"text\": \"hello\"}", "text", "hello", 5);
    expect_text(" {\"id\":1,\"text\":\"a\\\"b\\\\c\\/d\\n\\t\\r\\b\\f\"} \r", "text", "a\"b\\c/d\n\t\r\b\f", 12);
    expect_text("{\"text\":\"caf\\u00e9 \\ud83d\\ude00\"}", "text", "caf\xc3\xa9 \xf0\x9f\x98\x80", 10);
    expect_text("{\"text\":\"nul\\u0000end\"}", "text", "nul\0end", 7);   // a NUL inside the text stays
    expect_text("{\"text\":\"raw \xe6\x97\xa5\"}", "text", "raw \xe6\x97\xa5", 7);
    expect_text("{\"meta\":{\"text\":\"inner\",\"a\":[1,-2.5e+3,true,false,null,{}]},\"text\":\"outer\"}", "text", "outer", 5);
    expect_text("{\"text\":\"first\",\"text\":\"last\"}", "text", "last", 4);   // as Python's json
    expect_text("{\"te\\u0078t\":\"escaped key\"}", "text", "escaped key", 11);
    expect_text("{\"body\":\"x\",\"text\":\"\"}", "text", "", 0);
    expect_text("{\"content\":\"other field\"}", "content", "other field", 11);
    ByteBuf out = {0};
    char err[256];
    EXPECT(jsonl_field_text("", 0, "text", &out, err, sizeof err) == JSONL_BLANK, "empty line");
    EXPECT(jsonl_field_text(" \t\r", 3, "text", &out, err, sizeof err) == JSONL_BLANK, "blank line");
    bytebuf_free(&out);
    // Each line with the words its message must hold; lengths from sizeof (a line may hold NUL).
#define BAD_LINE(s, msg) {s, sizeof(s) - 1, msg}
    static const struct {
        const char *line;
        size_t len;
        const char *message;
    } bad[] = {
        BAD_LINE("{\"text\": 5}", "is a number, not a string"),
        BAD_LINE("{\"text\": null}", "is null, not a string"),
        BAD_LINE("{\"text\": {\"a\": 1}}", "is an object"),
        BAD_LINE("{\"text\": \"a\", \"text\": [1]}", "is an array"),   // the last one counts
        BAD_LINE("{\"id\": 1}", "no field \"text\""),
        BAD_LINE("[1, 2]", "not a JSON object"),
        BAD_LINE("{\"text\": \"cut", "unterminated string"),
        BAD_LINE("{\"text\": \"a\"", "expected ',' or '}'"),
        BAD_LINE("{\"text\": \"a\"} x", "after the end of the object"),
        BAD_LINE("{\"text\": \"bad \xff\"}", "invalid UTF-8 at byte 15"),
        BAD_LINE("{\"text\": \"\xc0\xaf\"}", "invalid UTF-8"),   // overlong
        BAD_LINE("{\"text\": \"\\ud800\"}", "without its low half"),
        BAD_LINE("{\"text\": \"\\udc00\"}", "lone low surrogate"),
        BAD_LINE("{\"text\": \"\\x41\"}", "unknown escape"),
        BAD_LINE("{\"text\": \"\\u12G4\"}", "4 hex digits"),
        BAD_LINE("{\"text\": \"tab\there\"}", "control character"),
        BAD_LINE("{\"text\": 01}", "expected ',' or '}'"),
        BAD_LINE("{\"text\": -}", "malformed number"),
        BAD_LINE("{\"text\": tru}", "unknown literal"),
        BAD_LINE("{text: \"a\"}", "member name in double quotes"),
    };
#undef BAD_LINE
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) expect_bad(bad[i].line, bad[i].len, bad[i].message);
    char deep[2100];
    int k = 0;
    k += snprintf(deep + k, sizeof deep - k, "{\"a\":");
    for (int i = 0; i < 1000; i++) deep[k++] = '[';
    deep[k] = '\0';
    expect_bad(deep, strlen(deep), "nested deeper");
}

// ---------------------------------------------------------------------------------------------
// segmenter

// Random text from pieces that stress GPT-2's pre-tokenizer at every boundary: contractions,
// runs of spaces and newlines, digits, punctuation, non-ASCII letters, emoji, invalid bytes.
static size_t tricky_text(char *out, size_t cap, unsigned seed) {
    static const char *parts[] = {"a", "bc", "Z", " ", "  ", "   ", "\n", "\n\n", "\t", "\r\n", "'", "'s", "'re",
                                  "'ll", "1", "23", "456", ".", ",", "!?", "--", "_", "(", ")", "\xc3\xa9",
                                  "\xe6\x97\xa5\xe6\x9c\xac", "\xf0\x9f\x98\x80", "\xff", "\xe2\x82", " the",
                                  " don't", "  x", "\u00a0", "\xe3\x80\x80"};
    const size_t n_parts = sizeof parts / sizeof *parts;
    size_t n = 0;
    srand(seed);
    while (n + 8 < cap) {
        const char *p = parts[(size_t)rand() % n_parts];
        memcpy(out + n, p, strlen(p));
        n += strlen(p);
    }
    return n;
}

// Segments of text fed as pieces of piece_len bytes (one document); returns the count.
static size_t segment(const char *text, size_t len, size_t piece_len, size_t target, size_t max, Batch *b) {
    SegmenterParams p = {target, max, DOCS_TEXT};
    batch_init(b, &p);
    for (size_t off = 0; off < len; off += piece_len) {
        size_t k = len - off < piece_len ? len - off : piece_len;
        DocPiece piece = {text + off, k, off == 0, off + k == len, 0, {0, off, 0, 0, 0}, off};
        batch_add(b, &piece);
    }
    return b->n;
}

static Gpt2Bpe *load_gpt2(void) {
    char err[2048];
    Gpt2Bpe *t = gpt2_bpe_load_default(NULL, NULL, err, sizeof err);
    if (!t && system("bash scripts/fetch_data.sh") == 0) t = gpt2_bpe_load_default(NULL, NULL, err, sizeof err);
    EXPECT(t != NULL, "GPT-2's files (scripts/fetch_data.sh): %s", err);
    return t;
}

static void test_segment_cuts_exact(const Gpt2Bpe *bpe) {
    static char text[6000];
    for (unsigned seed = 1; seed <= 40; seed++) {
        size_t len = tricky_text(text, sizeof text, seed);
        int *whole = NULL, *joined = NULL;
        size_t nw = 0, cw = 0, nj = 0, cj = 0;
        gpt2_bpe_encode(bpe, text, len, &whole, &nw, &cw, NULL, 0);
        size_t target = 2 + seed % 7;
        Batch b;
        size_t n_seg = segment(text, len, 1 + seed % 13, target, 1u << 20, &b);
        size_t covered = 0;
        int starts_ok = 1;
        for (size_t i = 0; i < b.n; i++) {
            starts_ok &= b.seg[i].start == covered && b.seg[i].pos.offset == covered && !b.seg[i].hard_cut;
            covered += b.seg[i].len;
            gpt2_bpe_encode(bpe, b.text.p + b.seg[i].start, b.seg[i].len, &joined, &nj, &cj, NULL, 0);
        }
        EXPECT(n_seg > len / 40 && covered == len && starts_ok, "seed %u: %zu segments cover %zu of %zu bytes", seed,
               n_seg, covered, len);
        EXPECT(nj == nw && memcmp(joined, whole, nw * sizeof(int)) == 0,
               "seed %u target %zu: %zu segments give %zu ids, the whole text %zu", seed, target, n_seg, nj, nw);
        Batch other;   // the same cuts whatever the pieces
        segment(text, len, len, target, 1u << 20, &other);
        int same = other.n == b.n;
        for (size_t i = 0; same && i < b.n; i++) same = other.seg[i].start == b.seg[i].start && other.seg[i].len == b.seg[i].len;
        EXPECT(same, "seed %u: the cuts depend on how the text was fed", seed);
        batch_free(&other);
        batch_free(&b);
        free(whole);
        free(joined);
    }
}

// Many short documents in one batch, spread over the threads, give each document's own ids
// after its <|endoftext|>, in order.
static void test_documents_encode_apart(const Gpt2Bpe *bpe) {
    static char pool[20000];
    size_t pool_len = tricky_text(pool, sizeof pool, 77);
    SegmenterParams p = {1u << 20, 4u << 20, DOCS_JSONL};
    Batch b;
    batch_init(&b, &p);
    int *want = NULL;
    size_t nw = 0, cw = 0, off = 0;
    srand(5);
    for (int d = 0; d < 400 && off + 80 < pool_len; d++) {
        size_t len = 1 + (size_t)rand() % 60;
        DocPiece piece = {pool + off, len, 1, 1, 0, {0, off, 0, 0, (uint64_t)d + 1}, 0};
        batch_add(&b, &piece);
        if (nw == cw) want = realloc(want, (cw = 2 * cw + 1024) * sizeof(int));
        want[nw++] = GPT2_EOT;
        gpt2_bpe_encode(bpe, pool + off, len, &want, &nw, &cw, NULL, 0);
        off += len;
    }
    SegmentEncoder e = {bpe, NULL, GPT2_EOT, 2};
    IdBuf ids = {0};
    size_t *counts = calloc(b.n, sizeof(size_t)), total = 0;
    char err[256];
    EXPECT(segments_encode(&e, b.text.p, b.seg, b.n, &ids, counts, err, sizeof err) == 0, "%s", err);
    for (size_t i = 0; i < b.n; i++) total += counts[i];
    EXPECT(ids.n == nw && total == nw && memcmp(ids.p, want, nw * sizeof(int)) == 0, "%zu documents: %zu ids, want %zu",
           b.n, ids.n, nw);
    free(counts);
    free(ids.p);
    free(want);
    batch_free(&b);
}

static void test_segment_hard_cut(void) {
    char text[100];
    for (int i = 0; i < 33; i++) memcpy(text + 3 * i, "\xe6\x97\xa5", 3);   // no safe cut anywhere
    Batch b;
    segment(text, 99, 7, 4, 16, &b);
    int ok = b.n > 5;
    for (size_t i = 0; i < b.n; i++) ok &= b.seg[i].hard_cut == (i + 1 < b.n) && b.seg[i].len <= 16 && b.seg[i].len % 3 == 0;
    EXPECT(ok, "hard cuts land on character boundaries, at most max bytes apart (%zu segments)", b.n);
    batch_free(&b);
    SegmenterParams p = {4, 1000, DOCS_JSONL};   // documents close segments; positions advance in the text
    batch_init(&b, &p);
    DocPiece d1 = {"a b", 3, 1, 1, 0, {0, 100, 0, 0, 7}, 0}, d2 = {"cd.ef gh", 8, 1, 1, 0, {0, 200, 0, 0, 8}, 0};
    batch_add(&b, &d1);
    batch_add(&b, &d2);
    EXPECT(b.n == 3 && b.seg[0].doc_start && b.seg[1].doc_start && !b.seg[2].doc_start && b.seg[1].len == 5 &&
               b.seg[2].pos.text_offset == 5 && b.seg[2].pos.line == 8,
           "%zu segments", b.n);
    batch_free(&b);
}

// ---------------------------------------------------------------------------------------------
// compressed input

static size_t gzip_into(const char *src, size_t n, unsigned char *dst, size_t cap) {
    z_stream z = {0};
    deflateInit2(&z, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY);
    z.next_in = (unsigned char *)src;
    z.avail_in = (uInt)n;
    z.next_out = dst;
    z.avail_out = (uInt)cap;
    deflate(&z, Z_FINISH);
    size_t out = cap - z.avail_out;
    deflateEnd(&z);
    return out;
}

static char *read_all(const char *path, size_t *n, char *err, size_t errlen) {
    ByteSource *s = byte_source_open(path, err, errlen);
    if (!s) return NULL;
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    long got;
    while ((got = byte_source_read(s, buf + len, cap - len, err, errlen)) > 0)
        if ((len += (size_t)got) == cap) buf = realloc(buf, cap *= 2);
    byte_source_close(s);
    if (got < 0) {
        free(buf);
        return NULL;
    }
    *n = len;
    return buf;
}

static void test_compressed(const Tmp *tmp) {
    size_t n = 3u << 20;   // several read buffers long
    char *plain = malloc(n), path[512], err[512];
    for (size_t i = 0; i < n; i++) plain[i] = (char)("abcdefgh\n"[i % 9] + (i / 4099) % 3);
    size_t cap = n + (1 << 16), half = n / 2;
    unsigned char *z = malloc(2 * cap);
    // gzip: two members (as `cat a.gz b.gz`)
    size_t zn = gzip_into(plain, half, z, cap);
    zn += gzip_into(plain + half, n - half, z + zn, cap);
    path_in(tmp, path, "two.gz");
    write_raw(path, z, zn);
    size_t got_n = 0;
    char *got = read_all(path, &got_n, err, sizeof err);
    EXPECT(got && got_n == n && memcmp(got, plain, n) == 0, "gzip: %s", got ? "bytes differ" : err);
    free(got);
    write_raw(path, z, zn - 100);   // truncated
    EXPECT(!read_all(path, &got_n, err, sizeof err) && strstr(err, "truncated"), "truncated gzip: %s", err);
    z[zn / 2] ^= 0x55;   // corrupt
    write_raw(path, z, zn);
    got = read_all(path, &got_n, err, sizeof err);
    EXPECT(!got && strstr(err, "two.gz"), "corrupt gzip: %s", err);
    free(got);
    // zstd: two frames
    zn = ZSTD_compress(z, cap, plain, half, 3);
    zn += ZSTD_compress(z + zn, 2 * cap - zn, plain + half, n - half, 3);
    path_in(tmp, path, "two.zst");
    write_raw(path, z, zn);
    got = read_all(path, &got_n, err, sizeof err);
    EXPECT(got && got_n == n && memcmp(got, plain, n) == 0, "zstd: %s", got ? "bytes differ" : err);
    free(got);
    write_raw(path, z, zn - 7);
    EXPECT(!read_all(path, &got_n, err, sizeof err) && strstr(err, "truncated"), "truncated zstd: %s", err);
    // skip: the same bytes after it, plain (a seek) and compressed (read and dropped)
    for (int k = 0; k < 2; k++) {
        if (k == 0) {
            path_in(tmp, path, "plain.txt");
            write_raw(path, plain, n);
        }
        ByteSource *s = byte_source_open(path, err, sizeof err);
        char buf[64];
        EXPECT(s && byte_source_skip(s, n - 50 + 7 * k, err, sizeof err) == 0 && byte_source_read(s, buf, 20, err, sizeof err) == 20 &&
                   memcmp(buf, plain + n - 50 + 7 * k, 20) == 0,
               "skip (%s): %s", k ? "zstd" : "plain", err);
        byte_source_close(s);
        path_in(tmp, path, "two.zst");
        write_raw(path, z, zn);
    }
    free(z);
    free(plain);
}

// ---------------------------------------------------------------------------------------------
// document stream

typedef struct {
    char *text;   // the documents, joined
    size_t len;
    int docs;
    DocPos pos[64];   // where each piece started
    size_t at[64];    // and its offset in text
    int n_pieces;
} Collected;

static int collect(DocStream *d, Collected *c) {
    DocPiece p;
    char err[512];
    int rc;
    while ((rc = doc_stream_next(d, &p, err, sizeof err)) == 1) {
        c->text = realloc(c->text, c->len + p.len + 2);
        if (p.doc_start && c->len) c->text[c->len++] = '|';   // a visible document boundary
        memcpy(c->text + c->len, p.text, p.len);
        if (c->n_pieces < 64) {
            c->pos[c->n_pieces] = p.pos;
            c->at[c->n_pieces++] = c->len;
        }
        c->len += p.len;
        c->docs += p.doc_start;
    }
    if (rc < 0) printf("  doc_stream: %s\n", err);
    return rc;
}

static void test_doc_stream(const Tmp *tmp) {
    // A separator straddling the 1 MB read window, and one at the very end of the file.
    const size_t n = (1u << 20) + 10;
    char *text = malloc(n + 1), path[512], err[512];
    memset(text, 'x', n);
    memcpy(text + (1u << 20) - 2, "<s>", 3);
    memcpy(text + 100, "<s>", 3);
    memcpy(text + n - 3, "<s>", 3);
    path_in(tmp, path, "docs.txt");
    write_raw(path, text, n);
    InputList in;
    const char *args[] = {path};
    EXPECT(input_list_expand(&in, args, 1, err, sizeof err) == 0, "%s", err);
    DocStreamOptions o = {DOCS_TEXT, NULL, 0, "<s>", 0, UINT64_MAX, 0, NULL};
    DocStream *d = doc_stream_open(&in, &o);
    Collected c = {0};
    EXPECT(collect(d, &c) == 0 && c.docs == 3 && c.len == n + 2, "%d documents, %zu bytes", c.docs, c.len);
    EXPECT(c.text && memcmp(c.text + 103, "|", 1) == 0 && memcmp(c.text + (1u << 20) + 2, "|", 1) == 0,
           "documents end after each separator");
    doc_stream_close(d);
    // Seeking to where a piece started gives the same text from there on.
    int k = c.n_pieces - 1;
    d = doc_stream_open(&in, &o);
    EXPECT(doc_stream_seek(d, &c.pos[k], err, sizeof err) == 0, "seek: %s", err);
    Collected again = {0};
    collect(d, &again);
    EXPECT(again.len == c.len - c.at[k] && memcmp(again.text, c.text + c.at[k], again.len) == 0,
           "after a seek to piece %d: %zu bytes", k, again.len);
    doc_stream_close(d);
    // The single layout's split: part 1 begins after split_after characters, a separator
    // does not reach across it, and keep_empty gives str.split's empty last document.
    write_raw(path, "ab<s>\xc3\xa9<s>cd<s>", 15);
    // "ab<s>é" | "<s>cd<s>": part 1 is "<s>", "cd<s>" and "" as "<s>cd<s>".split("<s>") gives
    DocStreamOptions split = {DOCS_TEXT, NULL, 0, "<s>", 1, 6, 0, NULL};
    d = doc_stream_open(&in, &split);
    DocPiece p;
    char got[8][16];
    int parts[8], n_p = 0;
    while (n_p < 8 && doc_stream_next(d, &p, err, sizeof err) == 1) {
        snprintf(got[n_p], sizeof got[n_p], "%.*s%s", (int)p.len, p.text, p.doc_end ? "|" : "");
        parts[n_p++] = p.part;
    }
    EXPECT(n_p == 5 && !strcmp(got[0], "ab<s>|") && !strcmp(got[1], "\xc3\xa9|") && parts[1] == 0 &&
               !strcmp(got[2], "<s>|") && parts[2] == 1 && !strcmp(got[3], "cd<s>|") && !strcmp(got[4], "|") &&
               parts[4] == 1,
           "%d pieces: %s %s %s", n_p, got[0], n_p > 1 ? got[1] : "", n_p > 2 ? got[2] : "");
    doc_stream_close(d);
    // JSONL: a seek into a record's text (a segment that began inside a document) hands out
    // the rest of that record first, then the next ones with their line numbers.
    write_raw(path, "{\"t\":\"abc\"}\n{\"t\":\"hello world\"}\n\n{\"t\":\"xyz\"}\n", 45);
    DocStreamOptions jo = {DOCS_JSONL, "t", 0, NULL, 0, UINT64_MAX, 0, NULL};
    d = doc_stream_open(&in, &jo);
    DocPos at = {0, 12, 0, 6, 2};   // line 2 starts at byte 12; skip "hello "
    EXPECT(doc_stream_seek(d, &at, err, sizeof err) == 0, "%s", err);
    EXPECT(doc_stream_next(d, &p, err, sizeof err) == 1 && p.len == 5 && !memcmp(p.text, "world", 5) && !p.doc_start &&
               p.doc_end && p.pos.line == 2 && p.pos.text_offset == 6 && p.pos.offset == 12,
           "after the seek: '%.*s' line %llu", (int)p.len, p.text, (unsigned long long)p.pos.line);
    EXPECT(doc_stream_next(d, &p, err, sizeof err) == 1 && p.len == 3 && !memcmp(p.text, "xyz", 3) && p.doc_start &&
               p.pos.line == 4 && p.pos.offset == 33 && p.pos.text_offset == 0,
           "the next record: '%.*s' line %llu offset %llu", (int)p.len, p.text, (unsigned long long)p.pos.line,
           (unsigned long long)p.pos.offset);
    EXPECT(doc_stream_next(d, &p, err, sizeof err) == 0 && doc_stream_stats(d).blank_lines == 1, "then the end");
    doc_stream_close(d);
    input_list_free(&in);
    free(c.text);
    free(again.text);
    free(text);
}

// ---------------------------------------------------------------------------------------------
// shard writer

static void test_shard_out(const Tmp *tmp) {
    char path[512], err[512];
    path_in(tmp, path, "s_000000.bin");
    ShardOut o;
    int ids[70000];
    for (int i = 0; i < 70000; i++) ids[i] = i % 65536;
    EXPECT(shard_out_open(&o, path, SHARD_U16, err, sizeof err) == 0, "%s", err);
    EXPECT(shard_out_write(&o, ids, 40000, err, sizeof err) == 0 && shard_out_write(&o, ids + 40000, 30000, err, sizeof err) == 0,
           "%s", err);
    EXPECT(access(path, F_OK) != 0 && access(o.tmp, F_OK) == 0, "only the temporary name exists before the commit");
    EXPECT(shard_out_close(&o, err, sizeof err) == 0 && shard_out_commit(&o, err, sizeof err) == 0, "%s", err);
    shard_out_discard(&o);
    Shard s;
    EXPECT(shard_open(&s, path, 65536, err, sizeof err) == 0 && s.n_tokens == 70000, "%s", err);
    int back[3];
    shard_read(&s, 69997, 3, back);
    EXPECT(back[0] == 69997 % 65536 && back[2] == 69999 % 65536, "tokens %d %d", back[0], back[2]);
    shard_close(&s);
    path_in(tmp, path, "gone.bin");   // discarded: nothing is left
    EXPECT(shard_out_open(&o, path, SHARD_U32, err, sizeof err) == 0, "%s", err);
    char tmpname[600];
    snprintf(tmpname, sizeof tmpname, "%s", o.tmp);
    shard_out_discard(&o);
    EXPECT(access(path, F_OK) != 0 && access(tmpname, F_OK) != 0, "a discarded shard leaves no file");
    path_in(tmp, path, "no/such/dir/x.bin");
    EXPECT(shard_out_open(&o, path, SHARD_U16, err, sizeof err) != 0 && strstr(err, "no/such/dir"), "%s", err);
}

int main(void) {
    Tmp tmp;
    snprintf(tmp.dir, sizeof tmp.dir, "/tmp/flashgpt_prep_XXXXXX");
    if (!mkdtemp(tmp.dir)) return 1;
    Gpt2Bpe *bpe = load_gpt2();
    TEST_CASE("jsonl: records, escapes and every malformed line", test_jsonl());
    if (bpe) TEST_CASE("segments encode to the whole text's GPT-2 ids", test_segment_cuts_exact(bpe));
    if (bpe) TEST_CASE("short documents encode apart", test_documents_encode_apart(bpe));
    TEST_CASE("segments: hard cuts and documents", test_segment_hard_cut());
    TEST_CASE("gzip and zstd input", test_compressed(&tmp));
    TEST_CASE("document stream: separators, seek, split", test_doc_stream(&tmp));
    TEST_CASE("shard writer", test_shard_out(&tmp));
    gpt2_bpe_free(bpe);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp.dir);
    if (system(cmd) != 0) printf("could not remove %s\n", tmp.dir);
    return TEST_SUMMARY();
}
