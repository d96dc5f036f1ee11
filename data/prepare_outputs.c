#include "data/prepare_outputs.h"

#include <dirent.h>
#include <errno.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/check.h"

typedef struct {
    char *dir, *base;   // dirname and basename of the prefix (owned copies)
    size_t base_len;
} Prefix;

static Prefix split_prefix(const char *prefix) {
    char *a = xstrdup(prefix), *b = xstrdup(prefix);
    Prefix p = {xstrdup(dirname(a)), xstrdup(basename(b)), 0};
    p.base_len = strlen(p.base);
    free(a);
    free(b);
    return p;
}

static void free_prefix(Prefix *p) {
    free(p->dir);
    free(p->base);
}

static int all_digits(const char *s, size_t n) {
    if (n == 0) return 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9') return 0;
    return 1;
}

// name is "<split>_NNNNNN.bin" or "prepare_state.json" (after the prefix and its '_').
static int is_output(const char *name) {
    if (strcmp(name, "prepare_state.json") == 0) return 1;
    const char *rest = strncmp(name, "train_", 6) == 0 ? name + 6 : strncmp(name, "val_", 4) == 0 ? name + 4 : NULL;
    size_t n = rest ? strlen(rest) : 0;
    return rest && n > 4 && strcmp(rest + n - 4, ".bin") == 0 && all_digits(rest, n - 4);
}

// The pid of a temporary file name "<anything>.tmp.<pid>", or 0.
static long tmp_pid(const char *name) {
    const char *t = strstr(name, ".tmp.");
    for (; t; t = strstr(t + 1, ".tmp."))
        if (all_digits(t + 5, strlen(t + 5))) return strtol(t + 5, NULL, 10);
    return 0;
}

typedef int (*EntryFn)(const Prefix *p, const char *name, void *ctx);

// Calls fn on each name in the prefix's directory that starts with "<base>_" (fn gets the part
// after it); stops when fn returns non-zero and returns that.
static int each_entry(const char *prefix, EntryFn fn, void *ctx) {
    Prefix p = split_prefix(prefix);
    DIR *d = opendir(p.dir);
    int rc = 0;
    struct dirent *e;
    while (d && rc == 0 && (e = readdir(d)) != NULL)
        if (strncmp(e->d_name, p.base, p.base_len) == 0 && e->d_name[p.base_len] == '_')
            rc = fn(&p, e->d_name, ctx);
    if (d) closedir(d);
    free_prefix(&p);
    return rc;
}

typedef struct {
    char *found;
    size_t n;
} FindCtx;

static int find_one(const Prefix *p, const char *name, void *ctx) {
    FindCtx *f = ctx;
    if (!is_output(name + p->base_len + 1)) return 0;
    snprintf(f->found, f->n, "%s/%s", p->dir, name);
    return 1;
}

int prepare_outputs_find(const char *prefix, char *found, size_t n) {
    FindCtx f = {found, n};
    return each_entry(prefix, find_one, &f);
}

static int remove_stale(const Prefix *p, const char *name, void *ctx) {
    long pid = tmp_pid(name);
    if (pid <= 0 || pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH) return 0;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", p->dir, name);
    *(int *)ctx += unlink(path) == 0;
    return 0;
}

int prepare_outputs_remove_stale(const char *prefix) {
    int n = 0;
    each_entry(prefix, remove_stale, &n);
    return n;
}
