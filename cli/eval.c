// cli/eval: `train_gpt eval`: the mean validation loss of a checkpoint over token shards.
#include "cli/cli.h"
#include "trainer/eval.h"

#include <stdlib.h>
#include <string.h>

#include "common/check.h"

int cli_eval_main(int argc, char **argv) {
    const char *ckpt = NULL, *data = NULL, *device = NULL;
    long long tokens = 0;
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            printf("usage: train_gpt eval --checkpoint DIR --data SHARD_PATTERN [--tokens N] [--device cpu|cuda]\n"
                   "Prints val_loss: the mean token cross-entropy over the whole data (or its first N tokens),\n"
                   "read as windows of the checkpoint's train.seq_len (a tail shorter than a window is skipped).\n");
            return EXIT_OK;
        }
        if (strcmp(argv[i], "--checkpoint") == 0) ckpt = cli_opt_value(argc, argv, &i);
        else if (strcmp(argv[i], "--data") == 0) data = cli_opt_value(argc, argv, &i);
        else if (strcmp(argv[i], "--tokens") == 0) tokens = cli_parse_long("--tokens", cli_opt_value(argc, argv, &i), 1, 1L << 62);
        else if (strcmp(argv[i], "--device") == 0) device = cli_device_arg(argc, argv, &i);
        else fatal(EXIT_USAGE, "eval: unknown argument '%s' (train_gpt eval --help)", argv[i]);
    }
    if (!ckpt || !data) fatal(EXIT_USAGE, "eval: --checkpoint DIR and --data SHARD_PATTERN are required");
    Config c;
    char err[ERR_LEN];
    Backend *be = cli_open_checkpoint(ckpt, &c, device);
    const int B = c.train.batch_size, T = c.train.seq_len;
    GPT *m = cli_load_checkpoint_model(ckpt, &c, be, B, T);
    snprintf(c.data.val, sizeof c.data.val, "%s", data);
    c.data.synthetic = SYNTH_NONE;
    Dataset *d = dataset_open(&c, SPLIT_VAL, B, T, 0, 1, err, sizeof err);
    if (!d) fatal(EXIT_USAGE, "%s", err);
    long long n_batches = eval_batches(d, B, T, tokens > 0 ? tokens : (long long)dataset_num_tokens(d));
    printf("val_loss: %.6f\n", eval_loss(m, d, B, T, n_batches, NULL, NULL));
    dataset_close(d);
    gpt_free(m);
    be->destroy(be);
    return EXIT_OK;
}
