// input_list: prepare's --input arguments as the ordered list of files to read. An argument is
// "-" (standard input), a file, a directory (every regular file below it whose name does not
// start with '.', in byte order of the path) or a glob(3) pattern (its matches in glob's sorted
// order, directories expanded as above). Files are read in the order of the arguments.
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef struct {
    char *path;        // "-" for standard input
    int64_t size;      // bytes on disk; -1 when unknown (standard input, a pipe)
    int64_t mtime_ns;  // modification time, for --resume's check that the inputs are the same
} InputFile;

typedef struct {
    InputFile *files;
    int n;
    int64_t total_size;   // sum of the sizes; -1 when one is unknown
} InputList;

// Expands args (n of them). Returns 0, or -1 with err naming the argument: a missing or
// unreadable file, a pattern or directory without files, a file given twice, "-" given twice.
int input_list_expand(InputList *l, const char *const *args, int n, char *err, size_t errlen);
void input_list_free(InputList *l);
