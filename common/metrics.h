// metrics: the machine log of a run, metrics.jsonl in the run directory: one JSON object per
// line and event ("train", "eval", "sample", "checkpoint", "resume"), flushed as written.
#pragma once
#include <stdio.h>

typedef struct {
    FILE *f;
} Metrics;

// Opens (appends to) dir/metrics.jsonl. Returns 0, or -1 with err set.
int metrics_open(Metrics *m, const char *dir, char *err, size_t errlen);
void metrics_close(Metrics *m);
// Writes {"event": event, "step": step, k1: v1, ...}: fields given as a NULL-terminated list of
// (const char *key, int kind, value) triples; kind 'd' = double, 'i' = long long, 's' = string.
void metrics_write(Metrics *m, const char *event, long long step, ...);
