// cli/eval: `train_gpt eval`: the mean validation loss of a checkpoint over token shards, and
// with --per-position the mean loss by token position in doubling buckets (long context); the
// passkey test (--passkey) runs in cli/eval_passkey.c.
#include "cli/eval.h"

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
    eval_write_json(o, json);
}

void eval_write_json(cJSON *o, const char *path) {
    char *text = cJSON_PrintUnformatted(o), err[ERR_LEN];
    cJSON_Delete(o);
    const size_t len = strlen(text);
    char *line = xmalloc(len + 2);
    memcpy(line, text, len);
    line[len] = '\n';
    cJSON_free(text);
    const int rc = write_file_atomic(path, line, len + 1, err, sizeof err);
    free(line);
    if (rc != 0) fatal(EXIT_RUNTIME, "eval: --json: %s", err);
    printf("wrote %s\n", path);
}

// A comma-separated list of opt's values (at most PASSKEY_MAX_LIST) into ints, each an integer in
// [1, hi], or when ints is NULL into reals, each a number in [0, 1] (depths). Returns their number.
static int parse_list(const char *opt, const char *v, int *ints, double *reals, long hi) {
    char buf[1024];
    if (strlen(v) >= sizeof buf) fatal(EXIT_USAGE, "%s: the list is too long", opt);
    snprintf(buf, sizeof buf, "%s", v);
    int n = 0;
    for (char *item = buf, *comma; item; item = comma ? comma + 1 : NULL) {
        comma = strchr(item, ',');
        if (comma) *comma = '\0';
        if (n == PASSKEY_MAX_LIST) fatal(EXIT_USAGE, "%s: at most %d values", opt, PASSKEY_MAX_LIST);
        if (ints) ints[n++] = (int)cli_parse_long(opt, item, 1, hi);
        else reals[n++] = cli_parse_double(opt, item, 0.0, 1.0);
    }
    return n;
}

static void usage(void) {
    printf("usage: train_gpt eval --checkpoint DIR --data SHARD_PATTERN [--tokens N] [--device cpu|cuda]\n"
           "                      [--per-position [--json FILE]]\n"
           "       train_gpt eval --checkpoint DIR --passkey [--passkey-lengths L,...] [--passkey-depths D,...]\n"
           "                      [--passkey-trials N] [--seed S] [--device cpu|cuda] [--json FILE]\n"
           "Prints val_loss: the mean token cross-entropy over the whole data (or its first N tokens),\n"
           "read as windows of the checkpoint's train.seq_len (a tail shorter than a window is skipped).\n"
           "  --per-position  also the mean loss of the targets by position in the window, in buckets\n"
           "                  1-128, 129-256, 257-512, ... (doubling, the last cut at seq_len): whether\n"
           "                  far context lowers the loss\n"
           "  --json FILE     writes the buckets (or the passkey grid) as one JSON line\n"
           "                  (scripts/plot_metrics.py --positions plots the buckets)\n"
           "  --passkey       instead, the passkey retrieval test: a random 5-digit key stated once at a\n"
           "                  depth of filler text, asked for at the end, answered by greedy decoding;\n"
           "                  prints the fraction of trials recalled per length (rows) and depth (columns)\n"
           "  --passkey-lengths L,...  sequence lengths in tokens, at most model.max_seq_len\n"
           "                  (default: train.seq_len / 4, / 2 and seq_len, those that hold the prompt)\n"
           "  --passkey-depths D,...   where the key sits, fractions of the filler in [0, 1]\n"
           "                  (default 0,0.25,0.5,0.75,1)\n"
           "  --passkey-trials N       keys per cell (default 5), the same keys in every cell\n"
           "  --seed S        draws the keys (default 1337)\n");
}

int cli_eval_main(int argc, char **argv) {
    const char *ckpt = NULL, *data = NULL, *device = NULL, *json = NULL, *passkey_only = NULL;
    long long tokens = 0;
    int per_position = 0, passkey = 0;
    PasskeyArgs pk = {.n_lengths = 0, .depths = {0, 0.25, 0.5, 0.75, 1}, .n_depths = 5, .trials = 5, .seed = 1337};
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            usage();
            return EXIT_OK;
        }
        const char *a = argv[i];
        if (strncmp(a, "--passkey-", 10) == 0 || strcmp(a, "--seed") == 0) passkey_only = a;
        if (strcmp(a, "--checkpoint") == 0) ckpt = cli_opt_value(argc, argv, &i);
        else if (strcmp(a, "--data") == 0) data = cli_opt_value(argc, argv, &i);
        else if (strcmp(a, "--tokens") == 0) tokens = cli_parse_long("--tokens", cli_opt_value(argc, argv, &i), 1, 1L << 62);
        else if (strcmp(a, "--device") == 0) device = cli_device_arg(argc, argv, &i);
        else if (strcmp(a, "--per-position") == 0) per_position = 1;
        else if (strcmp(a, "--json") == 0) json = cli_opt_value(argc, argv, &i);
        else if (strcmp(a, "--passkey") == 0) passkey = 1;
        else if (strcmp(a, "--passkey-lengths") == 0)
            pk.n_lengths = parse_list(a, cli_opt_value(argc, argv, &i), pk.lengths, NULL, 1L << 30);
        else if (strcmp(a, "--passkey-depths") == 0)
            pk.n_depths = parse_list(a, cli_opt_value(argc, argv, &i), NULL, pk.depths, 0);
        else if (strcmp(a, "--passkey-trials") == 0) pk.trials = (int)cli_parse_long(a, cli_opt_value(argc, argv, &i), 1, 100000);
        else if (strcmp(a, "--seed") == 0) pk.seed = cli_parse_long(a, cli_opt_value(argc, argv, &i), 0, 1L << 62);
        else fatal(EXIT_USAGE, "eval: unknown argument '%s' (train_gpt eval --help)", a);
    }
    if (!ckpt) fatal(EXIT_USAGE, "eval: --checkpoint DIR is required");
    if (passkey_only && !passkey) fatal(EXIT_USAGE, "eval: %s needs --passkey", passkey_only);
    if (passkey) {
        if (data || tokens || per_position)
            fatal(EXIT_USAGE, "eval: --passkey builds its own prompts: drop --data, --tokens and --per-position");
        eval_passkey(ckpt, device, &pk, json);
        return EXIT_OK;
    }
    if (!data) fatal(EXIT_USAGE, "eval: --data SHARD_PATTERN is required (or --passkey)");
    if (json && !per_position) fatal(EXIT_USAGE, "eval: --json FILE needs --per-position or --passkey");
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
