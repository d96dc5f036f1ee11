// checkpoint: writing checkpoint directories (every rank's part, the digests of all of them in
// state.json, the rename into place, pruning) and finding them. Reading is checkpoint_load.c.
#include "trainer/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/digest.h"
#include "common/fileio.h"
#include "common/rng.h"
#include "common/safetensors.h"
#include "dist/comm.h"
#include "trainer/ckpt_state.h"

#define CKPT_PREFIX "ckpt_"
#define TMP_PREFIX ".tmp-" CKPT_PREFIX   // a checkpoint being written
#define TRASH_PREFIX ".trash-"            // a directory being deleted

// weights: host fp32 (gpt_num_params). Touches no backend memory (it may run on a thread of
// its own).
static int write_model(const char *dir, const GPT *m, const float *weights, const Config *c,
                       FileDigest *d, char *err, size_t errlen) {
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
    int rc = st_write_digest(&f, path, d, err, errlen);
    free(cfg);
    st_free(&f);
    return rc;
}

// This rank's shard of the moments, with its place in the flat vector as metadata (offset,
// total), so a loader can check it against the layout it expects.
static int write_optimizer(const char *dir, const OptimState *opt, int rank, FileDigest *d,
                           char *err, size_t errlen) {
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
    int rc = st_write_digest(&f, path, d, err, errlen);
    st_free(&f);
    return rc;
}

// Writes len bytes as dir/name and records their digest under that name.
static int write_recorded(const char *dir, const char *name, const void *data, size_t len,
                          CkptFile *rec, char *err, size_t errlen) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(rec->name, sizeof rec->name, "%s", name);
    sha256_buffer(data, len, &rec->digest);
    return write_file_atomic(path, data, len, err, errlen);
}

// The run's tokenizer file (when the config names one that exists) as tokenizer.bin; *copied
// tells whether there was one.
static int copy_tokenizer(const char *dir, const Config *c, CkptFile *rec, int *copied, char *err,
                          size_t errlen) {
    *copied = 0;
    if (c->data.tokenizer[0] == '\0' || !path_exists(c->data.tokenizer)) return 0;
    size_t len;
    char *bytes = read_file(c->data.tokenizer, &len, err, errlen);
    if (!bytes) return -1;
    int rc = write_recorded(dir, "tokenizer.bin", bytes, len, rec, err, errlen);
    free(bytes);
    *copied = rc == 0;
    return rc;
}

// Every rank's digest of its optimizer file into all (world) on every rank. The digest travels
// as 8 words of 32 bits and the size, each exact in a double, through the host all-reduce of
// sums: every other rank adds zeros.
static void gather_digests(Comm *comm, const FileDigest *mine, FileDigest *all) {
    enum { WORDS = SHA256_HEX_LEN / 8 };
    for (int r = 0; r < comm->world; r++) {
        double v[WORDS + 1] = {0};
        if (r == comm->rank) {
            for (int w = 0; w < WORDS; w++) {
                char hex[9];
                memcpy(hex, mine->sha256 + 8 * w, 8);
                hex[8] = '\0';
                v[w] = (double)strtoul(hex, NULL, 16);
            }
            v[WORDS] = (double)mine->size;
        }
        comm->allreduce_host_f64(comm, v, WORDS + 1);
        for (int w = 0; w < WORDS; w++)
            snprintf(all[r].sha256 + 8 * w, 9, "%08lx", (unsigned long)v[w]);
        all[r].size = (uint64_t)v[WORDS];
    }
}

// Rank 0's files besides state.json: the weights and the tokenizer, with their digests
// (files[0], and files[1] when there is a tokenizer; n their count). It runs on a thread of its
// own beside the optimizer file's write, so it reads only host memory.
typedef struct {
    const char *dir;
    const GPT *m;
    const float *weights;   // host fp32 (gpt_num_params)
    const Config *c;
    CkptFile files[2];
    int n, rc;
    char err[ERR_LEN];
} Rank0Files;

static void *write_rank0_files(void *arg) {
    Rank0Files *w = arg;
    int copied;
    w->n = 0;
    snprintf(w->files[0].name, sizeof w->files[0].name, "model.safetensors");
    w->rc = write_model(w->dir, w->m, w->weights, w->c, &w->files[0].digest, w->err, sizeof w->err);
    if (w->rc != 0) return NULL;
    w->n = 1;
    w->rc = copy_tokenizer(w->dir, w->c, &w->files[1], &copied, w->err, sizeof w->err);
    if (w->rc == 0) w->n += copied;
    return NULL;
}

// state.json with the digests of every file: rank 0's (mine, n of them) and the world ranks'
// optimizer files (opt_digests).
static int write_state(const char *dir, const TrainState *st, const Config *c, const CkptFile *mine,
                       int n_mine, const FileDigest *opt_digests, int world, char *err, size_t errlen) {
    CkptFile *files = xcalloc((size_t)world + 2, sizeof(CkptFile));
    int n = 0;
    for (; n < n_mine; n++) files[n] = mine[n];
    for (int r = 0; r < world; r++, n++) {
        snprintf(files[n].name, sizeof files[n].name, "optimizer_rank%d.safetensors", r);
        files[n].digest = opt_digests[r];
    }
    char *text = ckpt_state_format(st, c, files, n);
    CkptFile self;
    const int rc = write_recorded(dir, "state.json", text, strlen(text), &self, err, errlen);
    free(text);
    free(files);
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

// Where a directory name of run_dir goes to be deleted: a name resume never reads (not
// "ckpt_<digits>"), so a process ended during the deletion leaves no half-deleted checkpoint,
// only a leftover that checkpoint_remove_leftovers clears.
static void trash_path(const char *run_dir, const char *name, char *out, size_t len) {
    snprintf(out, len, "%s/" TRASH_PREFIX "%s", run_dir, name);
}

// Renames run_dir/name to its trash name (removing a leftover of that name first); 0 or -1.
static int retire(const char *run_dir, const char *name) {
    char path[4096], trash[4200];
    snprintf(path, sizeof path, "%s/%s", run_dir, name);
    trash_path(run_dir, name, trash, sizeof trash);
    remove_tree(trash);
    return rename(path, trash);
}

static void delete_retired(const char *run_dir, const char *name) {
    char trash[4200];
    trash_path(run_dir, name, trash, sizeof trash);
    remove_tree(trash);
}

// Rank 0 moves the finished directory tmp into place as final (named name in run_dir) and
// prunes old checkpoints. Every directory leaves its checkpoint name by one rename before any
// of it is deleted: a signal or crash at any point leaves only complete ckpt_* directories.
static int publish(const char *run_dir, const char *tmp, const char *final, const char *name,
                   int keep, char *err, size_t errlen) {
    fsync_dir(tmp);
    // A checkpoint of the same step may exist (a resumed run saving again): moved aside first,
    // so there is always one complete copy under some name.
    const int had_old = is_dir(final) && retire(run_dir, name) == 0;
    if (rename(tmp, final) != 0) {
        const int e = errno;
        char trash[4200];
        trash_path(run_dir, name, trash, sizeof trash);
        if (had_old) rename(trash, final);
        remove_tree(tmp);
        return set_error(err, errlen, "cannot rename '%s' to '%s': %s", tmp, final, strerror(e));
    }
    long long *steps;
    const int n = list_checkpoints(run_dir, &steps);
    char victim[64];
    for (int i = 0; i < n - keep; i++) {
        snprintf(victim, sizeof victim, CKPT_PREFIX "%08lld", steps[i]);
        retire(run_dir, victim);
    }
    fsync_dir(run_dir);   // the new checkpoint and the retirements are durable before deleting
    if (had_old) delete_retired(run_dir, name);
    for (int i = 0; i < n - keep; i++) {
        snprintf(victim, sizeof victim, CKPT_PREFIX "%08lld", steps[i]);
        delete_retired(run_dir, victim);
    }
    free(steps);
    return 0;
}

void checkpoint_remove_leftovers(const char *run_dir) {
    DIR *d = opendir(run_dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, TRASH_PREFIX, strlen(TRASH_PREFIX)) != 0 &&
            strncmp(e->d_name, TMP_PREFIX, strlen(TMP_PREFIX)) != 0)
            continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", run_dir, e->d_name);
        remove_tree(path);   // removing entries of an open directory stream is allowed (POSIX)
    }
    closedir(d);
}

// This rank's optimizer file, on a thread of its own (it reads only host memory).
typedef struct {
    const char *dir;
    const OptimState *opt;
    int rank, rc;
    FileDigest digest;
    char err[ERR_LEN];
} OptimFile;

static void *write_optimizer_file(void *arg) {
    OptimFile *w = arg;
    w->rc = write_optimizer(w->dir, w->opt, w->rank, &w->digest, w->err, sizeof w->err);
    return NULL;
}

struct CkptWrite {
    char run_dir[4096], tmp[4096], final[4096], name[64];
    long long step;
    Comm *comm;
    const Config *c;
    OptimFile opt;
    Rank0Files r0;
    float *weights;   // the model's weights when the optimizer holds no master copy, or NULL
    pthread_t opt_thread, r0_thread;
    int opt_started, r0_started;
};

// Runs fn(arg) on a new thread (*started = 1), or here when no thread can be made.
static void start_writer(pthread_t *thread, int *started, void *(*fn)(void *), void *arg) {
    *started = pthread_create(thread, NULL, fn, arg) == 0;
    if (!*started) fn(arg);
}

CkptWrite *checkpoint_save_begin(const char *run_dir, GPT *m, const OptimState *opt, long long step,
                                 const Config *c, Comm *comm, char *err, size_t errlen) {
    if (opt->n != gpt_num_params(m)) {
        set_error(err, errlen, "checkpoint: optimizer state has %zu elements, the model %zu", opt->n,
                  gpt_num_params(m));
        return NULL;
    }
    CkptWrite *w = xcalloc(1, sizeof *w);
    const int rank = comm->rank;
    // One name every rank derives alike; a leftover of a crashed attempt at this step is removed.
    snprintf(w->run_dir, sizeof w->run_dir, "%s", run_dir);
    snprintf(w->name, sizeof w->name, CKPT_PREFIX "%08lld", step);
    snprintf(w->tmp, sizeof w->tmp, "%s/" TMP_PREFIX "%08lld", run_dir, step);
    snprintf(w->final, sizeof w->final, "%s/%s", run_dir, w->name);
    w->step = step, w->comm = comm, w->c = c;
    int ok = 1;
    if (rank == 0) {
        remove_tree(w->tmp);
        ok = mkdir_p(w->tmp, err, errlen) == 0;
    }
    if (!comm_all_ok(comm, ok)) {
        if (ok) set_error(err, errlen, "rank 0 could not create '%s'", w->tmp);
        free(w);
        return NULL;
    }
    // Every rank writes its shard of the optimizer state, rank 0 also the weights and the
    // tokenizer (the weights fetched from the model first when the optimizer holds no master
    // copy), each on a thread of its own: the files' writes and hashes overlap each other and
    // whatever the caller does until checkpoint_save_end.
    w->opt = (OptimFile){.dir = w->tmp, .opt = opt, .rank = rank};
    start_writer(&w->opt_thread, &w->opt_started, write_optimizer_file, &w->opt);
    if (rank == 0) {
        w->r0 = (Rank0Files){.dir = w->tmp, .m = m, .weights = opt->master, .c = c};
        if (!w->r0.weights) {
            w->weights = xmalloc(gpt_num_params(m) * sizeof(float));
            gpt_get_params_f32(m, w->weights);
            w->r0.weights = w->weights;
        }
        start_writer(&w->r0_thread, &w->r0_started, write_rank0_files, &w->r0);
    }
    return w;
}

int checkpoint_save_end(CkptWrite *w, const TrainState *st, int keep, char *path_out,
                        size_t path_len, char *err, size_t errlen) {
    Comm *comm = w->comm;
    const int rank = comm->rank;
    if (w->opt_started) pthread_join(w->opt_thread, NULL);
    if (w->r0_started) pthread_join(w->r0_thread, NULL);
    int ok = w->opt.rc == 0 && w->r0.rc == 0;
    if (st->step != w->step) ok = 0, set_error(err, errlen, "checkpoint: state of step %lld for "
                                               "the checkpoint of step %lld", st->step, w->step);
    else if (w->opt.rc != 0) snprintf(err, errlen, "%s", w->opt.err);
    else if (w->r0.rc != 0) snprintf(err, errlen, "%s", w->r0.err);
    // The directory is renamed into place only when every rank's part and state.json (with
    // every file's digest) are written: the checkpoint is complete only when all parts are.
    FileDigest *digests = xcalloc((size_t)comm->world, sizeof(FileDigest));
    const int all_written = comm_all_ok(comm, ok);
    if (all_written) gather_digests(comm, &w->opt.digest, digests);
    if (all_written && rank == 0)
        ok = write_state(w->tmp, st, w->c, w->r0.files, w->r0.n, digests, comm->world, err,
                         errlen) == 0;
    free(digests);
    int rc = 0;
    if (!all_written || !comm_all_ok(comm, ok)) {
        if (rank == 0) remove_tree(w->tmp);
        rc = ok ? set_error(err, errlen, "another rank could not write its part of '%s' (its log "
                                         "says why)", w->tmp) : -1;
    } else {
        ok = rank != 0 || publish(w->run_dir, w->tmp, w->final, w->name, keep, err, errlen) == 0;
        if (!comm_all_ok(comm, ok))
            rc = ok ? set_error(err, errlen, "rank 0 could not move '%s' into place", w->tmp) : -1;
        else if (path_out) snprintf(path_out, path_len, "%s", w->final);
    }
    free(w->weights);
    free(w);
    return rc;
}

int checkpoint_save_dist(const char *run_dir, GPT *m, const OptimState *opt, const TrainState *st,
                         const Config *c, int keep, Comm *comm, char *path_out, size_t path_len,
                         char *err, size_t errlen) {
    CkptWrite *w = checkpoint_save_begin(run_dir, m, opt, st->step, c, comm, err, errlen);
    return w ? checkpoint_save_end(w, st, keep, path_out, path_len, err, errlen) : -1;
}

long long checkpoint_find_before(const char *run_dir, long long step, char *path, size_t path_len) {
    long long *steps, found = -1;
    int n = list_checkpoints(run_dir, &steps);
    while (n > 0 && steps[n - 1] >= step) n--;
    if (n > 0) {
        found = steps[n - 1];
        snprintf(path, path_len, "%s/" CKPT_PREFIX "%08lld", run_dir, found);
    }
    free(steps);
    return found;
}

int checkpoint_find_latest(const char *run_dir, char *path, size_t path_len) {
    return checkpoint_find_before(run_dir, LLONG_MAX, path, path_len) >= 0;
}
