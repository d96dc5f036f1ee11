// prepare_run: checks the options, picks the layout (prepare.h), builds the vocabulary (after a
// first pass over the input when it needs one), and runs the streaming pipeline into shards.
#include "data/prepare.h"

#include <libgen.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/check.h"
#include "common/fileio.h"
#include "common/timer.h"
#include "data/gpt2_bpe.h"
#include "data/prepare_outputs.h"
#include "data/prepare_pipeline.h"
#include "data/text_scan.h"

#define PREP_PATH_MAX 4096

typedef struct {
    const PrepareOptions *o;
    InputList in;
    int single;                 // the single-file layout
    Gpt2Bpe *bpe;
    Tokenizer *tok;
    uint64_t split_after;       // single: characters (or bytes) of train
    int split_in_bytes;
    char prefix_train[PREP_PATH_MAX], prefix_val[PREP_PATH_MAX];
    char tok_path[PREP_PATH_MAX], state_path[PREP_PATH_MAX];
    cJSON *settings;
    Progress progress;
    Pipeline pl;
} Prep;

static int is_tokenizer(const char *t) { return !strcmp(t, "gpt2") || !strcmp(t, "char") || !strcmp(t, "byte"); }

// Combinations of options that cannot work, before anything is read.
static int check_options(const PrepareOptions *o, char *err, size_t errlen) {
    if (!o->tokenizer || !is_tokenizer(o->tokenizer))
        return set_error(err, errlen, "unknown --tokenizer '%s' (expected gpt2, char or byte)",
                         o->tokenizer ? o->tokenizer : "");
    int gpt2 = strcmp(o->tokenizer, "gpt2") == 0;
    if (!gpt2 && (o->doc_separator || o->encoder || o->vocab_bpe))
        return set_error(err, errlen, "--doc-separator, --encoder and --vocab-bpe need --tokenizer gpt2 (the %s "
                                      "vocabulary has no end-of-text token)", o->tokenizer);
    if (o->doc_separator && !o->doc_separator[0]) return set_error(err, errlen, "--doc-separator must not be empty");
    if (o->doc_separator && o->jsonl_field)
        return set_error(err, errlen, "--doc-separator splits text inputs; with --jsonl-field every line is "
                                      "one document already");
    if (o->jsonl_strict && !o->jsonl_field) return set_error(err, errlen, "--jsonl-strict needs --jsonl-field");
    if (o->val_fraction >= 0 && o->val_tokens >= 0)
        return set_error(err, errlen, "give --val-tokens or --val-fraction, not both");
    if (!o->out || !o->out[0]) return set_error(err, errlen, "--out PREFIX is required");
    if (strlen(o->out) + sizeof "_prepare_state.json.tmp.4294967295" > PREP_PATH_MAX)
        return set_error(err, errlen, "--out '%s' is too long", o->out);
    return 0;
}

// Single file: one file of known size, text, and no option of the sharded layout.
static int pick_layout(Prep *p, char *err, size_t errlen) {
    const PrepareOptions *o = p->o;
    p->single = p->in.n == 1 && p->in.files[0].size >= 0 && !o->jsonl_field && o->shard_tokens < 0 &&
                o->val_tokens < 0 && !o->resume;
    if (p->single) return 0;
    int char_tok = strcmp(o->tokenizer, "char") == 0;
    if (p->in.total_size < 0 && char_tok)
        return set_error(err, errlen, "--tokenizer char reads its input twice (the vocabulary comes first) and "
                                      "cannot read standard input or a pipe: save it to a file");
    if (p->in.total_size < 0 && o->val_tokens < 0)
        return set_error(err, errlen, "the size of standard input (or a pipe) is unknown, so --val-fraction "
                                      "cannot be measured: give --val-tokens N (the first documents, N tokens)");
    if (p->in.total_size < 0 && o->resume)
        return set_error(err, errlen, "--resume needs inputs that can be read again: standard input cannot");
    return 0;
}

static void out_path(char *dst, const char *prefix, const char *suffix) {
    snprintf(dst, PREP_PATH_MAX, "%s%s", prefix, suffix);
}

static Tokenizer *gpt2_table(const Gpt2Bpe *bpe, char *err, size_t errlen) {
    int n = gpt2_bpe_vocab_size(bpe);
    const unsigned char **bytes = xmalloc(sizeof(*bytes) * (size_t)n);
    int *lens = xmalloc(sizeof(int) * (size_t)n);
    for (int i = 0; i < n; i++) bytes[i] = gpt2_bpe_token_bytes(bpe, i, &lens[i]);
    char sub[512];
    Tokenizer *t = tokenizer_build_table(n, bytes, lens, gpt2_bpe_eot(bpe), sub, sizeof sub);
    if (!t) set_error(err, errlen, "GPT-2 vocabulary: %s", sub);
    free(bytes);
    free(lens);
    return t;
}

static DocStreamOptions doc_options(const Prep *p) {
    const PrepareOptions *o = p->o;
    return (DocStreamOptions){o->jsonl_field ? DOCS_JSONL : DOCS_TEXT, o->jsonl_field, o->jsonl_strict,
                              o->doc_separator, p->single, UINT64_MAX, 0, o->log};
}

static const char *input_name(const Prep *p, int file) {
    const char *path = p->in.files[file].path;
    return strcmp(path, "-") == 0 ? "standard input" : path;
}

// The first pass: the character count of the single layout's split and the char vocabulary.
static int scan(Prep *p, char *err, size_t errlen) {
    const PrepareOptions *o = p->o;
    int char_tok = strcmp(o->tokenizer, "char") == 0, byte_tok = strcmp(o->tokenizer, "byte") == 0;
    if (!p->single && !char_tok) return 0;
    DocStreamOptions dopt = doc_options(p);
    dopt.log = NULL;   // the second pass reports skipped lines
    DocStream *ds = doc_stream_open(&p->in, &dopt);
    TextScan ts;
    text_scan_init(&ts, char_tok);
    DocPiece piece;
    int rc;
    while ((rc = doc_stream_next(ds, &piece, err, errlen)) == 1 && (ts.valid || byte_tok)) {
        text_scan_piece(&ts, &piece);
        progress_update(&p->progress, "scanning", doc_stream_stats(ds).raw_done, 0, 0);
    }
    doc_stream_close(ds);
    if (rc >= 0) text_scan_finish(&ts);
    if (rc >= 0 && !ts.valid && !byte_tok)
        rc = set_error(err, errlen, "--input '%s' is not valid UTF-8 at byte offset %llu: fix the encoding or use "
                                    "--tokenizer byte", input_name(p, ts.bad_file), (unsigned long long)ts.bad_offset);
    if (rc >= 0 && ts.bytes == 0)
        rc = set_error(err, errlen, "--input '%s' is empty: nothing to tokenize", input_name(p, 0));
    if (rc >= 0 && p->single) {
        uint64_t n = ts.valid ? ts.chars : ts.bytes;
        double f = o->val_fraction >= 0 ? o->val_fraction : PREPARE_DEFAULT_VAL_FRACTION;
        p->split_after = (uint64_t)floor((double)n * (1.0 - f));
        p->split_in_bytes = !ts.valid;
        if (p->split_after == 0 || p->split_after == n)
            rc = set_error(err, errlen, "--input '%s' has %llu characters: too few to give both splits a character "
                                        "with --val-fraction %g", input_name(p, 0), (unsigned long long)n, f);
    }
    if (rc >= 0 && char_tok) {
        char sub[512];
        if (!(p->tok = text_scan_char_vocab(&ts, sub, sizeof sub))) rc = set_error(err, errlen, "%s", sub);
    }
    text_scan_free(&ts);
    return rc < 0 ? -1 : 0;
}

static int load_vocabulary(Prep *p, char *err, size_t errlen) {
    const PrepareOptions *o = p->o;
    if (strcmp(o->tokenizer, "byte") == 0) p->tok = tokenizer_build_byte();
    if (strcmp(o->tokenizer, "gpt2") != 0) return 0;
    if (!(p->bpe = gpt2_bpe_load_default(o->encoder, o->vocab_bpe, err, errlen))) return -1;
    return (p->tok = gpt2_table(p->bpe, err, errlen)) ? 0 : -1;
}

// 64-bit FNV-1a over every token's bytes and the end-of-text id: the vocabulary in --resume's check.
static void vocabulary_hash(const Tokenizer *t, char out[32]) {
    uint64_t h = 0xCBF29CE484222325ull;
    const uint64_t prime = 0x100000001B3ull;
    for (int id = 0; id < tokenizer_vocab_size(t); id++) {
        int len;
        const unsigned char *b = tokenizer_decode(t, id, &len);
        h = (h ^ (uint64_t)len) * prime;
        for (int k = 0; k < len; k++) h = (h ^ b[k]) * prime;
    }
    h = (h ^ (uint64_t)(uint32_t)tokenizer_eot(t)) * prime;
    snprintf(out, 32, "%016llx", (unsigned long long)h);
}

// What must be the same for --resume to continue a run: everything that decides the tokens.
static cJSON *settings_of(const Prep *p) {
    const PrepareOptions *o = p->o;
    cJSON *s = cJSON_CreateObject();
    char buf[PREP_PATH_MAX + 96];
    cJSON_AddStringToObject(s, "--tokenizer", o->tokenizer);
    vocabulary_hash(p->tok, buf);
    cJSON_AddStringToObject(s, "the vocabulary (hash)", buf);
    cJSON_AddStringToObject(s, "--jsonl-field", o->jsonl_field ? o->jsonl_field : "(none: text)");
    cJSON_AddStringToObject(s, "--doc-separator", o->doc_separator ? o->doc_separator : "(none)");
    cJSON_AddNumberToObject(s, "--shard-tokens", (double)p->pl.train.shard_tokens);
    if (p->pl.val_by_tokens) snprintf(buf, sizeof buf, "--val-tokens %llu", (unsigned long long)p->pl.val_goal_tokens);
    else snprintf(buf, sizeof buf, "--val-fraction %.17g", o->val_fraction >= 0 ? o->val_fraction : PREPARE_DEFAULT_VAL_FRACTION);
    cJSON_AddStringToObject(s, "the val split", buf);
    cJSON_AddNumberToObject(s, "the number of input files", p->in.n);
    for (int i = 0; i < p->in.n; i++) {
        const InputFile *f = &p->in.files[i];
        char key[48];
        snprintf(key, sizeof key, "input file %d", i + 1);
        snprintf(buf, sizeof buf, "%s (%lld bytes, modified %lld ns)", f->path, (long long)f->size, (long long)f->mtime_ns);
        cJSON_AddStringToObject(s, key, buf);
    }
    return s;
}

// A sharded run: refuses to mix with an earlier run's files unless resuming, and then restores
// where it stopped. *done is set when the earlier run had finished.
static int start_or_resume(Prep *p, int *done, char *err, size_t errlen) {
    const PrepareOptions *o = p->o;
    char found[PREP_PATH_MAX + 256];
    *done = 0;
    p->pl.st = (PrepareState){.in_val = !p->pl.val_by_tokens || p->pl.val_goal_tokens > 0};
    if (!o->resume) {
        if (prepare_outputs_find(o->out, found, sizeof found))
            return set_error(err, errlen, "'%s' exists from an earlier prepare to this --out: add --resume to continue "
                                          "it, or remove %s_* to start over", found, o->out);
        return 0;
    }
    if (!path_exists(p->state_path)) {
        if (prepare_outputs_find(o->out, found, sizeof found))
            return set_error(err, errlen, "cannot --resume: '%s' exists but '%s' does not, so where it stopped is "
                                          "unknown; remove %s_* to start over", found, p->state_path, o->out);
        if (o->log) fprintf(o->log, "prepare: nothing to resume at %s: starting from the beginning\n", o->out);
        return 0;
    }
    if (prepare_state_load(p->state_path, p->settings, &p->pl.st, err, errlen) != 0) return -1;
    const PrepareState *st = &p->pl.st;
    for (int split = 0; split < 2; split++) {
        ShardSet *s = split ? &p->pl.train : &p->pl.val;
        for (int i = 0; i < (split ? st->train_shards : st->val_shards); i++) {
            shard_set_path(s, i, found, sizeof found);
            if (!path_exists(found))
                return set_error(err, errlen, "cannot --resume: '%s', complete when the run stopped, is missing; "
                                              "remove %s_* to start over", found, o->out);
        }
    }
    *done = st->complete;
    return 0;
}

static void setup_pipeline(Prep *p) {
    const PrepareOptions *o = p->o;
    Pipeline *pl = &p->pl;
    pl->in = &p->in;
    pl->single = p->single;
    pl->docs = doc_options(p);
    if (p->single) {
        pl->docs.split_after = p->split_after;
        pl->docs.split_in_bytes = p->split_in_bytes;
    }
    pl->seg = (SegmenterParams){PIPELINE_SEGMENT_TARGET, PIPELINE_SEGMENT_MAX, pl->docs.format};
    // With gpt2 every document starts with <|endoftext|>, except in the single layout without a
    // separator, whose whole text is one stretch (as before documents existed).
    int eot_docs = !p->single || o->doc_separator;
    pl->enc = (SegmentEncoder){p->bpe, p->tok, eot_docs ? tokenizer_eot(p->tok) : -1, o->threads};
    ShardVersion v = shard_version_for_vocab(tokenizer_vocab_size(p->tok));
    uint64_t shard_tokens = o->shard_tokens > 0 ? (uint64_t)o->shard_tokens : PREPARE_DEFAULT_SHARD_TOKENS;
    shard_set_init(&pl->val, p->prefix_val, !p->single, shard_tokens, v);
    shard_set_init(&pl->train, p->prefix_train, !p->single, shard_tokens, v);
    pl->val_by_tokens = o->val_tokens >= 0;
    if (pl->val_by_tokens) pl->val_goal_tokens = (uint64_t)o->val_tokens;
    else if (!p->single) {
        double f = o->val_fraction >= 0 ? o->val_fraction : PREPARE_DEFAULT_VAL_FRACTION;
        pl->val_goal_bytes = (uint64_t)ceil(f * (double)p->in.total_size);
    }
    pl->state_path = p->state_path;
    pl->progress = &p->progress;
    pl->log = o->log;
}

static int make_out_dir(const char *prefix, char *err, size_t errlen) {
    char dir[PREP_PATH_MAX], sub[1024];
    snprintf(dir, sizeof dir, "%s", prefix);
    if (mkdir_p(dirname(dir), sub, sizeof sub) != 0) return set_error(err, errlen, "--out '%s': %s", prefix, sub);
    return 0;
}

// The single layout's three files appear together once all is written.
static int commit_single(Prep *p, char *err, size_t errlen) {
    char sub[1024];
    if (tokenizer_save(p->tok, p->tok_path, sub, sizeof sub) != 0)
        return set_error(err, errlen, "--out '%s': %s", p->o->out, sub);
    if (shard_set_commit(&p->pl.train, sub, sizeof sub) == 0 && shard_set_commit(&p->pl.val, sub, sizeof sub) == 0)
        return 0;
    char path[PREP_PATH_MAX + 16];
    shard_set_path(&p->pl.train, 0, path, sizeof path);
    if (!p->pl.train.open && p->pl.val.open) unlink(path);   // train was renamed, val failed: take it back
    unlink(p->tok_path);
    return set_error(err, errlen, "--out '%s': %s", p->o->out, sub);
}

// After a sharded run that cannot be continued (every document in val) or wrote no shard at
// all: its files go, so that the next run does not take them for an interrupted one.
static void remove_outputs(const Prep *p) {
    char path[PREP_PATH_MAX + 16];
    for (int split = 0; split < 2; split++) {
        const ShardSet *s = split ? &p->pl.train : &p->pl.val;
        for (int i = 0; i < s->done; i++) {
            shard_set_path(s, i, path, sizeof path);
            unlink(path);
        }
    }
    unlink(p->state_path);
    unlink(p->tok_path);
}

static void print_split(FILE *f, const char *name, const ShardSet *s) {
    char first[PREP_PATH_MAX + 16], last[PREP_PATH_MAX + 16];
    shard_set_path(s, 0, first, sizeof first);
    if (!s->numbered) {
        fprintf(f, "  %-6s %llu tokens -> %s\n", name, (unsigned long long)s->tokens, first);
        return;
    }
    shard_set_path(s, s->done - 1, last, sizeof last);
    fprintf(f, "  %-6s %llu tokens in %d shard%s -> %s%s%s\n", name, (unsigned long long)s->tokens, s->done,
            s->done == 1 ? "" : "s", first, s->done > 1 ? " ... " : "", s->done > 1 ? last : "");
}

static void report(const Prep *p, double seconds) {
    FILE *f = p->o->report;
    if (!f) return;
    const Pipeline *pl = &p->pl;
    fprintf(f, "prepare: %s tokenizer, vocab size %d, eot %d\n", p->o->tokenizer, tokenizer_vocab_size(p->tok),
            tokenizer_eot(p->tok));
    if (!p->single) {
        const DocStreamStats *d = &pl->doc_stats;
        fprintf(f, "  documents: %llu", (unsigned long long)pl->st.docs);
        if (d->bad_lines) fprintf(f, ", %llu malformed JSONL lines skipped", (unsigned long long)d->bad_lines);
        if (d->empty_docs) fprintf(f, ", %llu empty documents left out", (unsigned long long)d->empty_docs);
        fputc('\n', f);
    }
    if (!p->single && pl->val.done == 0) fprintf(f, "  val:   none (--val-tokens 0)\n");
    else print_split(f, p->single ? "train:" : "val:", p->single ? &pl->train : &pl->val);
    print_split(f, p->single ? "val:" : "train:", p->single ? &pl->val : &pl->train);
    fprintf(f, "  tokenizer -> %s\n", p->tok_path);
    uint64_t bytes = pl->doc_stats.raw_done - p->progress.base;   // this run's (after a resume: the rest)
    fprintf(f, "  %.1f MB of input in %.1f s (%.1f MB/s%s)%s\n", bytes / 1e6, seconds,
            seconds > 0 ? bytes / 1e6 / seconds : 0.0, p->single ? ", read twice: characters first" : "",
            pl->hard_cuts ? ", with cuts that may change ids (see the warning)" : "");
}

static int run(Prep *p, char *err, size_t errlen) {
    const PrepareOptions *o = p->o;
    double t0 = now_seconds();
    if (check_options(o, err, errlen) != 0 || input_list_expand(&p->in, o->inputs, o->n_inputs, err, errlen) != 0 ||
        pick_layout(p, err, errlen) != 0)
        return -1;
    out_path(p->prefix_train, o->out, "_train");
    out_path(p->prefix_val, o->out, "_val");
    out_path(p->tok_path, o->out, "_tokenizer.bin");
    out_path(p->state_path, o->out, "_prepare_state.json");
    progress_init(&p->progress, o->log, p->in.total_size, 0);
    if (load_vocabulary(p, err, errlen) != 0 || scan(p, err, errlen) != 0) return -1;
    progress_finish(&p->progress);
    if (make_out_dir(o->out, err, errlen) != 0) return -1;
    setup_pipeline(p);
    prepare_outputs_remove_stale(o->out);
    if (!p->single) {
        int done;
        p->pl.settings = p->settings = settings_of(p);
        if (start_or_resume(p, &done, err, errlen) != 0) return -1;
        if (done) {
            if (o->report)
                fprintf(o->report, "prepare: %s is complete already (%llu val and %llu train tokens): nothing to do\n",
                        o->out, (unsigned long long)p->pl.st.val_tokens, (unsigned long long)p->pl.st.train_tokens);
            return 0;
        }
        char sub[1024];
        if (tokenizer_save(p->tok, p->tok_path, sub, sizeof sub) != 0)
            return set_error(err, errlen, "--out '%s': %s", o->out, sub);
    }
    progress_init(&p->progress, o->log, p->in.total_size, p->pl.st.raw_done);
    int rc = pipeline_run(&p->pl, err, errlen);
    progress_finish(&p->progress);
    if (rc == 0 && p->single && p->pl.val.tokens == 0)
        rc = set_error(err, errlen, "--input '%s' changed while prepare read it (val came out empty)", input_name(p, 0));
    if (rc == 0 && p->single) rc = commit_single(p, err, errlen);
    if (rc != 0) {
        shard_set_discard(&p->pl.train);
        shard_set_discard(&p->pl.val);
        if (!p->single && (p->pl.all_val || p->pl.val.done + p->pl.train.done == 0)) remove_outputs(p);
        return -1;
    }
    report(p, now_seconds() - t0);
    return 0;
}

int prepare_run(const PrepareOptions *o, char *err, size_t errlen) {
    Prep p;
    memset(&p, 0, sizeof p);
    p.o = o;
    int rc = run(&p, err, errlen);
    progress_finish(&p.progress);
    cJSON_Delete(p.settings);
    tokenizer_free(p.tok);
    gpt2_bpe_free(p.bpe);
    input_list_free(&p.in);
    return rc;
}
