// fileio: atomic file and directory writes, and small filesystem helpers. A crash in the middle
// of a write never leaves a half-written file under the final name.
#pragma once
#include <stddef.h>

// Writes len bytes to path via "path.tmp.<pid>", fsync, rename. Returns 0 or -1 with err set.
int write_file_atomic(const char *path, const void *data, size_t len, char *err, size_t errlen);
int mkdir_p(const char *path, char *err, size_t errlen);   // like mkdir -p
int remove_tree(const char *path);                         // like rm -rf; 0 on success
int path_exists(const char *path);
int is_dir(const char *path);
int fsync_dir(const char *path);                           // make a rename durable
