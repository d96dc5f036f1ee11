// cli/eval: what `train_gpt eval`'s files share (cli/eval.c parses the arguments, cli/eval_passkey.c
// runs --passkey).
#pragma once
#include <cjson/cJSON.h>

#define PASSKEY_MAX_LIST 16   // lengths or depths of one --passkey grid

typedef struct {
    int lengths[PASSKEY_MAX_LIST], n_lengths;   // 0: the default (seq_len / 4, / 2, seq_len)
    double depths[PASSKEY_MAX_LIST];
    int n_depths;
    int trials;
    long seed;
} PasskeyArgs;

// Writes o as one JSON line to path (atomically: no half-written file), prints "wrote PATH" and
// frees o; exits 1 when the file cannot be written.
void eval_write_json(cJSON *o, const char *path);
// `eval --passkey` on checkpoint ckpt: the accuracy grid printed, and written to json (not NULL).
void eval_passkey(const char *ckpt, const char *device, const PasskeyArgs *a, const char *json);
