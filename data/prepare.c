// `train_gpt prepare`: text file in, PREFIX_train.bin, PREFIX_val.bin (token shards) and
// PREFIX_tokenizer.bin out. The split is by characters like nanoGPT's prepare.py: train is
// text[:int(n * (1 - f))], val the rest, for every tokenizer (the char vocabulary covers the whole
// text). Nothing is written until every step that can fail on the input has succeeded, and a
// failed write removes the files this run already wrote.
#include "data/prepare.h"

#include <errno.h>
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/check.h"
#include "common/fileio.h"
#include "data/gpt2_bpe.h"
#include "data/shard.h"
#include "data/tokenizer.h"

#define PREP_PATH_MAX 4096
#define PREP_DEFAULT_VAL_FRACTION 0.1

typedef struct {
    const char *tokenizer, *input, *out, *encoder, *vocab_bpe, *doc_separator;
    double val_fraction;
} PrepareArgs;

typedef struct {
    int *ids;
    size_t n, cap;
} Tokens;

static void print_usage(FILE *f) {
    fprintf(f,
            "usage: train_gpt prepare --tokenizer gpt2|char|byte --input FILE.txt --out PREFIX\n"
            "                         [--val-fraction F] [--encoder PATH] [--vocab-bpe PATH]\n"
            "                         [--doc-separator STR]\n"
            "Tokenizes a text file into PREFIX_train.bin and PREFIX_val.bin (llm.c token shards) and\n"
            "PREFIX_tokenizer.bin (llm.c tokenizer file), creating the directory of PREFIX.\n"
            "  --tokenizer      char: the sorted distinct characters of the text (nanoGPT's\n"
            "                   shakespeare_char); byte: the 256 byte values; gpt2: GPT-2's BPE\n"
            "  --val-fraction   the last fraction of the text (in characters) is val (default %.1f)\n"
            "  --encoder        gpt2 only: encoder.json (default $FLASHGPT_GPT2_DIR/encoder.json when\n"
            "                   that variable is set, else data_cache/gpt2/encoder.json)\n"
            "  --vocab-bpe      gpt2 only: vocab.bpe (same defaults)\n"
            "  --doc-separator  gpt2 only: split the text into documents at STR (\\n is a newline);\n"
            "                   each document starts with <|endoftext|> and keeps its separator\n",
            PREP_DEFAULT_VAL_FRACTION);
}

// Turns the two-character escape "\n" into a newline so shells can pass "\n\n".
static char *unescape(const char *s) {
    char *out = xstrdup(s), *w = out;
    for (; *s; s++) {
        if (s[0] == '\\' && s[1] == 'n') *w++ = '\n', s++;
        else *w++ = *s;
    }
    *w = '\0';
    return out;
}

static int parse_args(int argc, char **argv, PrepareArgs *a, int *help) {
    memset(a, 0, sizeof *a);
    a->val_fraction = PREP_DEFAULT_VAL_FRACTION;
    *help = 0;
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i];
        if (strcmp(k, "--help") == 0 || strcmp(k, "-h") == 0) {
            *help = 1;
            return 0;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "error: prepare: '%s' needs a value (or is unknown); see train_gpt prepare --help\n", k);
            return -1;
        }
        const char *v = argv[++i];
        if (strcmp(k, "--tokenizer") == 0) a->tokenizer = v;
        else if (strcmp(k, "--input") == 0) a->input = v;
        else if (strcmp(k, "--out") == 0) a->out = v;
        else if (strcmp(k, "--encoder") == 0) a->encoder = v;
        else if (strcmp(k, "--vocab-bpe") == 0) a->vocab_bpe = v;
        else if (strcmp(k, "--doc-separator") == 0) a->doc_separator = v;
        else if (strcmp(k, "--val-fraction") == 0) {
            char *end;
            a->val_fraction = strtod(v, &end);
            if (end == v || *end != '\0' || !(a->val_fraction > 0 && a->val_fraction < 1)) {
                fprintf(stderr, "error: prepare: --val-fraction '%s' must be a number in (0, 1), e.g. 0.1\n", v);
                return -1;
            }
        } else {
            fprintf(stderr, "error: prepare: unknown option '%s'; see train_gpt prepare --help\n", k);
            return -1;
        }
    }
    const char *missing = !a->tokenizer ? "--tokenizer" : !a->input ? "--input" : !a->out ? "--out" : NULL;
    if (missing) {
        fprintf(stderr, "error: prepare: %s is required; see train_gpt prepare --help\n", missing);
        return -1;
    }
    if (strcmp(a->tokenizer, "gpt2") != 0 && strcmp(a->tokenizer, "char") != 0 &&
        strcmp(a->tokenizer, "byte") != 0) {
        fprintf(stderr, "error: prepare: unknown --tokenizer '%s' (expected gpt2, char or byte)\n", a->tokenizer);
        return -1;
    }
    if (strcmp(a->tokenizer, "gpt2") != 0 && (a->doc_separator || a->encoder || a->vocab_bpe)) {
        fprintf(stderr, "error: prepare: --doc-separator, --encoder and --vocab-bpe need --tokenizer gpt2 "
                        "(the %s vocabulary has no end-of-text token)\n", a->tokenizer);
        return -1;
    }
    if (a->doc_separator && a->doc_separator[0] == '\0') {
        fprintf(stderr, "error: prepare: --doc-separator must not be empty\n");
        return -1;
    }
    return 0;
}

static char *read_input(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "error: prepare: cannot open --input '%s': %s\n", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 20, n = 0, got;
    char *buf = xmalloc(cap);
    while ((got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) buf = xrealloc(buf, cap *= 2);
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        fprintf(stderr, "error: prepare: cannot read --input '%s'\n", path);
        free(buf);
        return NULL;
    }
    if (n == 0) {
        fprintf(stderr, "error: prepare: --input '%s' is empty: nothing to tokenize\n", path);
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

// Byte offset where val starts: after int(n_chars * (1 - f)) characters, counting UTF-8 code
// points when the text is valid UTF-8, else bytes (only the byte tokenizer accepts such text).
static int split_point(const char *text, size_t len, const PrepareArgs *a, size_t *cut) {
    size_t n_chars = 0, bad_at = len;
    for (size_t i = 0; i < len; n_chars++) {
        int l = tokenizer_utf8_char_len(text + i, len - i);
        if (l < 0) {
            bad_at = i;
            break;
        }
        i += (size_t)l;
    }
    int utf8 = bad_at == len;
    if (!utf8 && strcmp(a->tokenizer, "byte") != 0) {
        fprintf(stderr, "error: prepare: --input '%s' is not valid UTF-8 at byte offset %zu: fix the "
                        "encoding or use --tokenizer byte\n", a->input, bad_at);
        return -1;
    }
    size_t n = utf8 ? n_chars : len;
    size_t n_train = (size_t)floor((double)n * (1.0 - a->val_fraction));
    if (n_train == 0 || n_train == n) {
        fprintf(stderr, "error: prepare: --input '%s' has %zu characters: too few to give both splits "
                        "a character with --val-fraction %g\n", a->input, n, a->val_fraction);
        return -1;
    }
    size_t i = 0;
    for (size_t c = 0; c < n_train; c++) i += utf8 ? (size_t)tokenizer_utf8_char_len(text + i, len - i) : 1;
    *cut = i;
    return 0;
}

static int encode_simple(const Tokenizer *t, const char *text, size_t len, Tokens *out) {
    out->ids = xmalloc(sizeof(int) * (len ? len : 1));   // at most one id per byte
    long n = tokenizer_encode_bytes(t, text, len, out->ids, (long)len);
    if (n < 0) {
        fprintf(stderr, "error: prepare: the text has a character outside the vocabulary\n");
        return -1;
    }
    out->n = (size_t)n;
    return 0;
}

// With a separator, llm.c's document convention: each document starts with <|endoftext|> and
// keeps the separator that ended it (gpt2_bpe_encode_documents, threads over documents).
static void encode_gpt2(const Gpt2Bpe *bpe, const char *text, size_t len, const char *sep, Tokens *out) {
    if (sep) gpt2_bpe_encode_documents(bpe, text, len, sep, 0, &out->ids, &out->n, &out->cap);
    else gpt2_bpe_encode_parallel(bpe, text, len, 0, &out->ids, &out->n, &out->cap);
}

static Gpt2Bpe *load_gpt2(const PrepareArgs *a) {
    char err[2048];
    Gpt2Bpe *t = gpt2_bpe_load_default(a->encoder, a->vocab_bpe, err, sizeof err);
    if (!t) fprintf(stderr, "error: prepare: %s\n", err);
    return t;
}

static Tokenizer *gpt2_table(const Gpt2Bpe *bpe) {
    int n = gpt2_bpe_vocab_size(bpe);
    const unsigned char **bytes = xmalloc(sizeof(*bytes) * (size_t)n);
    int *lens = xmalloc(sizeof(int) * (size_t)n);
    for (int i = 0; i < n; i++) bytes[i] = gpt2_bpe_token_bytes(bpe, i, &lens[i]);
    char err[512];
    Tokenizer *t = tokenizer_build_table(n, bytes, lens, gpt2_bpe_eot(bpe), err, sizeof err);
    if (!t) fprintf(stderr, "error: prepare: GPT-2 vocabulary: %s\n", err);
    free(bytes);
    free(lens);
    return t;
}

// Builds the vocabulary and tokenizes both splits; returns the tokenizer or NULL.
static Tokenizer *tokenize(const PrepareArgs *a, const char *text, size_t len, size_t cut, Tokens *train,
                           Tokens *val) {
    char err[1024];
    Tokenizer *t = NULL;
    if (strcmp(a->tokenizer, "gpt2") == 0) {
        Gpt2Bpe *bpe = load_gpt2(a);
        if (!bpe) return NULL;
        t = gpt2_table(bpe);
        if (t) {
            encode_gpt2(bpe, text, cut, a->doc_separator, train);
            encode_gpt2(bpe, text + cut, len - cut, a->doc_separator, val);
        }
        gpt2_bpe_free(bpe);
        return t;
    }
    if (strcmp(a->tokenizer, "char") == 0) t = tokenizer_build_char(text, len, err, sizeof err);
    else t = tokenizer_build_byte();
    if (!t) {
        fprintf(stderr, "error: prepare: --input '%s': %s\n", a->input, err);
        return NULL;
    }
    if (encode_simple(t, text, cut, train) != 0 || encode_simple(t, text + cut, len - cut, val) != 0) {
        tokenizer_free(t);
        return NULL;
    }
    return t;
}

// Writes the three files; on failure removes the ones already written.
static int write_outputs(const char *prefix, const Tokenizer *t, const Tokens *train, const Tokens *val,
                         char paths[3][PREP_PATH_MAX]) {
    char err[1024], dir[PREP_PATH_MAX];
    if (strlen(prefix) + sizeof "_tokenizer.bin" > PREP_PATH_MAX) {
        fprintf(stderr, "error: prepare: --out '%s' is too long (max %d characters)\n", prefix,
                (int)(PREP_PATH_MAX - sizeof "_tokenizer.bin"));
        return -1;
    }
    snprintf(paths[0], PREP_PATH_MAX, "%s_train.bin", prefix);
    snprintf(paths[1], PREP_PATH_MAX, "%s_val.bin", prefix);
    snprintf(paths[2], PREP_PATH_MAX, "%s_tokenizer.bin", prefix);
    memcpy(dir, paths[0], sizeof dir);
    if (mkdir_p(dirname(dir), err, sizeof err) != 0) {
        fprintf(stderr, "error: prepare: --out '%s': %s\n", prefix, err);
        return -1;
    }
    ShardVersion v = shard_version_for_vocab(tokenizer_vocab_size(t));
    int written = 0;
    int rc = shard_write(paths[0], train->ids, train->n, v, err, sizeof err);
    if (rc == 0) {
        written = 1;
        rc = shard_write(paths[1], val->ids, val->n, v, err, sizeof err);
    }
    if (rc == 0) {
        written = 2;
        rc = tokenizer_save(t, paths[2], err, sizeof err);
    }
    if (rc == 0) return 0;
    for (int i = 0; i < written; i++) unlink(paths[i]);
    fprintf(stderr, "error: prepare: --out '%s': %s\n", prefix, err);
    return -1;
}

int prepare_main(int argc, char **argv) {
    PrepareArgs a;
    int help;
    if (parse_args(argc, argv, &a, &help) != 0) return EXIT_USAGE;
    if (help) {
        print_usage(stdout);
        return EXIT_OK;
    }
    char *sep = a.doc_separator ? unescape(a.doc_separator) : NULL;
    a.doc_separator = sep;
    size_t len = 0, cut = 0;
    char *text = read_input(a.input, &len);
    Tokens train = {0}, val = {0};
    Tokenizer *t = NULL;
    char paths[3][PREP_PATH_MAX];
    int rc = EXIT_USAGE;
    if (text && split_point(text, len, &a, &cut) == 0 && (t = tokenize(&a, text, len, cut, &train, &val)) &&
        write_outputs(a.out, t, &train, &val, paths) == 0) {
        printf("prepare: %s tokenizer, vocab size %d, eot %d\n", a.tokenizer, tokenizer_vocab_size(t),
               tokenizer_eot(t));
        printf("  train: %zu tokens -> %s\n  val:   %zu tokens -> %s\n  tokenizer -> %s\n", train.n, paths[0],
               val.n, paths[1], paths[2]);
        rc = EXIT_OK;
    }
    tokenizer_free(t);
    free(train.ids);
    free(val.ids);
    free(text);
    free(sep);
    return rc;
}
