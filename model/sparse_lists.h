// sparse_lists: the block lists of attention.sparse (attention/attention.h's block-sparse
// fields) for the model's attention calls, built once per shape and kept in backend memory.
#pragma once
#include "attention/attention.h"
#include "common/config.h"
#include "model/backend.h"

typedef struct SparseLists SparseLists;

// attention.sparse and its sparse_* keys as the attention module's pattern (in blocks).
AttnSparseSpec sparse_lists_spec(const Config *run);
// NULL when run is NULL or attention.sparse is none (config_validate checked the parameters).
SparseLists *sparse_lists_create(Backend *be, const Config *run);
void sparse_lists_free(SparseLists *s);
// On the layers attention.sparse_every selects, points p's four sparse fields at the lists for
// p's T_q, T_k and causal flag: built on the first call with that shape and kept; the training
// shape (T_q == T_k) and a decoding step (T_q < T_k, rebuilt when T_k moves) each have a slot.
// The uploads are ordered on the backend's stream, so a rebuild never changes lists under a
// kernel still reading them. s NULL or a dense layer: p is left dense.
void sparse_lists_apply(SparseLists *s, AttnParams *p, int layer);
