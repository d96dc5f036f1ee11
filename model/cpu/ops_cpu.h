// ops_cpu: the fp32 CPU backend's ops, shared between its source files (model/cpu/ops_cpu*.c). Not a
// public interface: the model reaches them only through the Backend table of backend_cpu_create.
#pragma once
#include "model/backend.h"

// Channels per thread chunk of the column-parallel reductions (parameter gradients that many rows
// add into): 16 floats = one 64-byte cache line, so two threads never write the same line.
#define COL_CHUNK 16
// Loops with less work than this many elements run on the calling thread: waking the OpenMP
// team costs microseconds (and far more when the cores are oversubscribed), more than such a
// loop takes. Decoding (N = 1) and small test models stay serial; training batches do not.
#define CPU_PAR_MIN 32768

void cpu_embed_forward(Backend *be, void *out, const int *tokens, const int *pos, const void *wte,
                       const void *wpe, int B, int T, int C);
void cpu_embed_backward(Backend *be, void *dwte, void *dwpe, const void *dout, const int *tokens,
                        const int *pos, int B, int T, int C, int V, int P);
void cpu_layernorm_forward(Backend *be, void *out, float *mean, float *rstd, const void *inp,
                           const void *w, const void *b, int N, int C);
void cpu_layernorm_backward(Backend *be, void *dinp, void *dcopy, void *dw, void *db,
                            const void *dout, const void *inp, const void *w, const float *mean,
                            const float *rstd, int N, int C, const DropMask *dcopy_drop);
void cpu_add_layernorm_forward(Backend *be, void *res, void *out, float *mean, float *rstd,
                               const void *a, const void *b, const void *w, const void *bias,
                               int N, int C, const DropMask *b_drop);
void cpu_add(Backend *be, void *out, const void *a, const void *b, size_t n, const DropMask *b_drop);
void cpu_softmax_xent(Backend *be, void *logits, float *losses, float *lse, const int *targets,
                      int N, int V, int Vp, float dscale);
void cpu_matmul_forward(Backend *be, void *out, void *pre, const void *inp, const void *w,
                        const void *bias, int N, int C, int OC, Epilogue epi);
void cpu_matmul_backward(Backend *be, void *dinp, void *dw, void *dbias, void *dout,
                         const void *pre, const void *inp, const void *w, int N, int C, int OC,
                         Epilogue epi);
// ops_cpu_dropout.c
void cpu_dropout(Backend *be, void *x, size_t n, const DropMask *d);
// out = a + (x through d's mask), or x through it without a (NULL), over n elements (out may
// alias a or x); d->p > 0.
void cpu_dropout_add(void *out, const void *a, const void *x, size_t n, const DropMask *d);
// ops_cpu_rope.c
void cpu_rope_forward(Backend *be, void *qkv, const float *table, const int *pos, int N, int T,
                      int NH, int NKV, int HS);
void cpu_rope_backward(Backend *be, void *dqkv, const float *table, const int *pos, int N, int T,
                       int NH, int NKV, int HS);
