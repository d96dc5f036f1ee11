// resume: a run going back to a checkpoint (at start, or after a divergence), with every rank
// agreeing on which one.
#pragma once
#include <stddef.h>

#include "common/config.h"
#include "trainer/checkpoint.h"
#include "trainer/train_step.h"

// Loads the newest checkpoint of run_dir that every rank loads completely into t's model and
// optimizer, and its train state into *st; path receives its directory. A newer one that does
// not load (corrupt, incomplete: a checksum mismatch, a missing file) is skipped with a warning
// naming the problem, and the one before it is tried. A collective call: every rank of t's
// communicator makes it. Returns 1 when one loaded, 0 when run_dir has no checkpoint, -1 with
// err set when none loads or the newest one that reads holds another model than c's.
int trainer_resume(Trainer *t, const Config *c, const char *run_dir, TrainState *st, char *path,
                   size_t path_len, char *err, size_t errlen);
