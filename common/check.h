// Error handling shared by every module: exit codes, fatal-error macros that print the failing
// statement with file:line, and checked host I/O wrappers that name the path and give a hint.
#pragma once
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>

// EXIT_STOPPED: `train` stopped on SIGTERM or SIGINT after writing a checkpoint; running the same
// command again resumes (a scheduler may requeue on it).
enum { EXIT_OK = 0, EXIT_RUNTIME = 1, EXIT_USAGE = 2, EXIT_STOPPED = 3 };

// Print "error: <message>" on stderr and exit with `code` (EXIT_USAGE for bad input,
// EXIT_RUNTIME for failures that are not the user's fault).
void fatal(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));
// Print "warning: <message>" on stderr and continue.
void warnf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

// A runtime invariant: failure is a bug in flashgpt, reported with the statement text.
#define CHECK(cond)                                                                           \
    do {                                                                                      \
        if (!(cond)) fatal(EXIT_RUNTIME, "internal check failed: %s (%s, %s:%d)", #cond,     \
                           __func__, __FILE__, __LINE__);                                     \
    } while (0)

// Writes a formatted message into err (errlen bytes; err may be NULL) and returns -1: the one
// way functions that report bad input hand their message back to the caller.
int set_error(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
// Size of the message buffers callers pass as err: room for a path and a sentence.
#define ERR_LEN 1024

void *xmalloc(size_t n);           // malloc that exits with a message on failure (never NULL)
void *xcalloc(size_t n, size_t s);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);

// fopen that exits with EXIT_USAGE naming the path and the reason when it fails.
FILE *fopen_or_die(const char *path, const char *mode);
// Reads a whole file into a NUL-terminated malloc'ed buffer (len_out may be NULL). Returns NULL
// with err naming the path and the reason when it cannot.
char *read_file(const char *path, size_t *len_out, char *err, size_t errlen);
// read_file that exits with EXIT_USAGE and its message (for cli/ and train_gpt.c).
char *read_file_or_die(const char *path, size_t *len_out);
