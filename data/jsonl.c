#include "data/jsonl.h"

#include <stdint.h>
#include <string.h>

#include "common/check.h"
#include "data/utf8.h"

// Deepest nesting of the values skipped over: each level is one recursive call, so this bounds
// the C stack a hostile line can take.
#define JSONL_MAX_DEPTH 512

typedef struct {
    const char *s;
    size_t n, i;   // the line and the position being read
    ByteBuf key;   // a member name with escapes, decoded (allocated only when one occurs)
    char *err;
    size_t errlen;
} Parser;

static int fail(Parser *p, const char *what) {
    return set_error(p->err, p->errlen, "%s at byte %zu of the line", what, p->i + 1);
}

static int at(const Parser *p, char c) { return p->i < p->n && p->s[p->i] == c; }

static void skip_ws(Parser *p) {
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\r' || p->s[p->i] == '\n'))
        p->i++;
}

static int hex4(Parser *p, uint32_t *v) {
    if (p->n - p->i < 4) return fail(p, "a \\u escape without 4 hex digits");
    uint32_t x = 0;
    for (int k = 0; k < 4; k++) {
        char c = p->s[p->i + k];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return fail(p, "a \\u escape without 4 hex digits");
        x = x << 4 | (uint32_t)d;
    }
    p->i += 4;
    *v = x;
    return 0;
}

// \uXXXX with p->i after the 'u'; a surrogate pair (two escapes) is one code point.
static int unicode_escape(Parser *p, uint32_t *cp) {
    if (hex4(p, cp) != 0) return -1;
    if (*cp >= 0xDC00 && *cp <= 0xDFFF) return fail(p, "a lone low surrogate (\\udc00-\\udfff)");
    if (*cp < 0xD800 || *cp > 0xDBFF) return 0;
    uint32_t lo;
    if (p->n - p->i < 2 || p->s[p->i] != '\\' || p->s[p->i + 1] != 'u')
        return fail(p, "a high surrogate escape (\\ud800-\\udbff) without its low half");
    p->i += 2;
    if (hex4(p, &lo) != 0) return -1;
    if (lo < 0xDC00 || lo > 0xDFFF) return fail(p, "a high surrogate escape followed by no low surrogate");
    *cp = 0x10000 + ((*cp - 0xD800) << 10) + (lo - 0xDC00);
    return 0;
}

// The escape after a backslash (p->i on the character after it), appended to out if not NULL.
static int escape(Parser *p, ByteBuf *out) {
    static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
    if (p->i >= p->n) return fail(p, "an unterminated string");
    char e = p->s[p->i];
    const char *k = e ? strchr(from, e) : NULL;
    if (k) {
        p->i++;
        if (out) bytebuf_append(out, &to[k - from], 1);
        return 0;
    }
    if (e != 'u') return fail(p, "an unknown escape (JSON has \\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX)");
    p->i++;
    uint32_t cp;
    if (unicode_escape(p, &cp) != 0) return -1;
    char u[UTF8_MAX_BYTES];
    int len = utf8_encode(cp, u);
    if (out) bytebuf_append(out, u, (size_t)len);
    return 0;
}

// A string with p->i on its opening quote; the decoded bytes are appended to out if not NULL.
static int string(Parser *p, ByteBuf *out) {
    p->i++;
    for (;;) {
        size_t run = p->i;   // plain ASCII is copied a run at a time
        while (p->i < p->n) {
            unsigned char c = (unsigned char)p->s[p->i];
            if (c == '"' || c == '\\' || c < 0x20 || c >= 0x80) break;
            p->i++;
        }
        if (out) bytebuf_append(out, p->s + run, p->i - run);
        if (p->i >= p->n) return fail(p, "an unterminated string");
        unsigned char c = (unsigned char)p->s[p->i];
        if (c == '"') {
            p->i++;
            return 0;
        }
        if (c < 0x20) return fail(p, "a control character inside a string (JSON needs it escaped)");
        if (c == '\\') {
            p->i++;
            if (escape(p, out) != 0) return -1;
            continue;
        }
        int len = utf8_char_len(p->s + p->i, p->n - p->i, NULL);
        if (len < 0) return fail(p, "invalid UTF-8");
        if (out) bytebuf_append(out, p->s + p->i, (size_t)len);
        p->i += (size_t)len;
    }
}

static int digits(Parser *p) {
    size_t start = p->i;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++;
    return p->i > start;
}

static int number(Parser *p) {
    if (at(p, '-')) p->i++;
    if (at(p, '0')) p->i++;
    else if (!digits(p)) return fail(p, "a malformed number");
    if (at(p, '.')) {
        p->i++;
        if (!digits(p)) return fail(p, "a malformed number");
    }
    if (at(p, 'e') || at(p, 'E')) {
        p->i++;
        if (at(p, '+') || at(p, '-')) p->i++;
        if (!digits(p)) return fail(p, "a malformed number");
    }
    return 0;
}

static int literal(Parser *p, const char *word) {
    size_t len = strlen(word);
    if (p->n - p->i < len || memcmp(p->s + p->i, word, len) != 0) return fail(p, "an unknown literal");
    p->i += len;
    return 0;
}

static const char *type_name(char c) {
    switch (c) {
    case '"': return "a string";
    case '{': return "an object";
    case '[': return "an array";
    case 't': case 'f': return "a boolean";
    case 'n': return "null";
    default: return "a number";
    }
}

static int value(Parser *p, int depth);

// The member name at p->i (a string) compared with field; 1 when it is that name.
static int member_is(Parser *p, const char *field) {
    size_t start = p->i + 1;
    const char *q = memchr(p->s + start, '"', p->n - start);
    if (q && !memchr(p->s + start, '\\', (size_t)(q - p->s) - start)) {   // no escapes: compare in place
        size_t len = (size_t)(q - p->s) - start;
        if (string(p, NULL) != 0) return -1;
        return len == strlen(field) && memcmp(p->s + start, field, len) == 0;
    }
    p->key.len = 0;
    if (string(p, &p->key) != 0) return -1;
    return p->key.len == strlen(field) && memcmp(p->key.p, field, p->key.len) == 0;
}

// What an object's members are read for: at the top level (field set) the string value of that
// member is decoded into out and *found names the JSON type of its last occurrence; nested
// objects are only checked.
typedef struct {
    const char *field;
    ByteBuf *out;
    const char **found;
} Members;

static int member(Parser *p, int depth, const Members *m) {
    skip_ws(p);
    if (!at(p, '"')) return fail(p, "expected a member name in double quotes");
    int match = m->field ? member_is(p, m->field) : string(p, NULL);
    if (match < 0) return -1;
    skip_ws(p);
    if (!at(p, ':')) return fail(p, "expected ':' after a member name");
    p->i++;
    skip_ws(p);
    if (!match || p->i >= p->n) return value(p, depth);
    *m->found = type_name(p->s[p->i]);
    m->out->len = 0;
    return at(p, '"') ? string(p, m->out) : value(p, depth);
}

// An object (members m) or an array (m NULL) with p->i on its opening bracket.
static int container(Parser *p, int depth, const Members *m) {
    const char close = m ? '}' : ']';
    if (depth > JSONL_MAX_DEPTH) return fail(p, "values nested deeper than 512 levels");
    p->i++;
    skip_ws(p);
    if (at(p, close)) {
        p->i++;
        return 0;
    }
    for (;;) {
        if ((m ? member(p, depth, m) : value(p, depth)) != 0) return -1;
        skip_ws(p);
        if (at(p, close)) break;
        if (!at(p, ',')) return fail(p, m ? "expected ',' or '}' after a member" : "expected ',' or ']' after an array element");
        p->i++;
    }
    p->i++;
    return 0;
}

static int value(Parser *p, int depth) {
    skip_ws(p);
    if (p->i >= p->n) return fail(p, "expected a value");
    switch (p->s[p->i]) {
    case '{': return container(p, depth + 1, &(Members){NULL, NULL, NULL});
    case '[': return container(p, depth + 1, NULL);
    case '"': return string(p, NULL);
    case 't': return literal(p, "true");
    case 'f': return literal(p, "false");
    case 'n': return literal(p, "null");
    default:
        if (p->s[p->i] == '-' || (p->s[p->i] >= '0' && p->s[p->i] <= '9')) return number(p);
        return fail(p, "expected a value");
    }
}

JsonlResult jsonl_field_text(const char *line, size_t len, const char *field, ByteBuf *out, char *err,
                             size_t errlen) {
    Parser p = {.s = line, .n = len, .err = err, .errlen = errlen};
    skip_ws(&p);
    if (p.i == p.n) return JSONL_BLANK;
    const char *found = NULL;
    int rc = -1;
    if (!at(&p, '{')) fail(&p, "not a JSON object (a JSONL line is one {...})");
    else if (container(&p, 1, &(Members){field, out, &found}) == 0) {
        skip_ws(&p);
        if (p.i != p.n) fail(&p, "characters after the end of the object");
        else if (!found) set_error(err, errlen, "no field \"%s\"", field);
        else if (strcmp(found, "a string") != 0) set_error(err, errlen, "field \"%s\" is %s, not a string", field, found);
        else rc = 0;
    }
    bytebuf_free(&p.key);
    return rc == 0 ? JSONL_TEXT : JSONL_BAD;
}
