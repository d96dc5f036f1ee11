#include "common/timer.h"

#include <stdio.h>

void format_eta(double seconds, char *buf, size_t n) {
    const long s = (long)(seconds + 0.5);
    if (s >= 3600) snprintf(buf, n, "%ldh%02ldm", s / 3600, s / 60 % 60);
    else snprintf(buf, n, "%ldm%02lds", s / 60, s % 60);
}
