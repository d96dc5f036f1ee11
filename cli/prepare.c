// cli/prepare: `train_gpt prepare`: argv into PrepareOptions (data/prepare.h), then prepare_run.
#include "cli/prepare.h"

#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "common/check.h"
#include "data/prepare.h"

static void print_usage(FILE *f) {
    fprintf(f,
            "usage: train_gpt prepare --tokenizer gpt2|char|byte --input INPUT [INPUT ...] --out PREFIX\n"
            "           [--val-fraction F | --val-tokens N] [--shard-tokens N] [--resume]\n"
            "           [--jsonl-field NAME [--jsonl-strict]] [--doc-separator STR]\n"
            "           [--encoder PATH] [--vocab-bpe PATH] [--threads N]\n"
            "Tokenizes text into llm.c token shards and PREFIX_tokenizer.bin (llm.c tokenizer file),\n"
            "creating the directory of PREFIX. It streams: memory stays bounded whatever the input size.\n"
            "  --input          files, directories (every file below, sorted), glob patterns, or - for\n"
            "                   standard input; gzip and zstd files are decompressed (found by content)\n"
            "  --tokenizer      char: the sorted distinct characters of the text (nanoGPT's\n"
            "                   shakespeare_char; needs a first pass, so not standard input); byte: the\n"
            "                   256 byte values; gpt2: GPT-2's BPE\n"
            "One text file and none of --shard-tokens/--val-tokens/--resume: PREFIX_train.bin and\n"
            "PREFIX_val.bin, split by characters like nanoGPT:\n"
            "  --val-fraction   the last fraction of the text is val (default %.1f)\n"
            "Otherwise documents (JSONL records, text between separators, or whole files) go to\n"
            "PREFIX_val_000000.bin, ... then PREFIX_train_000000.bin, ...; with gpt2 each starts with\n"
            "<|endoftext|>. data.train = 'PREFIX_train_*.bin' reads them all.\n"
            "  --val-tokens     val is the first whole documents, until it has N tokens (0: no val)\n"
            "  --val-fraction   ... or until F of the input bytes are read (default %.1f)\n"
            "  --shard-tokens   tokens per shard (default %d, as llm.c's FineWeb shards)\n"
            "  --resume         continue an interrupted run from its last complete shard\n"
            "  --jsonl-field    the inputs are JSON Lines; each record's field NAME is one document;\n"
            "                   malformed lines are reported with their line number and skipped\n"
            "  --jsonl-strict   ... or stop the run\n"
            "  --doc-separator  gpt2 only: a document ends after each STR (\\n is a newline)\n"
            "  --encoder        gpt2 only: encoder.json (default $FLASHGPT_GPT2_DIR/encoder.json when\n"
            "                   that variable is set, else data_cache/gpt2/encoder.json)\n"
            "  --vocab-bpe      gpt2 only: vocab.bpe (same defaults)\n"
            "  --threads        tokenizer threads (default: OMP_NUM_THREADS, else every core)\n",
            PREPARE_DEFAULT_VAL_FRACTION, PREPARE_DEFAULT_VAL_FRACTION, PREPARE_DEFAULT_SHARD_TOKENS);
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

static double parse_fraction(const char *v) {
    char *end;
    double f = strtod(v, &end);
    if (end == v || *end != '\0' || !(f > 0 && f < 1))
        fatal(EXIT_USAGE, "prepare: --val-fraction '%s' must be a number in (0, 1), e.g. 0.1", v);
    return f;
}

static int is_flag(const char *k) { return !strcmp(k, "--resume") || !strcmp(k, "--jsonl-strict"); }

int cli_prepare_main(int argc, char **argv) {
    PrepareOptions o = {.val_fraction = -1, .val_tokens = -1, .shard_tokens = -1, .log = stderr, .report = stdout};
    const char **inputs = xcalloc((size_t)argc, sizeof *inputs);
    char *sep = NULL;
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i];
        if (cli_is_help(k)) {
            print_usage(stdout);
            free(inputs);
            return EXIT_OK;
        }
        if (is_flag(k)) {
            if (!strcmp(k, "--resume")) o.resume = 1;
            else o.jsonl_strict = 1;
            continue;
        }
        if (i + 1 >= argc)
            fatal(EXIT_USAGE, "prepare: '%s' needs a value (or is unknown); see train_gpt prepare --help", k);
        const char *v = argv[++i];
        if (!strcmp(k, "--input")) {
            // Every argument up to the next option is an input, so a shell's glob expansion works.
            inputs[o.n_inputs++] = v;
            while (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0) inputs[o.n_inputs++] = argv[++i];
        } else if (!strcmp(k, "--tokenizer")) o.tokenizer = v;
        else if (!strcmp(k, "--out")) o.out = v;
        else if (!strcmp(k, "--encoder")) o.encoder = v;
        else if (!strcmp(k, "--vocab-bpe")) o.vocab_bpe = v;
        else if (!strcmp(k, "--jsonl-field")) o.jsonl_field = v;
        else if (!strcmp(k, "--doc-separator")) {
            free(sep);   // the last one given counts
            o.doc_separator = sep = unescape(v);
        }
        else if (!strcmp(k, "--val-fraction")) o.val_fraction = parse_fraction(v);
        else if (!strcmp(k, "--val-tokens")) o.val_tokens = cli_parse_long("prepare: --val-tokens", v, 0, 1L << 62);
        else if (!strcmp(k, "--shard-tokens")) o.shard_tokens = cli_parse_long("prepare: --shard-tokens", v, 1, 2147483647L);
        else if (!strcmp(k, "--threads")) o.threads = (int)cli_parse_long("prepare: --threads", v, 1, 4096);
        else fatal(EXIT_USAGE, "prepare: unknown option '%s'; see train_gpt prepare --help", k);
    }
    o.inputs = inputs;
    const char *missing = !o.tokenizer ? "--tokenizer" : !o.n_inputs ? "--input" : !o.out ? "--out" : NULL;
    if (missing) fatal(EXIT_USAGE, "prepare: %s is required; see train_gpt prepare --help", missing);
    char err[4096];
    int rc = prepare_run(&o, err, sizeof err) == 0 ? EXIT_OK : EXIT_USAGE;
    if (rc != EXIT_OK) fprintf(stderr, "error: prepare: %s\n", err);
    free(inputs);
    free(sep);
    return rc;
}
