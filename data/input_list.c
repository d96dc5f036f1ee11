#include "data/input_list.h"

#include <dirent.h>
#include <errno.h>
#include <glob.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/check.h"

typedef struct {
    InputList *l;
    int cap;
    dev_t *dev;   // (cap) identity of each file, to refuse one given twice
    ino_t *ino;
    char *err;
    size_t errlen;
} Expander;

static int add_file(Expander *x, const char *path, const struct stat *st, const char *arg) {
    InputList *l = x->l;
    for (int i = 0; i < l->n; i++)
        if (x->dev[i] == st->st_dev && x->ino[i] == st->st_ino && strcmp(l->files[i].path, "-") != 0)
            return set_error(x->err, x->errlen, "--input: '%s' (from '%s') is already an input: each file is read once",
                             path, arg);
    if (strcmp(path, "-") != 0 && access(path, R_OK) != 0)
        return set_error(x->err, x->errlen, "--input: cannot read '%s': %s", path, strerror(errno));
    if (l->n == x->cap) {
        x->cap = 2 * x->cap + 16;
        l->files = xrealloc(l->files, (size_t)x->cap * sizeof *l->files);
        x->dev = xrealloc(x->dev, (size_t)x->cap * sizeof *x->dev);
        x->ino = xrealloc(x->ino, (size_t)x->cap * sizeof *x->ino);
    }
    int regular = S_ISREG(st->st_mode);
    l->files[l->n] = (InputFile){xstrdup(path), regular ? (int64_t)st->st_size : -1,
                                 (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec};
    x->dev[l->n] = st->st_dev;
    x->ino[l->n] = st->st_ino;
    l->n++;
    if (!regular) l->total_size = -1;
    else if (l->total_size >= 0) l->total_size += st->st_size;
    return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int add_path(Expander *x, const char *path, const char *arg);

// Every regular file below dir (names starting with '.' left out), in sorted order.
static int add_dir(Expander *x, const char *dir, const char *arg) {
    DIR *d = opendir(dir);
    if (!d) return set_error(x->err, x->errlen, "--input: cannot list directory '%s': %s", dir, strerror(errno));
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        if (n == cap) names = xrealloc(names, (cap = 2 * cap + 16) * sizeof *names);
        size_t len = strlen(dir) + strlen(e->d_name) + 2;
        names[n] = xmalloc(len);
        snprintf(names[n++], len, "%s%s%s", dir, dir[strlen(dir) - 1] == '/' ? "" : "/", e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof *names, cmp_str);
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        if (rc == 0) rc = add_path(x, names[i], arg);
        free(names[i]);
    }
    free(names);
    return rc;
}

static int add_path(Expander *x, const char *path, const char *arg) {
    struct stat st;
    if (stat(path, &st) != 0) return set_error(x->err, x->errlen, "--input: cannot open '%s': %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode)) return add_dir(x, path, arg);
    if (S_ISREG(st.st_mode) || S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode)) return add_file(x, path, &st, arg);
    return 0;   // sockets and the like inside a directory: not text
}

static int has_glob_chars(const char *s) { return strpbrk(s, "*?[") != NULL; }

static int add_arg(Expander *x, const char *arg) {
    InputList *l = x->l;
    if (strcmp(arg, "-") == 0) {
        for (int i = 0; i < l->n; i++)
            if (strcmp(l->files[i].path, "-") == 0)
                return set_error(x->err, x->errlen, "--input: '-' (standard input) is given twice");
        struct stat st = {0};
        fstat(STDIN_FILENO, &st);
        st.st_mode = S_IFIFO;   // read as a stream, whatever it is connected to
        int before = l->n;
        if (add_file(x, "-", &st, arg) != 0) return -1;
        x->dev[before] = 0;
        x->ino[before] = 0;
        return 0;
    }
    struct stat st;
    if (stat(arg, &st) == 0 || !has_glob_chars(arg)) {
        int before = l->n, rc = add_path(x, arg, arg);
        if (rc == 0 && l->n == before)
            return set_error(x->err, x->errlen, "--input: '%s' holds no files (names starting with '.' are left out)", arg);
        return rc;
    }
    glob_t g;
    int rc = glob(arg, GLOB_ERR, NULL, &g);
    if (rc == GLOB_NOMATCH)
        return set_error(x->err, x->errlen, "--input: no file matches the pattern '%s'", arg);
    if (rc != 0) {
        globfree(&g);
        return set_error(x->err, x->errlen, "--input: cannot expand the pattern '%s' (a read error)", arg);
    }
    int before = l->n;
    rc = 0;
    for (size_t i = 0; i < g.gl_pathc && rc == 0; i++) rc = add_path(x, g.gl_pathv[i], arg);
    globfree(&g);
    if (rc == 0 && l->n == before) return set_error(x->err, x->errlen, "--input: the pattern '%s' matches no file", arg);
    return rc;
}

int input_list_expand(InputList *l, const char *const *args, int n, char *err, size_t errlen) {
    memset(l, 0, sizeof *l);
    Expander x = {.l = l, .err = err, .errlen = errlen};
    int rc = n > 0 ? 0 : set_error(err, errlen, "--input is required");
    for (int i = 0; i < n && rc == 0; i++) rc = add_arg(&x, args[i]);
    free(x.dev);
    free(x.ino);
    if (rc != 0) input_list_free(l);
    return rc;
}

void input_list_free(InputList *l) {
    for (int i = 0; i < l->n; i++) free(l->files[i].path);
    free(l->files);
    memset(l, 0, sizeof *l);
}
