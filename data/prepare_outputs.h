// prepare_outputs: the files prepare leaves beside PREFIX, found by name in PREFIX's directory:
// the shards PREFIX_{train,val}_NNNNNN.bin, the state PREFIX_prepare_state.json, and the
// temporary files "NAME.tmp.<pid>" of a run that was killed.
#pragma once
#include <stddef.h>

// The name of an existing shard or state file of a sharded prepare to prefix, copied into found
// (n bytes); 0 when there is none.
int prepare_outputs_find(const char *prefix, char *found, size_t n);
// Removes the temporary files of prefix's outputs whose process no longer runs. Returns how many.
int prepare_outputs_remove_stale(const char *prefix);
