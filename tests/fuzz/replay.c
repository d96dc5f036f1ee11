// The fuzz harnesses' replay driver (tests/fuzz/fuzz.h): without arguments it runs every file of
// tests/fuzz/corpus/FUZZ_NAME/ and tests/fuzz/regress/FUZZ_NAME/ (FUZZ_NAME is set when the
// harness is built); with arguments, those files or directories. Each input runs once; a broken
// promise or a sanitizer error aborts the process (the failure), else it prints
// "N passed, 0 failed".
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tests/fuzz/fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

static int run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: cannot open %s\n", path);
        return 0;
    }
    size_t cap = 4096, n = 0, got;
    uint8_t *buf = malloc(cap);
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0)
        if ((n += got) == cap) buf = realloc(buf, cap *= 2);
    fclose(f);
    FUZZ_ASSERT(buf != NULL);
    // An exact-size copy, so that reading past the input is caught as it is under libFuzzer.
    uint8_t *exact = malloc(n ? n : 1);
    FUZZ_ASSERT(exact != NULL);
    memcpy(exact, buf, n);
    free(buf);
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    return 1;
}

// Runs path (a file, or every regular file of a directory, in name order); returns the count.
static int run_path(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) return 0;   // a harness without regressions has no folder
    if (!S_ISDIR(st.st_mode)) return run_file(path);
    struct dirent **names;
    const int n = scandir(path, &names, NULL, alphasort);
    int count = 0;
    for (int i = 0; i < n; i++) {
        char child[4096];
        snprintf(child, sizeof child, "%s/%s", path, names[i]->d_name);
        if (names[i]->d_name[0] != '.' && stat(child, &st) == 0 && S_ISREG(st.st_mode))
            count += run_file(child);
        free(names[i]);
    }
    free(names);
    return count;
}

int main(int argc, char **argv) {
    if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
    int count = 0;
    if (argc > 1) {
        for (int i = 1; i < argc; i++) count += run_path(argv[i]);
    } else {
        count += run_path("tests/fuzz/corpus/" FUZZ_NAME);
        count += run_path("tests/fuzz/regress/" FUZZ_NAME);
    }
    printf("replay " FUZZ_NAME ": %d inputs\n", count);
    // No input at all means the corpus went missing: a failure, not a silent pass.
    printf("%d passed, %d failed\n", count, count ? 0 : 1);
    return count ? 0 : 1;
}
