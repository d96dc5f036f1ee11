// ckpt_state: a checkpoint's state.json as text: the train state (step, RNG and data position,
// loss scaler, the divergence guard's running loss), the run config, and the size and SHA-256 of
// every other file of the checkpoint. state.json guards itself: its last member, state_sha256, is
// the SHA-256 of the file's own bytes with those 64 hex digits read as '0', so a change to any
// byte of it is found before anything it says is used. Private to trainer/ (and the tests).
//
// Formats: "flashgpt-state-2" (with the checksums); "flashgpt-state-1", written before them,
// still loads, unverified (the loader prints a notice). Any other format tag is refused.
#pragma once
#include <stddef.h>

#include "common/config.h"
#include "common/digest.h"
#include "trainer/checkpoint.h"

#define CKPT_STATE_FORMAT "flashgpt-state-2"
#define CKPT_STATE_FORMAT_UNCHECKED "flashgpt-state-1"
#define CKPT_FILE_NAME_MAX 64

typedef struct {
    char name[CKPT_FILE_NAME_MAX];   // a file of the checkpoint directory, e.g. "model.safetensors"
    FileDigest digest;
} CkptFile;

typedef struct {
    TrainState train;
    int checked;          // 1: state.json had checksums (and its own matched); 0: an older format
    int n_files;
    CkptFile *files;      // (n_files) malloc'ed; none when !checked
    char *config_json;    // the run config as JSON text, malloc'ed
} CkptState;

// state.json's text (malloc'ed) for st, c and the digests of the checkpoint's other files.
char *ckpt_state_format(const TrainState *st, const Config *c, const CkptFile *files, int n_files);
// Parses and verifies state.json's text (len bytes, text[len] == '\0') of checkpoint `dir` (named
// in messages) into *out. Returns 0, or -1 with err naming the checkpoint and the problem
// ("checkpoint DIR: state.json is corrupt (checksum mismatch)", a missing field, a wrong format).
int ckpt_state_parse(const char *text, size_t len, const char *dir, CkptState *out, char *err,
                     size_t errlen);
void ckpt_state_free(CkptState *s);
// The recorded digest of file `name`, or NULL when state.json does not list it.
const FileDigest *ckpt_state_digest(const CkptState *s, const char *name);
