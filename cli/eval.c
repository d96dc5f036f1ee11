// cli/eval: `train_gpt eval`: the mean validation loss of a checkpoint over token shards, and
// with --per-position the mean loss by token position in doubling buckets (long context).
#include "cli/cli.h"
#include "trainer/eval.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/fileio.h"

#define MAX_BUCKETS 32   // 1-128, ..., up to 2^38 positions

// Prints the buckets and, with json (not NULL), writes them there as one JSON object.
static void report_positions(const EvalBucket *b, int n, double loss, int T, const char *json) {
    for (int k = 0; k < n; k++)
        printf("positions %d-%d: loss %.6f (%lld targets)\n", b[k].first, b[k].last, b[k].loss, b[k].targets);
    if (!json) return;
    cJSON *o = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(o, "per_position");
    cJSON_AddStringToObject(o, "event", "eval_positions");
    cJSON_AddNumberToObject(o, "seq_len", T);
    cJSON_AddNumberToObject(o, "val_loss", loss);
    for (int k = 0; k < n; k++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "first", b[k].first);
        cJSON_AddNumberToObject(e, "last", b[k].last);
        if (isfinite(b[k].loss)) cJSON_AddNumberToObject(e, "loss", b[k].loss);
        else cJSON_AddNullToObject(e, "loss");
        cJSON_AddNumberToObject(e, "targets", (double)b[k].targets);
        cJSON_AddItemToArray(arr, e);
    }
    char *text = cJSON_PrintUnformatted(o), err[ERR_LEN];
    cJSON_Delete(o);
    const size_t len = strlen(text);
    char *line = xmalloc(len + 2);
    memcpy(line, text, len);
    line[len] = '\n';
    cJSON_free(text);
    const int rc = write_file_atomic(json, line, len + 1, err, sizeof err);
    free(line);
    if (rc != 0) fatal(EXIT_RUNTIME, "eval: --json: %s", err);
    printf("wrote %s\n", json);
}

int cli_eval_main(int argc, char **argv) {
    const char *ckpt = NULL, *data = NULL, *device = NULL, *json = NULL;
    long long tokens = 0;
    int per_position = 0;
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            printf("usage: train_gpt eval --checkpoint DIR --data SHARD_PATTERN [--tokens N] [--device cpu|cuda]\n"
                   "                      [--per-position [--json FILE]]\n"
                   "Prints val_loss: the mean token cross-entropy over the whole data (or its first N tokens),\n"
                   "read as windows of the checkpoint's train.seq_len (a tail shorter than a window is skipped).\n"
                   "  --per-position  also the mean loss of the targets by position in the window, in buckets\n"
                   "                  1-128, 129-256, 257-512, ... (doubling, the last cut at seq_len): whether\n"
                   "                  far context lowers the loss\n"
                   "  --json FILE     writes the buckets as one JSON line (scripts/plot_metrics.py --positions)\n");
            return EXIT_OK;
        }
        if (strcmp(argv[i], "--checkpoint") == 0) ckpt = cli_opt_value(argc, argv, &i);
        else if (strcmp(argv[i], "--data") == 0) data = cli_opt_value(argc, argv, &i);
        else if (strcmp(argv[i], "--tokens") == 0) tokens = cli_parse_long("--tokens", cli_opt_value(argc, argv, &i), 1, 1L << 62);
        else if (strcmp(argv[i], "--device") == 0) device = cli_device_arg(argc, argv, &i);
        else if (strcmp(argv[i], "--per-position") == 0) per_position = 1;
        else if (strcmp(argv[i], "--json") == 0) json = cli_opt_value(argc, argv, &i);
        else fatal(EXIT_USAGE, "eval: unknown argument '%s' (train_gpt eval --help)", argv[i]);
    }
    if (!ckpt || !data) fatal(EXIT_USAGE, "eval: --checkpoint DIR and --data SHARD_PATTERN are required");
    if (json && !per_position) fatal(EXIT_USAGE, "eval: --json FILE needs --per-position");
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
    if (per_position) {
        EvalBucket b[MAX_BUCKETS];
        const int n = eval_position_buckets(T, b, MAX_BUCKETS);
        const double loss = eval_loss_by_position(m, d, B, T, n_batches, b, n);
        printf("val_loss: %.6f\n", loss);
        report_positions(b, n, loss, T, json);
    } else {
        printf("val_loss: %.6f\n", eval_loss(m, d, B, T, n_batches, NULL, NULL));
    }
    dataset_close(d);
    gpt_free(m);
    be->destroy(be);
    return EXIT_OK;
}
