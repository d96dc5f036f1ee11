// prepare_progress: the progress line of a long prepare on stderr: input MB read (of the total
// when it is known), tokens written, MB/s, shards done and an ETA. Nothing for the first second,
// then at most 4 lines a second on a terminal (rewritten in place) and one every 5 s in a log.
#pragma once
#include <stdint.h>
#include <stdio.h>

typedef struct {
    FILE *f;            // NULL: no progress output
    int tty;
    double start, last; // seconds (now_seconds)
    int on_line;        // a terminal line was written and not yet ended
    int64_t total;      // input bytes; -1 when unknown
    uint64_t base;      // bytes already done when this run started (a resumed run)
} Progress;

void progress_init(Progress *p, FILE *f, int64_t total_bytes, uint64_t done_before);
// phase: what is running ("tokenizing", "scanning"); done: input bytes consumed so far.
void progress_update(Progress *p, const char *phase, uint64_t done, uint64_t tokens, int shards);
// Ends a terminal line so that what follows starts on a line of its own.
void progress_finish(Progress *p);
