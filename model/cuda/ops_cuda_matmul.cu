// ops_cuda_matmul: the linear layer out = epi(inp @ w^T + bias) and its backward through
// cuBLASLt, in the compute dtype with fp32 accumulation (CUBLAS_COMPUTE_32F: no TF32, so fp32
// mode matches the CPU backend closely).
//
// Row-major (R, K) matrices are column-major (K, R) ones to cuBLAS, so with D^T = B^T A^T:
//   forward  out (N, OC)  = col-major D (OC, N) = w^T(op T of (C, OC)) . inp (C, N)
//   dinp     (N, C)       = col-major D (C, N)  = w (C, OC) . dout (OC, N)
//   dw       (OC, C)     += col-major D (C, OC) = inp (C, N) . dout^T (op T of (OC, N)), beta 1
// The forward fuses bias and, in bf16/fp16, GELU in the epilogue (GELU_AUX_BIAS writes the
// pre-activation to `pre` for backward). The backward's GELU derivative and bias gradient are
// one deterministic kernel of ops_cuda_layers.cu (cuda_bias_gelu_backward): the interface
// applies the GELU backward to this layer's dout (DGELU would belong to the next layer's dinp
// matmul), and the bias gradient accumulates (+=) where BGRADB would overwrite.

#include "model/cuda/cuda_common.cuh"

typedef struct {
    void *d;                      // col-major (m, n), ldd = m; also C when beta != 0
    const void *a, *b;            // op(A) (m, k), op(B) (k, n)
    cublasOperation_t op_a, op_b;
    int m, n, k, lda, ldb;
    float beta;
    cublasLtEpilogue_t epi;
    const void *bias;             // (m) or NULL
    void *aux;                    // (m, n) pre-activation for the GELU_AUX epilogues, ld = m
} LtGemm;

static cudaDataType_t lt_type(DType t) {
    switch (t) {
    case DTYPE_F32: return CUDA_R_32F;
    case DTYPE_BF16: return CUDA_R_16BF;
    case DTYPE_F16: return CUDA_R_16F;
    }
    return CUDA_R_32F;
}

// Largest power of two (up to 256) dividing the address: cuBLASLt's heuristic otherwise
// assumes 256-byte aligned pointers, and tensors inside the flat parameter vector are not.
static uint32_t ptr_alignment(const void *p) {
    uintptr_t a = (uintptr_t)p;
    uint32_t al = 256;
    while (al > 1 && (a % al) != 0) al >>= 1;
    return al;
}

// Runs one gemm; returns 0, or -1 with cuBLASLt's answer in *why when it offers no algorithm
// for this epilogue and layout (the caller then uses an unfused path).
static int lt_gemm(Backend *be, const LtGemm *g, cublasStatus_t *why) {
    CudaCtx *ctx = cuda_ctx(be);
    const cudaDataType_t t = lt_type(be->dtype);
    cublasLtMatmulDesc_t op;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &g->op_a,
                                                sizeof g->op_a));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &g->op_b,
                                                sizeof g->op_b));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &g->epi,
                                                sizeof g->epi));
    if (g->bias) {
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias,
                                                    sizeof g->bias));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &t,
                                                    sizeof t));
    }
    if (g->aux) {
        const int64_t ld = g->m;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                    &g->aux, sizeof g->aux));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld,
                                                    sizeof ld));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
            op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &t, sizeof t));
    }
    const int a_rows = g->op_a == CUBLAS_OP_N ? g->m : g->k,
              a_cols = g->op_a == CUBLAS_OP_N ? g->k : g->m;
    const int b_rows = g->op_b == CUBLAS_OP_N ? g->k : g->n,
              b_cols = g->op_b == CUBLAS_OP_N ? g->n : g->k;
    cublasLtMatrixLayout_t la, lb, ld;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, t, a_rows, a_cols, g->lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, t, b_rows, b_cols, g->ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld, t, g->m, g->n, g->m));

    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref,
                                                      CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &ctx->lt_ws_bytes, sizeof ctx->lt_ws_bytes));
    const struct {
        cublasLtMatmulPreferenceAttributes_t attr;
        const void *ptr;
    } aligns[] = {{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, g->a},
                  {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, g->b},
                  {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, g->d},
                  {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, g->d}};
    for (size_t i = 0; i < sizeof aligns / sizeof aligns[0]; i++) {
        const uint32_t al = ptr_alignment(aligns[i].ptr);
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, aligns[i].attr, &al, sizeof al));
    }
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(ctx->lt, op, la, lb, ld, ld, pref, 1, &heur, &found);
    // Any refusal (NOT_SUPPORTED, or INVALID_VALUE for an aux layout it cannot take) is
    // reported to the caller, which has an unfused path or names the shapes.
    int rc = -1;
    *why = st == CUBLAS_STATUS_SUCCESS ? CUBLAS_STATUS_NOT_SUPPORTED : st;
    if (st == CUBLAS_STATUS_SUCCESS && found > 0) {
        const float alpha = 1.0f;
        CUBLAS_CHECK(cublasLtMatmul(ctx->lt, op, &alpha, g->a, la, g->b, lb, &g->beta, g->d, ld,
                                    g->d, ld, &heur.algo, ctx->lt_ws, ctx->lt_ws_bytes,
                                    ctx->stream));
        rc = 0;
    }
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(la));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(lb));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(ld));
    CUBLAS_CHECK(cublasLtMatmulDescDestroy(op));
    return rc;
}

// A gemm that must run: no algorithm at all is a bug or an unsupported GPU, reported with shapes.
static void lt_gemm_or_die(Backend *be, const LtGemm *g) {
    cublasStatus_t why;
    if (lt_gemm(be, g, &why) != 0)
        fatal(EXIT_RUNTIME,
              "cuBLASLt found no algorithm for a %s gemm m=%d n=%d k=%d (epilogue %d, "
              "pointer alignments %u/%u/%u bytes): %s",
              dtype_name(be->dtype), g->m, g->n, g->k, (int)g->epi, ptr_alignment(g->a),
              ptr_alignment(g->b), ptr_alignment(g->d), cublasLtGetStatusString(why));
}

void cuda_matmul_forward(Backend *be, void *out, void *pre, const void *inp, const void *w,
                         const void *bias, int N, int C, int OC, Epilogue epi) {
    // a: w (OC, C) row-major = col-major (C, OC), used transposed; b: inp (N, C) row-major =
    // col-major (C, N).
    LtGemm g = {.a = w, .b = inp, .op_a = CUBLAS_OP_T, .op_b = CUBLAS_OP_N, .m = OC, .n = N,
                .k = C, .lda = C, .ldb = C, .bias = bias};
    // cuBLASLt's GELU epilogue evaluates tanh less accurately than tanhf: 2.6e-6 relative
    // (norm-wise, H200, CUDA 13.0; test_ops_cuda), 60x the CPU's fp32 GELU. That is ~1000x below
    // a bf16/fp16 rounding, so those dtypes fuse; fp32, the tight reference mode, runs GELU in
    // its own kernel (tanhf, within 2 ulp).
    if (epi == EPI_GELU && be->dtype != DTYPE_F32) {
        // Fused: out = GELU(acc + bias), pre = acc + bias.
        g.d = out;
        g.aux = pre;
        g.epi = bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
        cublasStatus_t why;
        if (lt_gemm(be, &g, &why) == 0) return;
    }
    if (epi == EPI_GELU) {
        // Unfused (fp32, or cuBLASLt offers no fused algorithm: seen for bf16/fp16 with OC = 100,
        // whose aux rows are not 16-byte aligned): pre with the bias epilogue, then GELU.
        g.aux = NULL;
        g.d = pre;
        g.epi = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
        lt_gemm_or_die(be, &g);
        cuda_gelu_forward(be, out, pre, (size_t)N * OC);
        return;
    }
    g.d = out;
    g.epi = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    lt_gemm_or_die(be, &g);
}

void cuda_matmul_backward(Backend *be, void *dinp, void *dw, void *dbias, void *dout,
                          const void *pre, const void *inp, const void *w, int N, int C, int OC,
                          Epilogue epi) {
    // dout (N, OC) becomes d(pre) in place with EPI_GELU; dbias (OC) += its column sums.
    const void *gelu_pre = epi == EPI_GELU ? pre : NULL;
    if (gelu_pre || dbias) cuda_bias_gelu_backward(be, dbias, dout, gelu_pre, N, OC);
    if (dinp) {
        // d: dinp (N, C) = col-major (C, N); a: w (OC, C) row-major = col-major (C, OC);
        // b: dout (N, OC) row-major = col-major (OC, N).
        const LtGemm gi = {.d = dinp, .a = w, .b = dout, .op_a = CUBLAS_OP_N, .op_b = CUBLAS_OP_N,
                           .m = C, .n = N, .k = OC, .lda = C, .ldb = OC, .beta = 0.0f,
                           .epi = CUBLASLT_EPILOGUE_DEFAULT};
        lt_gemm_or_die(be, &gi);
    }
    // d: dw (OC, C) = col-major (C, OC), accumulated; a: inp (N, C) row-major = col-major (C, N);
    // b: dout col-major (OC, N), used transposed.
    const LtGemm gw = {.d = dw, .a = inp, .b = dout, .op_a = CUBLAS_OP_N, .op_b = CUBLAS_OP_T,
                       .m = C, .n = OC, .k = N, .lda = C, .ldb = OC, .beta = 1.0f,
                       .epi = CUBLASLT_EPILOGUE_DEFAULT};
    lt_gemm_or_die(be, &gw);
}
