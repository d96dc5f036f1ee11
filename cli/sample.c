// cli/sample: `train_gpt sample`: text from a checkpoint, with the KV cache.
#include "cli/cli.h"

#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/rng.h"
#include "common/timer.h"
#include "model/generate.h"

int cli_sample_main(int argc, char **argv) {
    const char *ckpt = NULL, *prompt = NULL, *device = NULL;
    long n_new = 256, top_k = 0, seed = 1337, batch = 1, context = 0;
    int split = 1;
    double temperature = 1.0;
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            printf("usage: train_gpt sample --checkpoint DIR [--prompt TEXT] [--tokens N] [--temperature T]\n"
                   "                        [--top-k K] [--seed S] [--batch N] [--no-split] [--context N]\n"
                   "                        [--device cpu|cuda]\n"
                   "Generates text with a KV cache (each new token costs one position). Defaults: 256 tokens,\n"
                   "temperature 1.0 (0 = greedy), top-k off, seed 1337, batch 1. The prompt is prefilled in\n"
                   "a few forward passes (chunks of 4096 tokens), then each new token is one decode step.\n"
                   "--batch N decodes N sequences of the same prompt together, sequence i drawing with seed\n"
                   "S + i (so sequence 0 is the --batch 1 sample), printed in order under '--- sample i ---'\n"
                   "lines. The decode attention runs the split-KV kernel on CUDA; --no-split runs the\n"
                   "training attention kernels instead (for comparisons). Tokens/s goes to stderr: the new\n"
                   "tokens over the decode steps' time, then the prompt's over the prefill's.\n"
                   "--context N times decoding at a context length: the prompt starts at position N over\n"
                   "a cache whose first N positions are left empty (zeros), so the text means nothing.\n"
                   "The KV cache holds N + the prompt + the new tokens positions (at most the model's\n"
                   "max_seq_len) per sequence; a --batch whose caches do not fit the memory exits 2.\n");
            return EXIT_OK;
        }
        if (strcmp(argv[i], "--checkpoint") == 0) ckpt = cli_opt_value(argc, argv, &i);
        else if (strcmp(argv[i], "--prompt") == 0) prompt = cli_opt_value(argc, argv, &i);
        else if (strcmp(argv[i], "--tokens") == 0) n_new = cli_parse_long("--tokens", cli_opt_value(argc, argv, &i), 0, 1L << 30);
        else if (strcmp(argv[i], "--temperature") == 0) temperature = cli_parse_double("--temperature", cli_opt_value(argc, argv, &i), 0, 100);
        else if (strcmp(argv[i], "--top-k") == 0) top_k = cli_parse_long("--top-k", cli_opt_value(argc, argv, &i), 0, 1L << 30);
        else if (strcmp(argv[i], "--seed") == 0) seed = cli_parse_long("--seed", cli_opt_value(argc, argv, &i), 0, 1L << 62);
        else if (strcmp(argv[i], "--batch") == 0) batch = cli_parse_long("--batch", cli_opt_value(argc, argv, &i), 1, 1L << 24);
        else if (strcmp(argv[i], "--no-split") == 0) split = 0;
        else if (strcmp(argv[i], "--context") == 0) context = cli_parse_long("--context", cli_opt_value(argc, argv, &i), 0, 1L << 30);
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
    char *head = cli_decode_text(tok, ids, n_prompt);
    const int B = (int)batch, maxT = gpt_cfg(m)->maxT;
    if (context >= maxT)
        fatal(EXIT_USAGE, "sample: --context %ld leaves no room in model.max_seq_len (%d)", context,
              maxT);
    // The cache holds what this sample feeds: the context, the prompt and the new tokens.
    const long want = context + n_prompt + n_new;
    const int positions = want < maxT ? (int)want : maxT;
    char err[ERR_LEN];
    if (gpt_decode_reserve(m, B, positions, err, sizeof err) != 0)
        fatal(EXIT_USAGE, "sample: --batch %d: %s", B, err);
    gpt_set_decode_split(m, split);
    gpt_decode_seek(m, (int)context);
    Rng *rngs = xmalloc((size_t)B * sizeof(Rng));
    for (int b = 0; b < B; b++) rng_seed(&rngs[b], (uint64_t)seed + (uint64_t)b);
    int *out = xmalloc((size_t)B * (n_new > 0 ? n_new : 1) * sizeof(int));   // (B, n_new)
    const int n_fed = n_prompt < positions - (int)context ? n_prompt : positions - (int)context;
    float *logits = xmalloc((size_t)B * gpt_cfg(m)->V * sizeof(float));   // (B, V)
    const double t0 = now_seconds();
    gpt_decode_prefill(m, ids, n_fed, B, (int)context, logits);
    const double t1 = now_seconds();
    const int n = gpt_generate_from(m, B, (int)context + n_fed, logits, (int)n_new, (float)temperature, (int)top_k,
                                    rngs, out);
    const double dt = now_seconds() - t1, dt_pre = t1 - t0;
    for (int b = 0; b < B; b++) {
        char *text = cli_decode_text(tok, out + (size_t)b * n_new, n);
        if (B > 1) printf("--- sample %d ---\n", b);
        printf("%s%s\n", prompt ? head : "", text);
        free(text);
    }
    fprintf(stderr, "sample: %d x %d tokens (prompt %d) in %.3f s: %.1f tokens/s; prompt of %d tokens prefilled in "
            "%.3f s: %.1f tokens/s\n", B, n, n_prompt, dt, dt > 0 ? (double)B * n / dt : 0.0, n_fed, dt_pre,
            dt_pre > 0 ? n_fed / dt_pre : 0.0);
    free(logits);
    free(out);
    free(rngs);
    free(head);
    free(ids);
    if (tok) tokenizer_free(tok);
    gpt_free(m);
    be->destroy(be);
    return EXIT_OK;
}
