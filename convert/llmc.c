// convert_llmc: reads llm.c's model file (train_gpt2.py's write_model) into a HostModel.
//
// Format: a header of 256 little-endian int32 [0] magic 20240326, [1] version (3: fp32
// parameters, 5: bf16), [2] maxT, [3] V, [4] L, [5] NH, [6] C, [7] Vp (the vocabulary padded for
// the matmuls), then the parameters back to back in this order, every Linear weight (out, in)
// as in PyTorch and so as in model/gpt.c:
//   wte (Vp, C), wpe (maxT, C), then for each of the 12 per-layer kinds all L layers stacked:
//   ln1.w (L, C), ln1.b (L, C), qkv.w (L, 3C, C), qkv.b (L, 3C), proj.w (L, C, C), proj.b (L, C),
//   ln2.w (L, C), ln2.b (L, C), fc.w (L, 4C, C), fc.b (L, 4C), fcproj.w (L, C, 4C), fcproj.b (L, C),
//   lnf.w (C), lnf.b (C).
// The per-layer kinds come in the same order as model/gpt.c's per-layer tensors.
#include "convert/convert.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/check.h"
#include "data/shard.h"
#include "data/tokenizer.h"

#define LLMC_MAGIC 20240326
#define LLMC_HEADER_INTS 256
#define LLMC_V_FP32 3
#define LLMC_V_BF16 5
#define READ_CHUNK (1 << 20)   // elements converted per fread

static const char *const LAYER_KINDS[] = {
    "ln1.weight", "ln1.bias", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight", "attn.proj.bias",
    "ln2.weight", "ln2.bias", "mlp.fc.weight", "mlp.fc.bias", "mlp.proj.weight", "mlp.proj.bias"};
#define N_LAYER_KINDS ((int)(sizeof LAYER_KINDS / sizeof LAYER_KINDS[0]))

// What other llm.c magics mean, so a user who passed the wrong file learns which one it was.
static const char *magic_hint(int32_t magic) {
    switch (magic) {
    case SHARD_MAGIC_U16: return " (this is an llm.c token shard)";
    case SHARD_MAGIC_U32: return " (this is an llm.c token shard with uint32 tokens)";
    case TOKENIZER_MAGIC: return " (this is an llm.c tokenizer file)";
    case 20240327: return " (this is an llm.c debug state file)";
    default: return "";
    }
}

// Reads n parameters of the file's dtype into fp32 dst. Returns 0, or -1 on a short read.
static int read_params(FILE *f, float *dst, size_t n, int bf16) {
    if (!bf16) return fread(dst, sizeof(float), n, f) == n ? 0 : -1;
    uint16_t *buf = xmalloc(READ_CHUNK * sizeof(uint16_t));
    int rc = 0;
    for (size_t done = 0; done < n && rc == 0; done += READ_CHUNK) {
        size_t k = n - done < READ_CHUNK ? n - done : READ_CHUNK;
        if (fread(buf, sizeof(uint16_t), k, f) != k) rc = -1;
        else convert_to_f32(dst + done, buf, DTYPE_BF16, k);
    }
    free(buf);
    return rc;
}

// Streams every parameter of the file (positioned after the header) into hm.
static int read_all(FILE *f, HostModel *hm, int Vp_file, int bf16) {
    const GPTConfig *g = gpt_cfg(hm->model);
    const ParamTensor *t;
    // wte: the file's Vp rows, of which the first V are real; our padding rows stay 0.
    float *wte_file = xmalloc((size_t)Vp_file * g->C * sizeof(float));   // (Vp_file, C)
    int rc = read_params(f, wte_file, (size_t)Vp_file * g->C, bf16);
    memcpy(convert_param(hm, "wte", NULL), wte_file, (size_t)g->V * g->C * sizeof(float));
    free(wte_file);
    float *p = convert_param(hm, "wpe", &t);
    if (rc == 0) rc = read_params(f, p, t->numel, bf16);
    char name[64];
    for (int k = 0; k < N_LAYER_KINDS && rc == 0; k++)
        for (int l = 0; l < g->L && rc == 0; l++) {
            snprintf(name, sizeof name, "h.%d.%s", l, LAYER_KINDS[k]);
            p = convert_param(hm, name, &t);
            rc = read_params(f, p, t->numel, bf16);
        }
    p = convert_param(hm, "lnf.weight", &t);
    if (rc == 0) rc = read_params(f, p, t->numel, bf16);
    p = convert_param(hm, "lnf.bias", &t);
    if (rc == 0) rc = read_params(f, p, t->numel, bf16);
    return rc;
}

int convert_read_llmc_stream(FILE *f, long long size, const char *path, HostModel *hm, char *err,
                             size_t errlen) {
    int32_t h[LLMC_HEADER_INTS];
    if (fread(h, sizeof(int32_t), LLMC_HEADER_INTS, f) != LLMC_HEADER_INTS)
        return set_error(err, errlen, "'%s' is shorter than llm.c's %d-byte header (%lld bytes)", path,
                         (int)sizeof h, size);
    if (h[0] != LLMC_MAGIC)
        return set_error(err, errlen, "'%s': bad magic %d, expected %d for an llm.c model file%s", path,
                         h[0], LLMC_MAGIC, magic_hint(h[0]));
    if (h[1] != LLMC_V_FP32 && h[1] != LLMC_V_BF16)
        return set_error(err, errlen, "'%s': unsupported version %d: expected %d (fp32) or %d (bf16)", path,
                         h[1], LLMC_V_FP32, LLMC_V_BF16);
    GPTConfig g = {.pos = POS_LEARNED, .rope_theta = 10000.0f};   // the rest is set below
    g.maxT = h[2], g.V = h[3], g.L = h[4], g.NH = g.NKV = h[5], g.C = h[6];
    const int Vp_file = h[7];
    if (g.maxT < 1 || g.V < 2 || g.L < 1 || g.NH < 1 || g.C < 1 || Vp_file < g.V)
        return set_error(err, errlen, "'%s': bad header: maxT %d, V %d, L %d, NH %d, C %d, Vp %d (need all "
                                      "positive, V >= 2 and Vp >= V)", path, g.maxT, g.V, g.L, g.NH, g.C,
                         Vp_file);
    // The config table's ranges come first: they also keep the size arithmetic below in range.
    Config c;
    if (convert_import_config(&c, &g, -1, path, err, errlen) != 0) return -1;
    const int bf16 = h[1] == LLMC_V_BF16;
    const long long C = g.C, L = g.L;
    const long long n_params = ((long long)Vp_file + g.maxT) * C + L * (12 * C * C + 13 * C) + 2 * C;
    const long long expect = (long long)sizeof h + n_params * (bf16 ? 2 : 4);
    if (size != expect)
        return set_error(err, errlen, "'%s': the file has %lld bytes but its header (maxT %d, V %d, Vp %d, "
                                      "L %d, NH %d, C %d, %s) describes %lld: truncated or not written "
                                      "by llm.c",
                         path, size, g.maxT, g.V, Vp_file, g.L, g.NH, g.C, bf16 ? "bf16" : "fp32", expect);
    convert_model_create(hm, &c);
    if (read_all(f, hm, Vp_file, bf16) != 0) {
        convert_model_free(hm);
        return set_error(err, errlen, "'%s': read error (the file changed while it was read?)", path);
    }
    return 0;
}

int convert_read_llmc(const char *path, HostModel *hm, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) return set_error(err, errlen, "cannot open llm.c model file '%s': %s", path, strerror(errno));
    struct stat st;
    int rc;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode))
        rc = set_error(err, errlen, "'%s' is not a regular file", path);
    else
        rc = convert_read_llmc_stream(f, (long long)st.st_size, path, hm, err, errlen);
    fclose(f);
    return rc;
}
