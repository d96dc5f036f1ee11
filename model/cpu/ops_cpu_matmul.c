// ops_cpu_matmul: the CPU backend's linear layer, out = epi(inp @ w^T + bias), and its backward,
// through OpenBLAS cblas_sgemm with the bias and the tanh-approximate GELU applied by OpenMP loops.
//
// Threads: OpenMP's team runs everything, sgemm included (OpenBLAS itself is kept to one thread
// by backend_cpu_create and each OpenMP thread multiplies its own slice of the output). With two
// pools, OpenBLAS's and OpenMP's, the idle threads of one spin-wait on the cores the other needs
// at every switch between a matmul and an element-wise op: on 2 cores one pool made a training
// step of configs/shakespeare_char.json's model (B=4, T=256) 1.7x faster (750 -> 430 ms) and of
// configs/tiny_cpu.json's (B=16, T=128) 2.6x faster (270 -> 103 ms).
#include <cblas.h>
#include <math.h>
#include <omp.h>

#include "model/cpu/ops_cpu.h"

// GELU (tanh approximation, as GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
#define GELU_K 0.7978845608028654f  // sqrt(2 / pi)
#define GELU_A 0.044715f

// tanh(u) = 1 - 2 / (1 + e^(2u)): one expf instead of glibc's tanhf, which went through expm1f
// and took a quarter of a small model's step. It saturates correctly (e^(2u) = inf gives 1,
// e^(2u) = 0 gives -1); near u = 0 the subtraction loses relative accuracy of tanh, but GELU
// needs 1 + tanh and 1 - tanh^2, whose absolute error stays at a few 2^-24.
static float tanh_fast(float u) { return 1.0f - 2.0f / (1.0f + expf(2.0f * u)); }

static float gelu(float x) { return 0.5f * x * (1.0f + tanh_fast(GELU_K * (x + GELU_A * x * x * x))); }

static float gelu_grad(float x) {
    float t = tanh_fast(GELU_K * (x + GELU_A * x * x * x));
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * GELU_K * (1.0f + 3.0f * GELU_A * x * x);
}

// Below this many multiply-adds an sgemm runs on the calling thread (the team's wake-up costs
// more than it saves).
#define SGEMM_PAR_MIN (1 << 18)

// C (M, Nc) = op(A) (M, K) @ op(B) (K, Nc) + beta * C, row-major, split over the larger of M and
// Nc among the OpenMP threads; each slice is one sgemm, so results do not depend on the thread
// count except through OpenBLAS's blocking of the slice.
static void sgemm_split(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int Nc, int K,
                        const float *A, int lda, const float *B, int ldb, float beta, float *C,
                        int ldc) {
    int split_m = M >= Nc;
    #pragma omp parallel if ((double)M * Nc * K >= SGEMM_PAR_MIN)
    {
        int nt = omp_get_num_threads(), t = omp_get_thread_num(), n = split_m ? M : Nc;
        int lo = (int)((long)n * t / nt), hi = (int)((long)n * (t + 1) / nt);
        if (hi > lo && split_m) {
            // Rows lo..hi of op(A): row-offset of A, or column-offset when A is transposed.
            const float *a = ta == CblasNoTrans ? A + (size_t)lo * lda : A + lo;
            cblas_sgemm(CblasRowMajor, ta, tb, hi - lo, Nc, K, 1.0f, a, lda, B, ldb, beta,
                        C + (size_t)lo * ldc, ldc);
        } else if (hi > lo) {
            // Columns lo..hi of op(B): column-offset of B, or row-offset when B is transposed.
            const float *b = tb == CblasNoTrans ? B + lo : B + (size_t)lo * ldb;
            cblas_sgemm(CblasRowMajor, ta, tb, M, hi - lo, K, 1.0f, A, lda, b, ldb, beta, C + lo, ldc);
        }
    }
}

void cpu_matmul_forward(Backend *be, void *out_, void *pre_, const void *inp, const void *w,
                        const void *bias_, int N, int C, int OC, Epilogue epi) {
    float *out = out_;          // (N, OC)
    float *pre = pre_;          // (N, OC) with EPI_GELU, else NULL
    const float *bias = bias_;  // (OC) or NULL
    float *acc = epi == EPI_GELU ? pre : out;
    sgemm_split(CblasNoTrans, CblasTrans, N, OC, C, inp, C, w, C, 0.0f, acc, OC);
    if (!bias && epi == EPI_NONE) return;
    #pragma omp parallel for schedule(static) if ((size_t)N * OC >= CPU_PAR_MIN)
    for (int i = 0; i < N; i++) {
        float *a = acc + (size_t)i * OC, *o = out + (size_t)i * OC;
        if (bias)
            for (int j = 0; j < OC; j++) a[j] += bias[j];
        if (epi == EPI_GELU)
            for (int j = 0; j < OC; j++) o[j] = gelu(a[j]);
    }
}

void cpu_matmul_backward(Backend *be, void *dinp, void *dw, void *dbias_, void *dout_,
                         const void *pre_, const void *inp, const void *w, int N, int C, int OC,
                         Epilogue epi) {
    float *dout = dout_;        // (N, OC); becomes d(pre) in place with EPI_GELU
    const float *pre = pre_;    // (N, OC) with EPI_GELU
    float *dbias = dbias_;      // (OC) or NULL, accumulates
    if (epi == EPI_GELU) {
        #pragma omp parallel for schedule(static) if ((size_t)N * OC >= CPU_PAR_MIN)
        for (size_t i = 0; i < (size_t)N * OC; i++) dout[i] *= gelu_grad(pre[i]);
    }
    // dinp (N, C) = dout (N, OC) @ w (OC, C)
    if (dinp)
        sgemm_split(CblasNoTrans, CblasNoTrans, N, C, OC, dout, OC, w, C, 0.0f, dinp, C);
    // dw (OC, C) += dout^T (OC, N) @ inp (N, C)
    sgemm_split(CblasTrans, CblasNoTrans, OC, C, N, dout, OC, inp, C, 1.0f, dw, C);
    if (!dbias) return;
    // Column sums, split by output channel so each thread owns its dbias entries.
    #pragma omp parallel for schedule(static) if ((size_t)N * OC >= CPU_PAR_MIN)
    for (int j0 = 0; j0 < OC; j0 += COL_CHUNK) {
        int j1 = j0 + COL_CHUNK < OC ? j0 + COL_CHUNK : OC;
        for (int i = 0; i < N; i++) {
            const float *d = dout + (size_t)i * OC;
            for (int j = j0; j < j1; j++) dbias[j] += d[j];
        }
    }
}
