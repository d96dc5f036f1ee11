#include "trainer/checkpoint.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/check.h"
#include "common/fileio.h"
#include "common/rng.h"
#include "common/safetensors.h"
#include "dist/comm.h"

#define CKPT_PREFIX "ckpt_"

// weights (host fp32, gpt_num_params) or NULL for the model's own parameters.
static int write_model(const char *dir, GPT *m, const float *weights, const Config *c, char *err,
                       size_t errlen) {
    float *copy = NULL;
    if (!weights) {
        copy = xmalloc(gpt_num_params(m) * sizeof(float));
        gpt_get_params_f32(m, copy);
        weights = copy;
    }
    StFile f;
    st_init(&f);
    for (int i = 0; i < gpt_num_tensors(m); i++) {
        const ParamTensor *t = gpt_tensor(m, i);
        int64_t shape[2] = {t->shape[0], t->shape[1]};
        st_add(&f, t->name, DTYPE_F32, t->ndim, shape, weights + t->offset);
    }
    char *cfg = config_to_json(c);
    st_set_meta(&f, "format", "flashgpt");
    st_set_meta(&f, "config", cfg);
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    int rc = st_write(&f, path, err, errlen);
    free(cfg);
    st_free(&f);
    free(copy);
    return rc;
}

// This rank's shard of the moments, with its place in the flat vector as metadata (offset,
// total), so a loader can check it against the layout it expects.
static int write_optimizer(const char *dir, const OptimState *opt, int rank, char *err,
                           size_t errlen) {
    const size_t count = opt->shard_n ? opt->shard_n : opt->n;
    StFile f;
    st_init(&f);
    int64_t n = (int64_t)count;
    st_add(&f, "m", DTYPE_F32, 1, &n, opt->m);
    st_add(&f, "v", DTYPE_F32, 1, &n, opt->v);
    char t[32], off[32], total[32];
    snprintf(t, sizeof t, "%lld", opt->t);
    snprintf(off, sizeof off, "%zu", opt->shard_offset);
    snprintf(total, sizeof total, "%zu", opt->n);
    st_set_meta(&f, "t", t);
    st_set_meta(&f, "offset", off);
    st_set_meta(&f, "total", total);
    char path[4096];
    snprintf(path, sizeof path, "%s/optimizer_rank%d.safetensors", dir, rank);
    int rc = st_write(&f, path, err, errlen);
    st_free(&f);
    return rc;
}

static cJSON *u64_array(const uint64_t *x, int n) {
    // JSON numbers are doubles: 64-bit words travel as hex strings to stay exact.
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) {
        char s[32];
        snprintf(s, sizeof s, "%016" PRIx64, x[i]);
        cJSON_AddItemToArray(a, cJSON_CreateString(s));
    }
    return a;
}

static int read_u64_array(const cJSON *a, uint64_t *x, int n) {
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != n) return -1;
    for (int i = 0; i < n; i++) {
        const cJSON *s = cJSON_GetArrayItem(a, i);
        if (!cJSON_IsString(s)) return -1;
        char *end;
        x[i] = strtoull(s->valuestring, &end, 16);
        if (*end != '\0') return -1;
    }
    return 0;
}

static int write_state(const char *dir, const TrainState *st, const Config *c, char *err,
                       size_t errlen) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "format", "flashgpt-state-1");
    cJSON_AddNumberToObject(o, "step", (double)st->step);
    cJSON_AddNumberToObject(o, "tokens_seen", (double)st->tokens_seen);
    cJSON_AddNumberToObject(o, "world_size", st->world_size);
    cJSON_AddItemToObject(o, "rng", u64_array(st->rng, 4));
    cJSON_AddItemToObject(o, "data", u64_array(st->data, 3));
    cJSON *sc = cJSON_AddObjectToObject(o, "loss_scaler");
    cJSON_AddNumberToObject(sc, "scale", st->scaler.scale);
    cJSON_AddBoolToObject(sc, "dynamic", st->scaler.dynamic);
    cJSON_AddNumberToObject(sc, "window", st->scaler.window);
    cJSON_AddNumberToObject(sc, "clean_steps", st->scaler.clean_steps);
    cJSON_AddNumberToObject(sc, "skipped", (double)st->scaler.skipped);
    char *cfg = config_to_json(c);
    cJSON_AddItemToObject(o, "config", cJSON_Parse(cfg));
    free(cfg);
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    char path[4096];
    snprintf(path, sizeof path, "%s/state.json", dir);
    int rc = write_file_atomic(path, text, strlen(text), err, errlen);
    cJSON_free(text);
    return rc;
}

static int copy_tokenizer(const char *dir, const Config *c, char *err, size_t errlen) {
    if (c->data.tokenizer[0] == '\0' || !path_exists(c->data.tokenizer)) return 0;
    size_t len;
    char *bytes = read_file_or_die(c->data.tokenizer, &len);
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.bin", dir);
    int rc = write_file_atomic(path, bytes, len, err, errlen);
    free(bytes);
    return rc;
}

// Parses the step out of "ckpt_00001234"; -1 when the name is not a checkpoint's.
static long long ckpt_step(const char *name) {
    if (strncmp(name, CKPT_PREFIX, strlen(CKPT_PREFIX)) != 0) return -1;
    char *end;
    const char *digits = name + strlen(CKPT_PREFIX);
    long long s = strtoll(digits, &end, 10);
    return (*digits && *end == '\0' && s >= 0) ? s : -1;
}

// Steps of the complete checkpoints in run_dir, ascending; returns the count (malloc'ed *steps).
static int list_checkpoints(const char *run_dir, long long **steps) {
    *steps = NULL;
    DIR *d = opendir(run_dir);
    if (!d) return 0;
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        long long s = ckpt_step(e->d_name);
        if (s < 0) continue;
        if (n == cap) *steps = xrealloc(*steps, (size_t)(cap = cap ? 2 * cap : 16) * sizeof **steps);
        (*steps)[n++] = s;
    }
    closedir(d);
    for (int i = 1; i < n; i++)  // insertion sort: a run keeps a handful of checkpoints
        for (int j = i; j > 0 && (*steps)[j - 1] > (*steps)[j]; j--) {
            long long t = (*steps)[j];
            (*steps)[j] = (*steps)[j - 1];
            (*steps)[j - 1] = t;
        }
    return n;
}

int checkpoint_save_initial(const char *run_dir, GPT *m, const Config *c, char *path_out,
                            size_t path_len, char *err, size_t errlen) {
    const size_t n = gpt_num_params(m);
    float *zeros = xcalloc(n ? n : 1, sizeof(float));   // (n) both moments
    const OptimState view = {.n = n, .master = NULL, .m = zeros, .v = zeros, .t = 0};
    TrainState st;
    memset(&st, 0, sizeof st);
    st.world_size = 1;
    Rng rng;
    rng_seed(&rng, (uint64_t)c->train.seed);
    memcpy(st.rng, rng.s, sizeof st.rng);
    scaler_init(&st.scaler, c, 0);
    const int rc = checkpoint_save_state(run_dir, m, &view, &st, c, 1, path_out, path_len, err, errlen);
    free(zeros);
    return rc;
}

int checkpoint_save_state(const char *run_dir, GPT *m, const OptimState *opt, const TrainState *st,
                          const Config *c, int keep, char *path_out, size_t path_len, char *err,
                          size_t errlen) {
    Comm *one = comm_single_create();
    const int rc = checkpoint_save_dist(run_dir, m, opt, st, c, keep, one, path_out, path_len, err,
                                        errlen);
    comm_close(one);
    return rc;
}

// Rank 0's part: the weights, the tokenizer and state.json.
static int write_rank0(const char *dir, GPT *m, const OptimState *opt, const TrainState *st,
                       const Config *c, char *err, size_t errlen) {
    if (write_model(dir, m, opt->master, c, err, errlen) != 0) return -1;
    if (copy_tokenizer(dir, c, err, errlen) != 0) return -1;
    return write_state(dir, st, c, err, errlen);
}

// Rank 0 moves the finished directory tmp into place as final and prunes old checkpoints.
static int publish(const char *run_dir, const char *tmp, const char *final, int keep, char *err,
                   size_t errlen) {
    char old[4200];
    fsync_dir(tmp);
    // A checkpoint of the same step may exist (a resumed run saving again): move it aside first,
    // so there is always one complete copy under some name.
    snprintf(old, sizeof old, "%s.old", tmp);
    int had_old = is_dir(final) && rename(final, old) == 0;
    if (rename(tmp, final) != 0) {
        int e = errno;
        if (had_old) rename(old, final);
        remove_tree(tmp);
        return set_error(err, errlen, "cannot rename '%s' to '%s': %s", tmp, final, strerror(e));
    }
    if (had_old) remove_tree(old);
    fsync_dir(run_dir);
    long long *steps;
    int n = list_checkpoints(run_dir, &steps);
    for (int i = 0; i < n - keep; i++) {
        char victim[4096];
        snprintf(victim, sizeof victim, "%s/" CKPT_PREFIX "%08lld", run_dir, steps[i]);
        remove_tree(victim);
    }
    free(steps);
    return 0;
}

int checkpoint_save_dist(const char *run_dir, GPT *m, const OptimState *opt, const TrainState *st,
                         const Config *c, int keep, Comm *comm, char *path_out, size_t path_len,
                         char *err, size_t errlen) {
    if (opt->n != gpt_num_params(m))
        return set_error(err, errlen, "checkpoint: optimizer state has %zu elements, the model %zu",
                         opt->n, gpt_num_params(m));
    const int rank = comm->rank;
    char tmp[4096], final[4096];
    // One name every rank derives alike; a leftover of a crashed attempt at this step is removed.
    snprintf(tmp, sizeof tmp, "%s/.tmp-" CKPT_PREFIX "%08lld", run_dir, st->step);
    snprintf(final, sizeof final, "%s/" CKPT_PREFIX "%08lld", run_dir, st->step);
    int ok = 1;
    if (rank == 0) {
        remove_tree(tmp);
        ok = mkdir_p(tmp, err, errlen) == 0;
    }
    if (!comm_all_ok(comm, ok))
        return ok ? set_error(err, errlen, "rank 0 could not create '%s'", tmp) : -1;
    // Every rank writes its shard of the optimizer state, rank 0 also the rest; the directory
    // is renamed into place only when every part is written (the checkpoint is complete).
    ok = write_optimizer(tmp, opt, rank, err, errlen) == 0;
    if (ok && rank == 0) ok = write_rank0(tmp, m, opt, st, c, err, errlen) == 0;
    if (!comm_all_ok(comm, ok)) {
        if (rank == 0) remove_tree(tmp);
        return ok ? set_error(err, errlen, "another rank could not write its part of '%s' (its log "
                                           "says why)", tmp) : -1;
    }
    ok = rank != 0 || publish(run_dir, tmp, final, keep, err, errlen) == 0;
    if (!comm_all_ok(comm, ok))
        return ok ? set_error(err, errlen, "rank 0 could not move '%s' into place", tmp) : -1;
    if (path_out) snprintf(path_out, path_len, "%s", final);
    return 0;
}

int checkpoint_find_latest(const char *run_dir, char *path, size_t path_len) {
    long long *steps;
    int n = list_checkpoints(run_dir, &steps);
    if (n > 0) snprintf(path, path_len, "%s/" CKPT_PREFIX "%08lld", run_dir, steps[n - 1]);
    free(steps);
    return n > 0;
}

static cJSON *read_state_json(const char *dir, char *err, size_t errlen) {
    char path[4096];
    snprintf(path, sizeof path, "%s/state.json", dir);
    FILE *f = fopen(path, "rb");
    if (!f) {
        set_error(err, errlen, "checkpoint '%s' has no readable state.json (%s): it is incomplete or "
                            "damaged; remove it to resume from an older one", dir, strerror(errno));
        return NULL;
    }
    fclose(f);
    char *text = read_file_or_die(path, NULL);
    cJSON *o = cJSON_Parse(text);
    free(text);
    if (!o || !cJSON_IsObject(o)) {
        cJSON_Delete(o);
        set_error(err, errlen, "'%s' is not valid JSON: the checkpoint is damaged", path);
        return NULL;
    }
    return o;
}

int checkpoint_read_config(const char *dir, Config *c, char *err, size_t errlen) {
    cJSON *o = read_state_json(dir, err, errlen);
    if (!o) return -1;
    const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(o, "config");
    char *text = cfg ? cJSON_PrintUnformatted(cfg) : NULL;
    cJSON_Delete(o);
    if (!text) return set_error(err, errlen, "%s/state.json has no config", dir);
    char origin[4096 + 32];
    snprintf(origin, sizeof origin, "%s/state.json", dir);
    config_defaults(c);
    int rc = config_load_json(c, text, origin, err, errlen);
    cJSON_free(text);
    if (rc == 0) rc = config_validate(c, err, errlen);
    return rc;
}

static int load_state(const char *dir, TrainState *st, char *err, size_t errlen) {
    cJSON *o = read_state_json(dir, err, errlen);
    if (!o) return -1;
    const cJSON *step = cJSON_GetObjectItemCaseSensitive(o, "step");
    const cJSON *tok = cJSON_GetObjectItemCaseSensitive(o, "tokens_seen");
    const cJSON *ws = cJSON_GetObjectItemCaseSensitive(o, "world_size");
    const cJSON *sc = cJSON_GetObjectItemCaseSensitive(o, "loss_scaler");
    int rc = 0;
    if (!cJSON_IsNumber(step) || !cJSON_IsNumber(tok) || !cJSON_IsNumber(ws) || ws->valueint < 1 ||
        !cJSON_IsObject(sc) ||
        read_u64_array(cJSON_GetObjectItemCaseSensitive(o, "rng"), st->rng, 4) != 0 ||
        read_u64_array(cJSON_GetObjectItemCaseSensitive(o, "data"), st->data, 3) != 0) {
        rc = set_error(err, errlen, "%s/state.json is missing fields or has wrong types: damaged checkpoint", dir);
    } else {
        st->step = (long long)step->valuedouble;
        st->tokens_seen = (long long)tok->valuedouble;
        st->world_size = ws->valueint;
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(sc, "scale");
        const cJSON *dyn = cJSON_GetObjectItemCaseSensitive(sc, "dynamic");
        const cJSON *win = cJSON_GetObjectItemCaseSensitive(sc, "window");
        const cJSON *cl = cJSON_GetObjectItemCaseSensitive(sc, "clean_steps");
        const cJSON *sk = cJSON_GetObjectItemCaseSensitive(sc, "skipped");
        if (!cJSON_IsNumber(s) || !cJSON_IsBool(dyn) || !cJSON_IsNumber(win) || !cJSON_IsNumber(cl) ||
            !cJSON_IsNumber(sk)) {
            rc = set_error(err, errlen, "%s/state.json: loss_scaler is incomplete: damaged checkpoint", dir);
        } else {
            st->scaler.scale = (float)s->valuedouble;
            st->scaler.dynamic = cJSON_IsTrue(dyn);
            st->scaler.window = win->valueint;
            st->scaler.clean_steps = cl->valueint;
            st->scaler.skipped = (long long)sk->valuedouble;
        }
    }
    cJSON_Delete(o);
    return rc;
}

// master (host fp32, gpt_num_params) or NULL also receives the weights.
static int load_model(const char *dir, GPT *m, float *master, char *err, size_t errlen) {
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    StFile f;
    if (st_read(&f, path, err, errlen) != 0) return -1;
    float *host = xmalloc(gpt_num_params(m) * sizeof(float));
    int rc = 0;
    for (int i = 0; i < gpt_num_tensors(m) && rc == 0; i++) {
        const ParamTensor *t = gpt_tensor(m, i);
        const StTensor *s = st_find(&f, t->name);
        if (!s) rc = set_error(err, errlen, "%s: tensor '%s' is missing", path, t->name);
        else if (s->dtype != DTYPE_F32 || s->nbytes != t->numel * sizeof(float))
            rc = set_error(err, errlen, "%s: tensor '%s' has the wrong dtype or size (expected F32 with "
                                     "%zu elements)", path, t->name, t->numel);
        else memcpy(host + t->offset, s->data, s->nbytes);
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
static long long load_optimizer_file(const char *dir, int rank, int world, size_t total, size_t lo,
                                     size_t count, OptimState *opt, char *err, size_t errlen) {
    size_t off, len;
    comm_shard(total, world, rank, &off, &len, NULL);
    const size_t a = off > lo ? off : lo, b = off + len < lo + count ? off + len : lo + count;
    if (a >= b) return 0;
    char path[4096];
    snprintf(path, sizeof path, "%s/optimizer_rank%d.safetensors", dir, rank);
    StFile f;
    if (st_read(&f, path, err, errlen) != 0) return -1;
    const StTensor *m = st_find(&f, "m"), *v = st_find(&f, "v");
    const char *t = st_meta(&f, "t"), *file_off = st_meta(&f, "offset");
    long long rc = (long long)(b - a);
    if (!m || !v || !t || m->dtype != DTYPE_F32 || v->dtype != DTYPE_F32 ||
        m->nbytes != len * sizeof(float) || v->nbytes != len * sizeof(float) ||
        (file_off ? strtoull(file_off, NULL, 10) : 0) != off) {
        rc = set_error(err, errlen,
                       "%s: expected F32 tensors m and v of %zu elements at offset %zu (rank %d "
                       "of %d) and metadata t", path, len, off, rank, world);
    } else {
        memcpy(opt->m + (a - lo), (const float *)m->data + (a - off), (b - a) * sizeof(float));
        memcpy(opt->v + (a - lo), (const float *)v->data + (a - off), (b - a) * sizeof(float));
        opt->t = strtoll(t, NULL, 10);
    }
    st_free(&f);
    return rc;
}

// The moments of opt's shard from the optimizer_rank<R> files of a checkpoint written by
// `world` ranks: any world size, since every file's place follows from comm_shard.
static int load_optimizer(const char *dir, int world, OptimState *opt, char *err, size_t errlen) {
    const size_t lo = opt->shard_n ? opt->shard_offset : 0;
    const size_t count = opt->shard_n ? opt->shard_n : opt->n;
    size_t filled = 0;
    for (int r = 0; r < world; r++) {
        const long long k = load_optimizer_file(dir, r, world, opt->n, lo, count, opt, err, errlen);
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
    if (load_model(dir, m, opt ? opt->master : NULL, err, errlen) != 0) return -1;
    TrainState saved;
    if ((opt || st) && load_state(dir, &saved, err, errlen) != 0) return -1;
    if (opt && load_optimizer(dir, saved.world_size, opt, err, errlen) != 0) return -1;
    if (st) *st = saved;
    return 0;
}
