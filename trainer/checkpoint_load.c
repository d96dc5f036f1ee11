// checkpoint_load: reading checkpoint directories. Every file is read whole and checked against
// the size and SHA-256 that state.json records before any of it is parsed or used, so a damaged
// file is reported as such and never half-loaded.
#include "trainer/checkpoint.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/digest.h"
#include "common/safetensors.h"
#include "dist/comm.h"
#include "trainer/ckpt_state.h"

// state.json of checkpoint dir, parsed and verified (ckpt_state.h).
static int read_state(const char *dir, CkptState *s, char *err, size_t errlen) {
    char path[4096], why[ERR_LEN];
    snprintf(path, sizeof path, "%s/state.json", dir);
    size_t len;
    char *text = read_file(path, &len, why, sizeof why);
    if (!text)
        return set_error(err, errlen, "checkpoint %s has no readable state.json (%s): it is incomplete "
                                      "or damaged; remove it to resume from an older one", dir, why);
    int rc = ckpt_state_parse(text, len, dir, s, err, errlen);
    free(text);
    return rc;
}

// File `name` of checkpoint dir, whole (malloc'ed, *len bytes), after checking it against the
// digest state.json records (when it records digests).
static char *read_verified(const char *dir, const CkptState *s, const char *name, size_t *len,
                           char *err, size_t errlen) {
    char path[4096], why[ERR_LEN];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    const FileDigest *want = s->checked ? ckpt_state_digest(s, name) : NULL;
    if (s->checked && !want) {
        set_error(err, errlen, "checkpoint %s: %s is not recorded in state.json: the checkpoint is "
                               "damaged or was assembled from parts of others", dir, name);
        return NULL;
    }
    char *data = read_file(path, len, why, sizeof why);
    if (!data) {
        set_error(err, errlen, "checkpoint %s: %s cannot be read (%s): the checkpoint is incomplete",
                  dir, name, why);
        return NULL;
    }
    if (!want) return data;
    FileDigest got;
    sha256_buffer(data, *len, &got);
    if (got.size != want->size)
        set_error(err, errlen, "checkpoint %s: %s is corrupt (%llu bytes, state.json records %llu: "
                               "truncated or overwritten)", dir, name, (unsigned long long)got.size,
                  (unsigned long long)want->size);
    else if (strcmp(got.sha256, want->sha256) != 0)
        set_error(err, errlen, "checkpoint %s: %s is corrupt (checksum mismatch)", dir, name);
    else
        return data;
    free(data);
    return NULL;
}

// A safetensors file of the checkpoint, verified and parsed into f.
static int read_tensors(const char *dir, const CkptState *s, const char *name, StFile *f,
                        char *err, size_t errlen) {
    size_t len;
    char *data = read_verified(dir, s, name, &len, err, errlen);
    if (!data) return -1;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return st_read_buffer(f, data, len, path, err, errlen);
}

int checkpoint_read_config(const char *dir, Config *c, char *err, size_t errlen) {
    CkptState s;
    if (read_state(dir, &s, err, errlen) != 0) return -1;
    char origin[4096 + 32];
    snprintf(origin, sizeof origin, "%s/state.json", dir);
    config_defaults(c);
    int rc = config_load_json(c, s.config_json, origin, err, errlen);
    if (rc == 0) rc = config_validate(c, err, errlen);
    ckpt_state_free(&s);
    return rc;
}

// master (host fp32, gpt_num_params) or NULL also receives the weights.
static int load_model(const char *dir, const CkptState *s, GPT *m, float *master, char *err,
                      size_t errlen) {
    StFile f;
    if (read_tensors(dir, s, "model.safetensors", &f, err, errlen) != 0) return -1;
    float *host = xmalloc(gpt_num_params(m) * sizeof(float));
    int rc = 0;
    for (int i = 0; i < gpt_num_tensors(m) && rc == 0; i++) {
        const ParamTensor *t = gpt_tensor(m, i);
        const StTensor *st = st_find(&f, t->name);
        if (!st) rc = set_error(err, errlen, "checkpoint %s: model.safetensors: tensor '%s' is missing", dir, t->name);
        else if (st->dtype != DTYPE_F32 || st->nbytes != t->numel * sizeof(float))
            rc = set_error(err, errlen, "checkpoint %s: model.safetensors: tensor '%s' has the wrong dtype "
                                     "or size (expected F32 with %zu elements)", dir, t->name, t->numel);
        else memcpy(host + t->offset, st->data, st->nbytes);
    }
    if (rc == 0) gpt_set_params_f32(m, host);
    if (rc == 0 && master) memcpy(master, host, gpt_num_params(m) * sizeof(float));
    free(host);
    st_free(&f);
    return rc;
}

// One rank's file of a checkpoint written by `world` ranks: copies the part of its moments that
// falls into [lo, lo + count) of the flat vector into m, v (relative to lo); returns the number of
// elements copied, or -1 with err set.
static long long load_optimizer_file(const char *dir, const CkptState *s, int rank, int world,
                                     size_t total, size_t lo, size_t count, OptimState *opt,
                                     char *err, size_t errlen) {
    size_t off, len;
    comm_shard(total, world, rank, &off, &len, NULL);
    const size_t a = off > lo ? off : lo, b = off + len < lo + count ? off + len : lo + count;
    if (a >= b) return 0;
    char name[64];
    snprintf(name, sizeof name, "optimizer_rank%d.safetensors", rank);
    StFile f;
    if (read_tensors(dir, s, name, &f, err, errlen) != 0) return -1;
    const StTensor *m = st_find(&f, "m"), *v = st_find(&f, "v");
    const char *t = st_meta(&f, "t"), *file_off = st_meta(&f, "offset");
    long long rc = (long long)(b - a);
    if (!m || !v || !t || m->dtype != DTYPE_F32 || v->dtype != DTYPE_F32 ||
        m->nbytes != len * sizeof(float) || v->nbytes != len * sizeof(float) ||
        (file_off ? strtoull(file_off, NULL, 10) : 0) != off) {
        rc = set_error(err, errlen,
                       "checkpoint %s: %s: expected F32 tensors m and v of %zu elements at offset %zu "
                       "(rank %d of %d) and metadata t", dir, name, len, off, rank, world);
    } else {
        memcpy(opt->m + (a - lo), (const char *)m->data + (a - off) * sizeof(float), (b - a) * sizeof(float));
        memcpy(opt->v + (a - lo), (const char *)v->data + (a - off) * sizeof(float), (b - a) * sizeof(float));
        opt->t = strtoll(t, NULL, 10);
    }
    st_free(&f);
    return rc;
}

// The moments of opt's shard from the optimizer_rank<R> files of a checkpoint written by
// `world` ranks: any world size, since every file's place follows from comm_shard.
static int load_optimizer(const char *dir, const CkptState *s, OptimState *opt, char *err,
                          size_t errlen) {
    const int world = s->train.world_size;
    const size_t lo = opt->shard_n ? opt->shard_offset : 0;
    const size_t count = opt->shard_n ? opt->shard_n : opt->n;
    size_t filled = 0;
    for (int r = 0; r < world && filled < count; r++) {
        const long long k = load_optimizer_file(dir, s, r, world, opt->n, lo, count, opt, err, errlen);
        if (k < 0) return -1;
        filled += (size_t)k;
    }
    CHECK(filled == count);  // the shards of `world` ranks tile the vector
    return 0;
}

int checkpoint_load(const char *dir, GPT *m, OptimState *opt, TrainState *st, char *err,
                    size_t errlen) {
    if (opt && opt->n != gpt_num_params(m))
        return set_error(err, errlen, "checkpoint: optimizer state has %zu elements, the model %zu",
                         opt->n, gpt_num_params(m));
    CkptState s;
    if (read_state(dir, &s, err, errlen) != 0) return -1;
    if (!s.checked)
        fprintf(stderr, "notice: checkpoint %s was written without checksums (%s): its files are "
                        "loaded unverified\n", dir, CKPT_STATE_FORMAT_UNCHECKED);
    int rc = load_model(dir, &s, m, opt ? opt->master : NULL, err, errlen);
    if (rc == 0 && opt) rc = load_optimizer(dir, &s, opt, err, errlen);
    if (rc == 0 && st) *st = s.train;
    ckpt_state_free(&s);
    return rc;
}

int checkpoint_verify_file(const char *dir, const char *name, char *err, size_t errlen) {
    CkptState s;
    if (read_state(dir, &s, err, errlen) != 0) return -1;
    size_t len;
    char *data = read_verified(dir, &s, name, &len, err, errlen);
    const int rc = data ? 0 : -1;
    ckpt_state_free(&s);
    free(data);
    return rc;
}
