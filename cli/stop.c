#include "cli/stop.h"

#include <signal.h>
#include <string.h>
#include <time.h>

// The one piece of global state in flashgpt, because a signal handler can reach nothing else:
// 0 while no stop signal arrived, else the time of the first one, in eighths of a second of
// CLOCK_MONOTONIC modulo 2^30, plus 1 (never 0). A volatile sig_atomic_t is the only object a
// handler may write and the main program read without a race.
//
// The time is there because one stop often arrives as several signals: Slurm sends SIGTERM to
// every task of a job and to srun, and srun forwards its copy to the same tasks; an interactive
// Ctrl-C reaches mpirun and its ranks alike. Signals within a second of the first are copies of
// it; one that comes later is a second request, and ends the process at once.
static volatile sig_atomic_t first_stop;

#define TICKS_PER_S 8
#define TICK_MASK ((1L << 30) - 1)

static long now_ticks(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);   // async-signal-safe (POSIX.1-2008)
    return (long)((ts.tv_sec * TICKS_PER_S + ts.tv_nsec / (1000000000L / TICKS_PER_S)) & TICK_MASK);
}

static void on_stop(int sig) {
    const long now = now_ticks();
    if (first_stop == 0) {
        first_stop = (sig_atomic_t)(now + 1);
        return;
    }
    if (((now - (first_stop - 1)) & TICK_MASK) < TICKS_PER_S) return;   // a copy of the first
    signal(sig, SIG_DFL);   // the second request: die by the signal, as if never caught
    raise(sig);
}

void stop_signals_install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop;
    sa.sa_flags = SA_RESTART;   // interrupted reads and writes resume instead of failing
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGTERM);
    sigaddset(&sa.sa_mask, SIGINT);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
}

int stop_requested(void) { return first_stop != 0; }
