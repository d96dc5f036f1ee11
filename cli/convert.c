// cli/convert: the `export` and `import` subcommands: their options, then the converters
// (convert/convert.h) do the work and this file prints the result or the error.
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "common/check.h"
#include "convert/convert.h"

static void usage_export(FILE *f) {
    fprintf(f,
            "usage: train_gpt export --checkpoint DIR --format hf --out DIR\n"
            "Writes a Hugging Face model directory (model.safetensors in fp32, config.json) in the\n"
            "architecture that computes the model exactly: learned positions -> GPT2LMHeadModel;\n"
            "RoPE (with grouped-query attention and/or one sliding window on every layer) ->\n"
            "Starcoder2ForCausalLM; partial RoPE (model.rope_dims) -> GPTNeoXForCausalLM. ALiBi and\n"
            "the other combinations are refused with the reason. --out must not exist.\n");
}

static void usage_import(FILE *f) {
    fprintf(f,
            "usage: train_gpt import --from llmc FILE.bin --out DIR [--tokenizer FILE]\n"
            "       train_gpt import --from hf DIR --out DIR [--tokenizer FILE]\n"
            "Turns a model into a flashgpt checkpoint directory DIR (step 0, zero optimizer moments),\n"
            "which eval, sample and export read directly.\n"
            "  --from llmc FILE.bin  llm.c's model file (magic 20240326; version 3 fp32 or 5 bf16)\n"
            "  --from hf DIR         a Hugging Face gpt2, starcoder2 or gpt_neox directory (its\n"
            "                        model_type): config.json, model.safetensors (F32, BF16, F16;\n"
            "                        names with or without the model's prefix)\n"
            "  --out DIR             the new checkpoint directory (must not exist)\n"
            "  --tokenizer FILE      an llm.c tokenizer file to store in the checkpoint, so sample\n"
            "                        prints text (e.g. llm.c's gpt2_tokenizer.bin)\n"
            "To fine-tune, import to RUN_DIR/ckpt_00000000 and train with log.dir = RUN_DIR and the\n"
            "same model.* keys: the run resumes from the imported weights.\n");
}

int cli_export_main(int argc, char **argv) {
    const char *ckpt = NULL, *format = NULL, *out = NULL;
    if (cli_has_help(argc, argv)) {
        usage_export(stdout);
        return EXIT_OK;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char **dst = strcmp(a, "--checkpoint") == 0 ? &ckpt
                           : strcmp(a, "--format") == 0   ? &format
                           : strcmp(a, "--out") == 0      ? &out
                                                          : NULL;
        if (!dst) fatal(EXIT_USAGE, "export: unknown argument '%s' (train_gpt export --help)", a);
        if (i + 1 >= argc) fatal(EXIT_USAGE, "export: %s needs a value", a);
        *dst = argv[++i];
    }
    if (!ckpt || !format || !out)
        fatal(EXIT_USAGE, "export: --checkpoint DIR, --format hf and --out DIR are required");
    if (strcmp(format, "hf") != 0) fatal(EXIT_USAGE, "export: --format '%s': the one format is hf", format);
    char err[ERR_LEN];
    Config c;
    const char *arch = "";
    const int rc = convert_export_hf(ckpt, out, &c, &arch, err, sizeof err);
    if (rc != EXIT_OK) fatal(rc, "export: %s", err);
    printf("exported %s to %s (Hugging Face %s: %d layers, %d heads, %d key/value heads, width %d, "
           "vocab %d, positions %d)\n", ckpt, out, arch, c.model.n_layer, c.model.n_head, c.model.n_kv_head,
           c.model.n_embd, c.model.vocab_size, c.model.max_seq_len);
    return EXIT_OK;
}

int cli_import_main(int argc, char **argv) {
    const char *from = NULL, *src = NULL, *out = NULL, *tokenizer = NULL;
    if (cli_has_help(argc, argv)) {
        usage_import(stdout);
        return EXIT_OK;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int is_from = strcmp(a, "--from") == 0;
        if (!is_from && strcmp(a, "--out") != 0 && strcmp(a, "--tokenizer") != 0)
            fatal(EXIT_USAGE, "import: unknown argument '%s' (train_gpt import --help)", a);
        if (i + 1 >= argc || (is_from && i + 2 >= argc))
            fatal(EXIT_USAGE, "import: %s needs %s", a, is_from ? "a kind and a path: --from llmc FILE.bin "
                                                                   "or --from hf DIR" : "a value");
        if (is_from) from = argv[++i], src = argv[++i];
        else if (strcmp(a, "--out") == 0) out = argv[++i];
        else tokenizer = argv[++i];
    }
    if (!from) fatal(EXIT_USAGE, "import: --from llmc FILE.bin or --from hf DIR is required");
    char err[ERR_LEN];
    Config c;
    double n_params = 0;
    const int rc = convert_import(from, src, out, tokenizer, &c, &n_params, err, sizeof err);
    if (rc != EXIT_OK) fatal(rc, "import: %s", err);
    printf("imported %s (%d layers, %d heads, width %d, vocab %d, max_seq_len %d, %.2fM parameters) "
           "into %s\n", src, c.model.n_layer, c.model.n_head, c.model.n_embd, c.model.vocab_size,
           c.model.max_seq_len, n_params / 1e6, out);
    return EXIT_OK;
}
