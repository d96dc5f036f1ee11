// cli/bench: `train_gpt bench`: training-step throughput of a config on random tokens (no data, logs or
// checkpoints are touched).
#include "cli/cli.h"

#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/rng.h"
#include "common/timer.h"
#include "model/train_step.h"

static void random_batch(void *ctx, int *inputs, int *targets) {
    const int *dims = ctx;  // {B, T, V, seed}
    Rng r;
    rng_seed(&r, (uint64_t)dims[3]);
    for (int i = 0; i < dims[0] * dims[1]; i++) inputs[i] = (int)rng_below(&r, (uint64_t)dims[2]);
    for (int i = 0; i < dims[0] * dims[1]; i++) targets[i] = (int)rng_below(&r, (uint64_t)dims[2]);
}

int cli_bench_main(int argc, char **argv) {
    Config c;
    const char *device = NULL;
    long steps = 5;
    int n = 0;
    char **rest = xmalloc((size_t)(argc + 1) * sizeof(char *));
    rest[n++] = argv[0];
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            printf("usage: train_gpt bench -c CONFIG.json [--set key=value ...] [--steps N] [--device cpu|cuda]\n"
                   "Times N training steps (after one warm-up step) of the config's model on random tokens\n"
                   "and prints ms/step and tokens/s. No data, logs or checkpoints are touched.\n");
            return EXIT_OK;
        }
        if (strcmp(argv[i], "--steps") == 0) steps = cli_parse_long("--steps", cli_opt_value(argc, argv, &i), 1, 1000000);
        else rest[n++] = argv[i];
    }
    cli_parse_train_args(n, rest, &c, &device);
    free(rest);
    Backend *be = cli_open_backend(device, c.precision.dtype, 0);
    GPTConfig gc = gpt_config_from(&c);
    const int B = c.train.batch_size, T = c.train.seq_len;
    GPT *m = gpt_create(&gc, be, B, T, &c);
    Trainer *t = trainer_create(m, &c);
    float *host = xmalloc(gpt_num_params(m) * sizeof(float));
    gpt_init_weights_host(m, host, (uint64_t)c.train.seed);
    trainer_set_weights_f32(t, host);
    free(host);
    int dims[4] = {B, T, c.model.vocab_size, (int)c.train.seed};
    trainer_step(t, 0, random_batch, dims);
    be->synchronize(be);
    double t0 = now_seconds();
    for (long s = 0; s < steps; s++) trainer_step(t, s + 1, random_batch, dims);
    be->synchronize(be);
    double dt = (now_seconds() - t0) / (double)steps;
    double tokens = (double)B * T * c.train.grad_accum;
    printf("bench: %s backend (%s), %.2fM parameters, batch %d x seq %d x accum %d: %.1f ms/step, "
           "%.0f tokens/s", be->name, dtype_name(be->dtype), gpt_num_params(m) / 1e6, B, T,
           c.train.grad_accum, dt * 1e3, tokens / dt);
    const double gib = cli_gpu_memory_gib(be);
    if (gib >= 0)
        printf(", MFU %.1f%%, GPU memory %.2f GiB",
               100.0 * cli_flops_per_token(&c, gpt_num_params(m)) * tokens / dt / PEAK_FLOPS, gib);
    printf("\n");
    trainer_free(t);
    gpt_free(m);
    be->destroy(be);
    return EXIT_OK;
}
