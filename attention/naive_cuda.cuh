// naive_cuda: the materialised attention baseline on CUDA (attention/naive_cuda.cu), which runs
// impl naive, every fp32 problem and the features the flash kernels lack. Internal to attention/.
#pragma once
#include <cublas_v2.h>
#include <stddef.h>

#include "attention/attention.h"

// Forward (backward = 0) or backward of p, accepted by attn_check, on p.stream through the
// context's cuBLAS handle h; p.workspace holds attn_workspace_bytes(). Returns 0, or -1 with the
// failing cuBLAS call's or kernel launch's error in err.
int naive_run_cuda(const AttnParams &p, cublasHandle_t h, int backward, char *err, size_t errlen);
