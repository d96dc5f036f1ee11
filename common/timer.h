// timer: wall-clock time in seconds (monotonic clock), and durations as text for progress lines.
#pragma once
#include <stddef.h>
#include <time.h>

static inline double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// seconds, rounded to the nearest second, as "1h02m" from an hour on, else "3m07s".
void format_eta(double seconds, char *buf, size_t n);
