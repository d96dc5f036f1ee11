// cli/bench: `train_gpt bench`: training-step throughput of a config on random tokens (no data, logs or
// checkpoints are touched). Launched by torchrun, mpirun or srun it times data-parallel steps:
// every rank trains on its own random batch, and rank 0 reports the global tokens/s. With
// --attention it times one layer's attention instead (cli/bench_attention.c).
#include "cli/cli.h"

#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/rng.h"
#include "common/timer.h"
#include "dist/launch.h"
#include "trainer/train_step.h"

typedef struct {
    int B, T, V;
    uint64_t seed;  // differs per rank
} RandomBatch;

static void random_batch(void *ctx, int *inputs, int *targets) {
    const RandomBatch *rb = ctx;
    Rng r;
    rng_seed(&r, rb->seed);
    for (int i = 0; i < rb->B * rb->T; i++) inputs[i] = (int)rng_below(&r, (uint64_t)rb->V);
    for (int i = 0; i < rb->B * rb->T; i++) targets[i] = (int)rng_below(&r, (uint64_t)rb->V);
}

int cli_bench_main(int argc, char **argv) {
    Config c;
    const char *device = NULL;
    long steps = 5;
    int n = 0, breakdown = 0, attention = 0, dense = 1;
    char err[ERR_LEN];
    char **rest = xmalloc((size_t)(argc + 1) * sizeof(char *));
    rest[n++] = argv[0];
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            printf("usage: train_gpt bench -c CONFIG.json [--set key=value ...] [--steps N] [--breakdown]\n"
                   "                       [--attention [--no-dense]] [--device cpu|cuda]\n"
                   "Times N training steps (after one warm-up step) of the config's model on random tokens\n"
                   "and prints ms/step and tokens/s. No data, logs or checkpoints are touched.\n"
                   "--breakdown then times N more steps phase by phase (forward+backward, the gradient\n"
                   "reduction left after backward, norm, optimizer, all-gather; a device sync ends each\n"
                   "phase) and prints rank 0's mean per phase.\n"
                   "--attention times the attention of one layer instead (batch x seq, the model's heads,\n"
                   "causal, attention.window / dropout / impl / deterministic; ALiBi left out): N forward\n"
                   "calls, then N backward calls, in ms and TFLOP/s; with attention.sparse, the same for\n"
                   "the block-sparse pattern after the dense one, with its density and speedup; --no-dense\n"
                   "times the sparse pattern alone (dense attention at a million tokens takes seconds per call).\n"
                   "Under torchrun, mpirun or srun every rank trains on batch_size sequences of its own\n"
                   "(data parallel, as `train`), and rank 0 prints the tokens/s of all ranks together.\n");
            free(rest);
            return EXIT_OK;
        }
        if (strcmp(argv[i], "--steps") == 0) steps = cli_parse_long("--steps", cli_opt_value(argc, argv, &i), 1, 1000000);
        else if (strcmp(argv[i], "--breakdown") == 0) breakdown = 1;
        else if (strcmp(argv[i], "--attention") == 0) attention = 1;
        else if (strcmp(argv[i], "--no-dense") == 0) dense = 0;
        else rest[n++] = argv[i];
    }
    cli_parse_train_args(n, rest, &c, &device);
    free(rest);
    if (!dense && (!attention || !c.attention.sparse))
        fatal(EXIT_USAGE, "bench: --no-dense times the block-sparse attention alone: it needs --attention and "
                          "attention.sparse set");
    LaunchInfo li;
    if (launch_detect(&li, err, sizeof err) != 0) fatal(EXIT_USAGE, "%s", err);
    Backend *be = cli_open_backend(device, c.precision.dtype, (AttnKernel)c.attention.kernel,
                                   li.local_rank);
    if (attention) {   // each rank times its own device; rank 0 prints
        cli_bench_attention(&c, be, steps, dense, li.rank == 0);
        be->destroy(be);
        return EXIT_OK;
    }
    Comm *comm = cli_open_comm(&li, be, &c);
    GPTConfig gc = gpt_config_from(&c);
    const int B = c.train.batch_size, T = c.train.seq_len;
    GPT *m = gpt_create(&gc, be, B, cp_local_len(&c), &c);   // context parallelism: a part of T
    Trainer *t = trainer_create_dist(m, &c, comm, err, sizeof err);
    if (!t) fatal(EXIT_USAGE, "%s", err);
    float *host = xmalloc(gpt_num_params(m) * sizeof(float));
    gpt_init_weights_host(m, host, (uint64_t)c.train.seed);
    trainer_set_weights_f32(t, host);
    free(host);
    RandomBatch rb = {B, T, c.model.vocab_size, (uint64_t)c.train.seed * 1000003u + (uint64_t)li.rank};
    trainer_step(t, 0, random_batch, &rb);
    be->synchronize(be);
    comm->barrier(comm);
    double t0 = now_seconds();
    for (long s = 0; s < steps; s++) trainer_step(t, s + 1, random_batch, &rb);
    be->synchronize(be);
    comm->barrier(comm);
    double dt = (now_seconds() - t0) / (double)steps;
    // Each context-parallel group of ranks trains on B whole sequences.
    double tokens = (double)B * T * c.train.grad_accum * (li.world / c.dist.context_parallel);
    const double gib = cli_gpu_memory_gib(be);
    if (li.rank == 0) {
        printf("bench: %s backend (%s), %.2fM parameters, batch %d x seq %d x accum %d", be->name,
               dtype_name(be->dtype), gpt_num_params(m) / 1e6, B, T, c.train.grad_accum);
        if (li.world > 1) printf(" x ranks %d (%s)", li.world, comm->name);
        printf(": %.1f ms/step, %.0f tokens/s", dt * 1e3, tokens / dt);
        const double peak = cli_peak_flops(be);
        if (peak > 0)
            printf(", MFU %.1f%%",
                   100.0 * cli_flops_per_token(&c, gpt_num_params(m)) * tokens / dt / (peak * li.world));
        if (gib >= 0) printf(", GPU memory %.2f GiB", gib);
        printf("\n");
    }
    if (breakdown) {
        double sum[N_STEP_PHASES] = {0}, total = 0;
        trainer_set_timing(t, 1);
        for (long s = 0; s < steps; s++) {
            StepStats st = trainer_step(t, steps + 1 + s, random_batch, &rb);
            for (int p = 0; p < N_STEP_PHASES; p++) sum[p] += st.phase_ms[p];
        }
        if (li.rank == 0) {
            printf("bench: phases (rank 0, ms per step, mean of %ld timed steps):", steps);
            for (int p = 0; p < N_STEP_PHASES; p++) {
                printf("%s %s %.2f", p ? " |" : "", STEP_PHASE_NAMES[p], sum[p] / steps);
                total += sum[p] / steps;
            }
            printf(" | total %.2f\n", total);
        }
    }
    trainer_free(t);
    gpt_free(m);
    comm_close(comm);  // before the backend: NCCL works on its stream
    be->destroy(be);
    return EXIT_OK;
}
