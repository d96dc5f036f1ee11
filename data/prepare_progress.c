#include "data/prepare_progress.h"

#include <unistd.h>

#include "common/timer.h"

#define PROGRESS_QUIET_S 1.0    // short runs print nothing
#define PROGRESS_TTY_S 0.25
#define PROGRESS_LOG_S 5.0

void progress_init(Progress *p, FILE *f, int64_t total_bytes, uint64_t done_before) {
    *p = (Progress){f, f ? isatty(fileno(f)) : 0, now_seconds(), 0, 0, total_bytes, done_before};
    p->last = p->start;
}

void progress_update(Progress *p, const char *phase, uint64_t done, uint64_t tokens, int shards) {
    if (!p->f) return;
    double now = now_seconds(), elapsed = now - p->start;
    double every = p->tty ? PROGRESS_TTY_S : (p->last == p->start ? PROGRESS_QUIET_S : PROGRESS_LOG_S);
    if (elapsed < PROGRESS_QUIET_S || now - p->last < every) return;
    p->last = now;
    double mb = done / 1e6, rate = (done > p->base ? done - p->base : 0) / 1e6 / elapsed;
    char total[64] = "", eta[32] = "";
    if (p->total > 0) {
        snprintf(total, sizeof total, "/%.1f MB (%.0f%%)", p->total / 1e6, 100.0 * done / p->total);
        if (rate > 0 && (double)p->total > done) {
            char t[24];
            format_eta(((double)p->total - done) / 1e6 / rate, t, sizeof t);
            snprintf(eta, sizeof eta, ", ETA %s", t);
        }
    } else {
        snprintf(total, sizeof total, " MB");
    }
    fprintf(p->f, "%sprepare: %s %.1f%s, %.2fM tokens, %.1f MB/s, %d shard%s done%s%s", p->tty ? "\r\033[K" : "",
            phase, mb, total, tokens / 1e6, rate, shards, shards == 1 ? "" : "s", eta, p->tty ? "" : "\n");
    fflush(p->f);
    p->on_line = p->tty;
}

void progress_finish(Progress *p) {
    if (p->f && p->on_line) fputc('\n', p->f);
    p->on_line = 0;
}
