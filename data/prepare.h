// prepare: text in, llm.c token shards and tokenizer file out (`train_gpt prepare`, whose
// arguments cli/prepare.c parses). Streams: memory stays bounded whatever the input size (a few
// hundred MB at most; docs/formats.md gives the bound).
//
// Two layouts:
// - single file (one plain or compressed text file, no --shard-tokens / --val-tokens /
//   --resume): PREFIX_train.bin and PREFIX_val.bin split by characters like nanoGPT (train is
//   the first int(n * (1 - F)) characters), written under temporary names and renamed with the
//   tokenizer file at the end. Two passes over the file: the first counts characters (and
//   collects the char vocabulary).
// - shards (anything else): documents (JSONL records, text between separators, or whole files),
//   the first ones to val (whole documents, until --val-tokens tokens or --val-fraction of the
//   input bytes), the rest to train, in shards PREFIX_{val,train}_NNNNNN.bin of --shard-tokens
//   tokens, each complete under its final name when it appears, with PREFIX_prepare_state.json
//   saying where to continue (--resume). With gpt2 every document starts with <|endoftext|>.
//   The char vocabulary needs a first pass over the inputs, so char cannot read standard input.
#pragma once
#include <stdint.h>
#include <stdio.h>

#define PREPARE_DEFAULT_SHARD_TOKENS 100000000   // llm.c's FineWeb shards
#define PREPARE_DEFAULT_VAL_FRACTION 0.1

typedef struct {
    const char *tokenizer;          // "gpt2", "char" or "byte"
    const char *const *inputs;      // (n_inputs) files, directories, glob patterns, "-"
    int n_inputs;
    const char *out;                // PREFIX
    const char *encoder, *vocab_bpe;   // gpt2: NULL for the defaults (gpt2_bpe_load_default)
    const char *doc_separator;      // text inputs: the separator itself (escapes already resolved)
    const char *jsonl_field;        // the inputs are JSONL with the text in this field; NULL: text
    int jsonl_strict;               // a malformed JSONL line is an error instead of a warning
    double val_fraction;            // < 0: not given
    int64_t val_tokens;             // < 0: not given
    int64_t shard_tokens;           // < 0: not given
    int resume;                     // continue an interrupted sharded prepare
    int threads;                    // tokenizer threads; <= 0: all OpenMP threads
    FILE *log;                      // progress and warnings (stderr); NULL: quiet
    FILE *report;                   // the summary (stdout); NULL: none
} PrepareOptions;

// Runs prepare. 0, or -1 with err saying what was wrong and what to do (bad options or input,
// an output that cannot be written); nothing is then left under a final name that is not
// complete.
int prepare_run(const PrepareOptions *o, char *err, size_t errlen);
