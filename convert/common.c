// interop: the parts the llm.c and Hugging Face converters share: the `import` subcommand, the
// config of an imported model, a model held on the CPU with a host copy of its weights, dtype
// conversion, and output directories that appear only when complete.
#include "convert/convert.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/check.h"
#include "common/fileio.h"
#include "common/rng.h"
#include "data/tokenizer.h"
#include "trainer/checkpoint.h"


// ----------------------------------------------------------------------------------------------
// the imported model's config and the host model

static int set_key(Config *c, const char *key, long long value, const char *source, char *err,
                   size_t errlen) {
    char kv[128], why[512];
    snprintf(kv, sizeof kv, "%s=%lld", key, value);
    if (config_set(c, kv, why, sizeof why) == 0) return 0;
    return set_error(err, errlen, "%s: the model does not fit flashgpt's config: %s", source, why);
}

int convert_import_config(Config *c, const GPTConfig *g, int window, const char *source, char *err,
                          size_t errlen) {
    config_defaults(c);
    char kv[128], why[512];
    snprintf(kv, sizeof kv, "model.rope_theta=%.9g", (double)g->rope_theta);   // 9 digits: the float back
    if (set_key(c, "model.n_layer", g->L, source, err, errlen) != 0 ||
        set_key(c, "model.n_head", g->NH, source, err, errlen) != 0 ||
        set_key(c, "model.n_kv_head", g->NKV, source, err, errlen) != 0 ||
        set_key(c, "model.n_embd", g->C, source, err, errlen) != 0 ||
        set_key(c, "model.vocab_size", g->V, source, err, errlen) != 0 ||
        set_key(c, "model.max_seq_len", g->maxT, source, err, errlen) != 0 ||
        set_key(c, "model.rope_dims", g->rope_dims, source, err, errlen) != 0 ||
        set_key(c, "attention.window", window, source, err, errlen) != 0 ||
        set_key(c, "train.batch_size", 1, source, err, errlen) != 0 ||
        set_key(c, "train.seq_len", g->maxT < 1024 ? g->maxT : 1024, source, err, errlen) != 0)
        return -1;
    if (config_set(c, kv, why, sizeof why) != 0)
        return set_error(err, errlen, "%s: the model does not fit flashgpt's config: %s", source, why);
    c->model.pos_embedding = g->pos;
    // An imported model comes without training data; the config must still name some, and a run
    // that resumes from this checkpoint uses its own config's data anyway.
    snprintf(c->data.train, sizeof c->data.train, "(imported model: set data.train)");
    if (config_validate(c, why, sizeof why) != 0)
        return set_error(err, errlen, "%s: the model does not fit flashgpt's config: %s", source, why);
    return 0;
}

void convert_model_create(HostModel *hm, const Config *c) {
    hm->cfg = *c;
    hm->be = backend_cpu_create();
    GPTConfig g = gpt_config_from(c);
    hm->model = gpt_create(&g, hm->be, 1, 1, c);
    hm->params = xcalloc(gpt_num_params(hm->model), sizeof(float));
}

int convert_model_load(HostModel *hm, const char *ckpt_dir, char *err, size_t errlen) {
    if (!is_dir(ckpt_dir)) return set_error(err, errlen, "--checkpoint '%s' is not a directory", ckpt_dir);
    Config c;
    if (checkpoint_read_config(ckpt_dir, &c, err, errlen) != 0) return -1;
    convert_model_create(hm, &c);
    if (checkpoint_load(ckpt_dir, hm->model, NULL, NULL, err, errlen) != 0) {
        convert_model_free(hm);
        return -1;
    }
    gpt_get_params_f32(hm->model, hm->params);
    return 0;
}

float *convert_param(HostModel *hm, const char *name, const ParamTensor **t) {
    for (int i = 0; i < gpt_num_tensors(hm->model); i++) {
        const ParamTensor *p = gpt_tensor(hm->model, i);
        if (strcmp(p->name, name) != 0) continue;
        if (t) *t = p;
        return hm->params + p->offset;
    }
    fatal(EXIT_RUNTIME, "interop: the model has no parameter '%s' (a bug in the name mapping)", name);
}

void convert_model_free(HostModel *hm) {
    gpt_free(hm->model);
    hm->be->destroy(hm->be);
    free(hm->params);
    memset(hm, 0, sizeof *hm);
}

// ----------------------------------------------------------------------------------------------
// dtype conversion

static float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
    if (exp == 0x1f) bits = sign | 0x7f800000u | (man << 13);   // inf, NaN
    else if (exp != 0) bits = sign | ((exp + 112u) << 23) | (man << 13);   // rebias 15 -> 127
    else {
        float x = ldexpf((float)man, -24);   // zero and subnormals: man * 2^-24, exact in fp32
        return sign ? -x : x;
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

int convert_to_f32(float *dst, const void *src, DType dt, size_t n) {
    const uint16_t *h = src;
    switch (dt) {
    case DTYPE_F32: memcpy(dst, src, n * sizeof(float)); return 0;
    case DTYPE_BF16:
        for (size_t i = 0; i < n; i++) {
            uint32_t bits = (uint32_t)h[i] << 16;   // bf16 is the top half of an fp32: exact
            memcpy(&dst[i], &bits, sizeof bits);
        }
        return 0;
    case DTYPE_F16:
        for (size_t i = 0; i < n; i++) dst[i] = f16_to_f32(h[i]);
        return 0;
    default: return -1;
    }
}

// ----------------------------------------------------------------------------------------------
// output directories

// Splits path (trailing slashes ignored) into its parent directory and last component.
static void split_path(const char *path, char *parent, size_t plen, char *base, size_t blen) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    size_t n = strlen(buf);
    while (n > 1 && buf[n - 1] == '/') buf[--n] = '\0';
    char *slash = strrchr(buf, '/');
    if (!slash) {
        snprintf(parent, plen, ".");
        snprintf(base, blen, "%s", buf);
    } else {
        snprintf(base, blen, "%s", slash + 1);
        if (slash == buf) snprintf(parent, plen, "/");
        else snprintf(parent, plen, "%.*s", (int)(slash - buf), buf);
    }
}

int convert_check_out(const char *out, char *err, size_t errlen) {
    if (!out || !*out) return set_error(err, errlen, "--out DIR is required");
    char parent[4096], base[1024];
    split_path(out, parent, sizeof parent, base, sizeof base);
    if (!*base || strcmp(base, ".") == 0 || strcmp(base, "..") == 0 || strcmp(base, "/") == 0)
        return set_error(err, errlen, "--out '%s': name a new directory", out);
    struct stat st;
    if (lstat(out, &st) == 0)
        return set_error(err, errlen, "--out '%s' already exists: remove it or choose a new directory", out);
    if (path_exists(parent) && !is_dir(parent))
        return set_error(err, errlen, "--out '%s': '%s' is not a directory", out, parent);
    return 0;
}

int convert_make_tmp(const char *out, const char *what, char *tmp, size_t tmp_len, char *err,
                     size_t errlen) {
    char parent[4096], base[1024];
    split_path(out, parent, sizeof parent, base, sizeof base);
    if (mkdir_p(parent, err, errlen) != 0) return -1;
    snprintf(tmp, tmp_len, "%s/.%s-%s.%d", parent, what, base, (int)getpid());
    remove_tree(tmp);
    return mkdir_p(tmp, err, errlen);
}

int convert_publish(const char *tmp, const char *out, char *err, size_t errlen) {
    fsync_dir(tmp);
    if (rename(tmp, out) != 0) {
        int e = errno;
        remove_tree(tmp);
        return set_error(err, errlen, "cannot rename '%s' to '%s': %s", tmp, out, strerror(e));
    }
    char parent[4096], base[1024];
    split_path(out, parent, sizeof parent, base, sizeof base);
    fsync_dir(parent);
    return 0;
}

// ----------------------------------------------------------------------------------------------
// import

// The tokenizer file must load (data/tokenizer.h checks llm.c's format) and cover the model's
// vocabulary.
static int check_tokenizer(const char *path, int V, char *err, size_t errlen) {
    char why[ERR_LEN];
    Tokenizer *t = tokenizer_load(path, why, sizeof why);
    if (!t) return set_error(err, errlen, "--tokenizer: %s", why);
    const int n = tokenizer_vocab_size(t);
    tokenizer_free(t);
    if (n != V)
        return set_error(err, errlen, "--tokenizer '%s' has %d tokens but the model's vocabulary has %d",
                         path, n, V);
    return 0;
}

static int save_imported(HostModel *hm, const char *out, char *err, size_t errlen) {
    char tmp[4096], ckpt[4096];
    if (convert_make_tmp(out, "import", tmp, sizeof tmp, err, errlen) != 0) return -1;
    GPT *m = hm->model;
    gpt_set_params_f32(m, hm->params);
    int rc = checkpoint_save_initial(tmp, m, &hm->cfg, ckpt, sizeof ckpt, err, errlen);
    if (rc == 0) rc = convert_publish(ckpt, out, err, errlen);
    remove_tree(tmp);
    return rc;
}

int convert_import(const char *from, const char *src, const char *out, const char *tokenizer,
                   Config *c, double *n_params, char *err, size_t errlen) {
    if (strcmp(from, "llmc") != 0 && strcmp(from, "hf") != 0)
        return set_error(err, errlen, "--from '%s': expected llmc or hf", from), EXIT_USAGE;
    if (convert_check_out(out, err, errlen) != 0) return EXIT_USAGE;
    HostModel hm;
    int rc = strcmp(from, "llmc") == 0 ? convert_read_llmc(src, &hm, err, errlen)
                                       : convert_read_hf(src, &hm, err, errlen);
    if (rc != 0) return EXIT_USAGE;
    if (tokenizer) {
        if (strlen(tokenizer) >= sizeof hm.cfg.data.tokenizer)
            rc = set_error(err, errlen, "--tokenizer: the path is longer than %d bytes", CFG_PATH_MAX - 1);
        else
            rc = check_tokenizer(tokenizer, hm.cfg.model.vocab_size, err, errlen);
        if (rc != 0) {
            convert_model_free(&hm);
            return EXIT_USAGE;
        }
        snprintf(hm.cfg.data.tokenizer, sizeof hm.cfg.data.tokenizer, "%s", tokenizer);
    }
    *c = hm.cfg;
    *n_params = (double)gpt_num_params(hm.model);
    char why[ERR_LEN];
    rc = EXIT_OK;
    if (save_imported(&hm, out, why, sizeof why) != 0) {
        set_error(err, errlen, "writing '%s' failed: %s (no partial output was kept)", out, why);
        rc = EXIT_RUNTIME;
    }
    convert_model_free(&hm);
    return rc;
}
