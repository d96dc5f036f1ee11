// checkpoint: a directory per checkpoint, log.dir/ckpt_<step:08d>/, holding model.safetensors
// (fp32 weights by parameter name), optimizer_rank<R>.safetensors (AdamW moments), state.json
// (step, RNG and data position, loss scaler, the full config, and the size and SHA-256 of every
// other file; trainer/ckpt_state.h) and tokenizer.bin (a copy of the run's tokenizer, so `sample`
// needs nothing else). It is written under a temporary name and renamed into place only when
// complete: a crash during a write never damages an older one. Pruning renames an old one to
// .trash-ckpt_<step> before deleting it, so a process ended at any moment leaves only complete
// ckpt_* directories (resume reads no other name). Every file is checked against
// state.json when it is read: a changed byte anywhere is "checkpoint DIR: FILE is corrupt
// (checksum mismatch)", never weights silently different from the ones written.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "common/config.h"
#include "dist/comm.h"
#include "model/gpt.h"
#include "optim/optim.h"

// The optimizer state a checkpoint holds, as host fp32 views of n elements, the same for every
// backend (trainer/train_step.h hands them out). master is the fp32 copy of the weights that the
// optimizer updates when the model computes in a lower precision (CUDA): it is what
// model.safetensors stores, and what loading fills. NULL means the model's own parameters are
// fp32 and are the master (CPU).
// With ZeRO-1 (several ranks) m and v hold this rank's shard [shard_offset, shard_offset +
// shard_n) of the flat vector only; shard_n 0 means the whole vector (one process).
typedef struct {
    size_t n;
    float *master;   // (n) or NULL
    float *m, *v;    // (shard_n, or n when shard_n is 0) AdamW moments
    long long t;     // completed optimizer steps (bias correction)
    size_t shard_offset, shard_n;
} OptimState;

typedef struct {
    long long step;         // optimizer steps completed
    long long tokens_seen;  // training tokens consumed (all ranks)
    uint64_t rng[4];        // the run's sampling RNG (common/rng.h state)
    uint64_t data[3];       // the training data position (data/dataset.h DatasetState)
    LossScaler scaler;
    int world_size;
    double guard_loss_mean; // the divergence guard's running mean loss (trainer/guard.h); 0: none
} TrainState;

// Writes checkpoint `st->step` of the run into run_dir and keeps the newest `keep` of them.
// model.safetensors holds opt->master when set, else the model's parameters as fp32.
// path_out (may be NULL) receives the final directory. Returns 0 or -1 with err set.
int checkpoint_save_state(const char *run_dir, GPT *m, const OptimState *opt, const TrainState *st,
                          const Config *c, int keep, char *path_out, size_t path_len, char *err,
                          size_t errlen);
// checkpoint_save_state for every rank of comm (a collective call): each rank writes its
// optimizer_rank<R>.safetensors (opt's shard), rank 0 the weights and state.json, and rank 0
// renames the directory into place only after every rank reported its part written, so a
// checkpoint is complete only when all parts are. Every rank returns the same status (-1 with
// err set when any rank failed; the temporary directory is then removed).
int checkpoint_save_dist(const char *run_dir, GPT *m, const OptimState *opt, const TrainState *st,
                         const Config *c, int keep, Comm *comm, char *path_out, size_t path_len,
                         char *err, size_t errlen);
// checkpoint_save_dist in two halves, so that the files are written while the caller goes on
// (the run's sample at the same step). checkpoint_save_begin (collective) creates the temporary
// directory and starts writing every file but state.json on threads of their own, from opt's
// host views (and the model's weights, fetched here when opt->master is NULL): until
// checkpoint_save_end the caller may run the model but must leave opt's buffers as they are.
// It returns NULL with err set (on every rank alike) when the directory cannot be made.
// checkpoint_save_end (collective) waits for the files, writes state.json from st (the state of
// begin's step, as it is at the end: the RNG after the sample), moves the checkpoint into place,
// frees w and returns what checkpoint_save_dist returns.
typedef struct CkptWrite CkptWrite;
CkptWrite *checkpoint_save_begin(const char *run_dir, GPT *m, const OptimState *opt, long long step,
                                 const Config *c, Comm *comm, char *err, size_t errlen);
int checkpoint_save_end(CkptWrite *w, const TrainState *st, int keep, char *path_out,
                        size_t path_len, char *err, size_t errlen);
// The step-0 checkpoint of a model that has not trained (an import): the model's parameters,
// zero AdamW moments, the RNG seeded from train.seed, the scaler's initial state.
int checkpoint_save_initial(const char *run_dir, GPT *m, const Config *c, char *path_out,
                            size_t path_len, char *err, size_t errlen);
// Removes what an ended process left in run_dir: directories being deleted (.trash-*) and
// checkpoints being written (.tmp-ckpt_*). For rank 0 at the start of a run, before it writes.
void checkpoint_remove_leftovers(const char *run_dir);
// Newest complete checkpoint directory in run_dir: returns 1 and fills path, 0 when none.
int checkpoint_find_latest(const char *run_dir, char *path, size_t path_len);
// The newest complete checkpoint of run_dir whose step is below `step`: returns its step and
// fills path, or -1 when there is none.
long long checkpoint_find_before(const char *run_dir, long long step, char *path, size_t path_len);
// Reads the run config stored in a checkpoint (state.json). Returns 0 or -1 with err set.
int checkpoint_read_config(const char *dir, Config *c, char *err, size_t errlen);
// Loads weights into m, and (when not NULL) the optimizer state into opt's views (the weights
// into opt->master too, when set; the moments of opt's shard, assembled from the files of
// however many ranks wrote the checkpoint) and the train state. Validates names, shapes and
// sizes against the model, and every file it reads against state.json's checksums (a checkpoint
// written before they were recorded loads with a notice). Returns 0 or -1 with err set.
int checkpoint_load(const char *dir, GPT *m, OptimState *opt, TrainState *st, char *err,
                    size_t errlen);
// Checks the file `name` of checkpoint dir (e.g. tokenizer.bin) against state.json. Returns 0
// (also for a checkpoint without checksums), or -1 with err set.
int checkpoint_verify_file(const char *dir, const char *name, char *err, size_t errlen);
