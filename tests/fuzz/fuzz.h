// What the fuzz harnesses share. Each tests/fuzz/fuzz_<name>.c defines LLVMFuzzerTestOneInput
// (and may define LLVMFuzzerInitialize); it is linked either with libFuzzer (make fuzz: clang,
// -fsanitize=fuzzer,address,undefined) or with tests/fuzz/replay.c, which runs the seed corpus
// tests/fuzz/corpus/<name>/ and the crash regressions tests/fuzz/regress/<name>/ once (make test,
// and under gcc's sanitizers in make test-asan).
//
// A harness feeds the bytes to a parser, and when the parser accepts them checks what its
// result promises (round trips, bounds); a broken promise aborts, which both drivers report as
// a failure with the input that caused it.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FUZZ_ASSERT(cond)                                                                     \
    do {                                                                                      \
        if (!(cond)) {                                                                        \
            fprintf(stderr, "fuzz: broken promise: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
            abort();                                                                          \
        }                                                                                     \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

// A NUL-terminated malloc'ed copy of data (the parsers of text take C strings).
static inline char *fuzz_text(const uint8_t *data, size_t size) {
    char *s = malloc(size + 1);
    FUZZ_ASSERT(s != NULL);
    if (size) memcpy(s, data, size);
    s[size] = '\0';
    return s;
}

// The length of data's first part: up to its first NUL byte (all of it when there is none).
// Harnesses of two inputs (a file and its companion, a config and --set lines) split there.
static inline size_t fuzz_split(const uint8_t *data, size_t size) {
    const void *nul = memchr(data, 0, size);
    return nul ? (size_t)((const uint8_t *)nul - data) : size;
}

// A path for this process's scratch file named `what` (under TMPDIR or /tmp), into buf.
static inline const char *fuzz_scratch(const char *what, char *buf, size_t n) {
    const char *dir = getenv("TMPDIR");
    snprintf(buf, n, "%s/flashgpt-fuzz-%d-%s", dir && *dir ? dir : "/tmp", (int)getpid(), what);
    return buf;
}

// Writes data to path (a scratch file); aborts when it cannot.
static inline void fuzz_write_file(const char *path, const uint8_t *data, size_t size) {
    FILE *f = fopen(path, "wb");
    FUZZ_ASSERT(f != NULL);
    FUZZ_ASSERT(fwrite(data, 1, size, f) == size);
    FUZZ_ASSERT(fclose(f) == 0);
}
