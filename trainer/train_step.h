// train_step: one optimizer step of the GPT: grad_accum micro-batches of forward + backward,
// global gradient norm (with the non-finite check), clipping, the loss scaler, the learning-rate
// schedule and AdamW. Shared by the training loop and the oracle tests so both run the same code.
//
// The optimizer (optim/optim.h) is made for the backend's device: on the cpu backend the fp32
// parameters are themselves the master weights; on the cuda backend the model computes in its
// dtype (bf16, fp16 or fp32) and the optimizer keeps fp32 master weights and moments on the GPU,
// writing both master and compute-dtype parameters; fp16 scales the loss dynamically
// (precision.*), every dtype skips non-finite steps.
//
// Data parallel (a Comm of world size W > 1, dist/comm.h): every rank runs its own micro-batches
// (its slice of each global batch); after the last micro-step the gradients are reduce-scattered
// (summed; each rank's backward already weighs its loss by 1/DP, so the sum is the mean over
// the global batch), so rank r holds the gradient of its shard of the flat vector (comm_shard).
// The reduction overlaps backward: on the last micro-step gpt's grad-ready hook hands over each
// layer's gradient block as soon as it is final, and buckets of adjacent blocks (about
// dist.bucket_mb MiB, default 25; 0 = one reduce-scatter after backward) start their
// reduce-scatter at once (Comm.reduce_scatter_start), all finished before the gradient norm.
// Bucket boundaries depend on the model's sizes alone, so results never depend on timing; with
// 2 ranks each element is the same one addition as in the single reduce-scatter, so the weights
// are bitwise those of dist.bucket_mb = 0 (with more ranks the library may pick another
// summation order for another message size).
// ZeRO-1: the AdamW moments (and on CUDA the fp32 master weights) exist only for that shard;
// each rank updates its shard, then the parameters are all-gathered. The loss and the gradient
// norm are global (an all-reduce of the per-rank sums), so every rank takes the same clipping
// and skip decisions. Each rank's loss is the mean over its own counted targets, so a step equals
// one process with the whole global batch when every rank counts as many targets (full windows
// of token shards, the synthetic tasks); with ignored targets spread unevenly, the ranks' means
// weigh equally rather than per token. Dropout masks differ per rank: the rng step is
// (step * grad_accum + micro-step) * W + rank.
// Context parallelism (dist.context_parallel = CP, trainer/context_parallel.h): W = DP x CP
// ranks, the CP ranks of a group each run their part of the group's sequences; a group's loss
// is the mean over all of its counted targets (per token across the group, so uneven ignored
// targets do not matter inside a group) and each rank's backward weighs it by 1/(accum x DP):
// the sum over all W ranks is again the mean over the global batch.
#pragma once
#include <stdint.h>

#include "common/config.h"
#include "dist/comm.h"
#include "trainer/checkpoint.h"
#include "trainer/context_parallel.h"
#include "model/gpt.h"
#include "optim/optim.h"

typedef struct Trainer Trainer;   // opaque

// Fills the next micro-batch: inputs (B,T), targets (B,T) host int32.
typedef void (*NextBatchFn)(void *ctx, int *inputs, int *targets);

// Phases of a step, timed when trainer_set_timing is on (host clock, with a device sync closing
// each phase, so a phase's time is the device's, not just the host's launch time).
typedef enum {
    PHASE_COMPUTE,   // forward and backward of every micro-step (bucket reductions run beside)
    PHASE_REDUCE,    // the gradient reduction still running after backward (all of it unbucketed)
    PHASE_NORM,      // global gradient norm and loss (sum of squares, all-reduce of two numbers)
    PHASE_UPDATE,    // AdamW over this rank's shard
    PHASE_GATHER,    // all-gather of the updated parameters
    N_STEP_PHASES
} StepPhase;

typedef struct {
    float loss;        // mean loss over the step's micro-batches
    float lr;
    float grad_norm;   // global norm of the (unscaled, unclipped) gradient; inf/nan if not finite
    int skipped;       // 1 when the step was skipped (non-finite gradients)
    float loss_scale;  // scale used during this step
    int stop;          // 1 when some rank's stop poll asked to stop (every rank sees the same)
    double phase_ms[N_STEP_PHASES];   // with trainer_set_timing on, else 0
} StepStats;

// Names of the phases, for reports.
extern const char *const STEP_PHASE_NAMES[N_STEP_PHASES];

// Takes the model's current parameters as the starting weights (fp32 master on CUDA: set them
// with trainer_set_weights_f32 to keep the fp32 values a lower compute dtype rounds away).
// Returns NULL with err set when the GPU lacks the memory for the optimizer state, or
// train.cuda_graph = on meets what a graph cannot run (then m is to be freed too: it may hold
// the ring of groups that were closed again).
Trainer *trainer_create(GPT *m, const Config *c, char *err, size_t errlen);
// The data-parallel trainer: comm (not owned; NULL or world 1 = one process) carries the
// gradient reduce-scatter, the parameter all-gather and the global loss and norm. Every rank
// must call trainer_step (and trainer_optim_state) the same number of times. With
// dist.context_parallel > 1 it opens the groups (trainer/context_parallel.h) and gives m its
// ring: m must then be built for cp_local_len(c) tokens per sequence; next() still fills whole
// sequences, of which each rank takes its part. Returns NULL with err set (as trainer_create)
// also when the launch or the model cannot serve dist.context_parallel.
Trainer *trainer_create_dist(GPT *m, const Config *c, Comm *comm, char *err, size_t errlen);
// The context-parallel group the trainer opened (evaluation slices its batches the same way),
// or NULL.
ContextParallel *trainer_context_parallel(Trainer *t);
void trainer_free(Trainer *t);
// Runs optimizer step `step` (0-based) of c->train.steps and returns its numbers (it waits for
// them: trainer_launch and trainer_collect are the same step without the wait).
StepStats trainer_step(Trainer *t, long long step, NextBatchFn next, void *ctx);
// Steps without host waits. On the cuda backend with one process (and without
// attention.doc_mask) a step's decisions are made on the device (optim/optim.h's dev_*): its
// micro-batches are copied asynchronously from page-locked memory (next() fills them while the
// device still runs the step before), every micro-batch adds its mean loss on the device, and
// the norm, the non-finite check, the loss scaler, clipping and AdamW's skip never leave it, so
// trainer_launch returns as soon as the step is queued; its numbers wait in a device ring until
// trainer_collect reads them all back in one copy. fp16 with a dynamic loss scale is the one
// exception: the backward's scale is a kernel argument, so each launch first reads the scale
// the step before decided (a wait for the device).
// train.cuda_graph: the second such step is captured as one CUDA graph (forward and backward of
// every micro-batch, the norm, the scaler, clipping, AdamW) and every later one replays it: lr,
// the record slot and the dropout masks' micro-step base (gpt_set_rng_base: the masks host_step
// draws) reach the device through small kernels before the replay, the batches through the
// asynchronous copies, the step count and the scaler live on the device. The graph is captured
// again when a host value baked into it changes (the loss scale, a micro-batch's count of
// counted targets). Without graphs the same kernels run in the same order, so the numbers are
// bitwise those of a replay. Elsewhere (the cpu backend, several ranks, doc_mask)
// trainer_launch runs trainer_step's host-decided step and keeps its numbers for
// trainer_collect.
#define TRAINER_MAX_PENDING 256
// Queues step `step` (0-based). At most TRAINER_MAX_PENDING steps may wait uncollected.
void trainer_launch(Trainer *t, long long step, NextBatchFn next, void *ctx);
// Steps launched and not yet collected.
int trainer_pending(const Trainer *t);
// StepStats.stop of the last launched step, known at once (on every rank alike).
int trainer_stop_asked(const Trainer *t);
// Steps that ran as a replay of the captured graph (train.cuda_graph).
long long trainer_graph_replays(const Trainer *t);
// The numbers of every uncollected step, in launch order, into out (TRAINER_MAX_PENDING);
// returns how many. Waits for them (and refreshes trainer_scaler).
int trainer_collect(Trainer *t, StepStats *out);
// Times each step's phases into StepStats.phase_ms. The device syncs it adds cost a little time
// per step and stop work of one phase from overlapping the next (the bucket reductions still
// overlap backward); bench reports it after its untimed run.
void trainer_set_timing(Trainer *t, int on);
// A function each step asks, on every rank, whether this process wants to stop (a signal
// arrived); the answers travel with the step's all-reduce of loss and norm, so StepStats.stop
// says on every rank whether any rank asked, and all of them stop after the same step.
void trainer_set_stop_poll(Trainer *t, int (*poll)(void));
// The model and the communicator the trainer was made with (NULL: one process).
GPT *trainer_model(Trainer *t);
Comm *trainer_comm(Trainer *t);
// Sets the weights from host fp32 (gpt_num_params): the model's parameters and the master copy.
void trainer_set_weights_f32(Trainer *t, const float *host);
// The optimizer (tests read its step count and state).
const Optimizer *trainer_optimizer(const Trainer *t);
// The loss scaler, as of the last trainer_collect (or trainer_step); a caller may change it
// between steps (a resume) and the next step uses the change.
LossScaler *trainer_scaler(Trainer *t);
// The optimizer state as host views for checkpoints, filled with the current state (copied
// into host buffers the trainer owns): the moments of this rank's shard, and where the optimizer
// keeps them the full fp32 master weights (with several ranks gathered from every shard, so this
// is a collective call: every rank makes it). Valid until the next call of a trainer function.
// After writing into the views (checkpoint_load), trainer_optim_state_commit makes them the
// optimizer's state and rounds the master weights into the compute-dtype parameters.
OptimState *trainer_optim_state(Trainer *t);
void trainer_optim_state_commit(Trainer *t);
