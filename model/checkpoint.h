// checkpoint: a directory per checkpoint, log.dir/ckpt_<step:08d>/, holding model.safetensors
// (fp32 weights by parameter name), optimizer_rank<R>.safetensors (AdamW moments), state.json
// (step, RNG and data position, loss scaler, the full config) and tokenizer.bin (a copy of the
// run's tokenizer, so `sample` needs nothing else). It is written under a temporary name and
// renamed into place only when complete: a crash during a write never damages an older one.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "common/config.h"
#include "model/gpt.h"
#include "optim/optim.h"

typedef struct {
    long long step;         // optimizer steps completed
    long long tokens_seen;  // training tokens consumed (all ranks)
    uint64_t rng[4];        // the run's sampling RNG (common/rng.h state)
    uint64_t data[3];       // the training data position (data/dataset.h DatasetState)
    LossScaler scaler;
    int world_size;
} TrainState;

// Writes checkpoint `st->step` of the run into run_dir and keeps the newest `keep` of them.
// path_out (may be NULL) receives the final directory. Returns 0 or -1 with err set.
int checkpoint_save(const char *run_dir, GPT *m, const AdamW *opt, const TrainState *st,
                    const Config *c, int keep, char *path_out, size_t path_len, char *err,
                    size_t errlen);
// Newest complete checkpoint directory in run_dir: returns 1 and fills path, 0 when none.
int checkpoint_find_latest(const char *run_dir, char *path, size_t path_len);
// Reads the run config stored in a checkpoint (state.json). Returns 0 or -1 with err set.
int checkpoint_read_config(const char *dir, Config *c, char *err, size_t errlen);
// Loads weights into m, and (when not NULL) the optimizer moments and the train state.
// Validates names, shapes and sizes against the model. Returns 0 or -1 with err set.
int checkpoint_load(const char *dir, GPT *m, AdamW *opt, TrainState *st, char *err, size_t errlen);
