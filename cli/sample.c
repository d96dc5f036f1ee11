// cli/sample: `train_gpt sample`: text from a checkpoint, with the KV cache.
#include "cli/cli.h"

#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/rng.h"

int cli_sample_main(int argc, char **argv) {
    const char *ckpt = NULL, *prompt = NULL, *device = NULL;
    long n_new = 256, top_k = 0, seed = 1337;
    double temperature = 1.0;
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            printf("usage: train_gpt sample --checkpoint DIR [--prompt TEXT] [--tokens N] [--temperature T]\n"
                   "                        [--top-k K] [--seed S] [--device cpu|cuda]\n"
                   "Generates text with a KV cache (each new token costs one position). Defaults: 256 tokens,\n"
                   "temperature 1.0 (0 = greedy), top-k off, seed 1337.\n");
            return EXIT_OK;
        }
        if (strcmp(argv[i], "--checkpoint") == 0) ckpt = cli_opt_value(argc, argv, &i);
        else if (strcmp(argv[i], "--prompt") == 0) prompt = cli_opt_value(argc, argv, &i);
        else if (strcmp(argv[i], "--tokens") == 0) n_new = cli_parse_long("--tokens", cli_opt_value(argc, argv, &i), 0, 1L << 30);
        else if (strcmp(argv[i], "--temperature") == 0) temperature = cli_parse_double("--temperature", cli_opt_value(argc, argv, &i), 0, 100);
        else if (strcmp(argv[i], "--top-k") == 0) top_k = cli_parse_long("--top-k", cli_opt_value(argc, argv, &i), 0, 1L << 30);
        else if (strcmp(argv[i], "--seed") == 0) seed = cli_parse_long("--seed", cli_opt_value(argc, argv, &i), 0, 1L << 62);
        else if (strcmp(argv[i], "--device") == 0) device = cli_device_arg(argc, argv, &i);
        else fatal(EXIT_USAGE, "sample: unknown argument '%s' (train_gpt sample --help)", argv[i]);
    }
    if (!ckpt) fatal(EXIT_USAGE, "sample: --checkpoint DIR is required");
    Config c;
    Backend *be = cli_open_checkpoint(ckpt, &c, device);
    GPT *m = cli_load_checkpoint_model(ckpt, &c, be, 1, 1);
    Tokenizer *tok = cli_checkpoint_tokenizer(ckpt, &c);
    int n_prompt = 1;
    int *ids = xmalloc(sizeof(int));
    ids[0] = cli_start_token(tok);
    if (prompt && *prompt) {
        if (!tok) fatal(EXIT_USAGE, "sample: --prompt needs a tokenizer, and the checkpoint has none");
        free(ids);
        ids = cli_encode_prompt(tok, prompt, &n_prompt);
    }
    Rng rng;
    rng_seed(&rng, (uint64_t)seed);
    char *head = cli_decode_text(tok, ids, n_prompt);
    char *text = cli_sample_text(m, tok, ids, n_prompt, (int)n_new, (float)temperature, (int)top_k, &rng);
    printf("%s%s\n", prompt ? head : "", text);
    free(head);
    free(text);
    free(ids);
    if (tok) tokenizer_free(tok);
    gpt_free(m);
    be->destroy(be);
    return EXIT_OK;
}
