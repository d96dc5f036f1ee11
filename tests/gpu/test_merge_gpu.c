// attn_merge on the GPU against the CPU merge (attn_merge_cpu) on the same values: head sizes
// that take the kernel's chunks of 4 (32, 64, 96 with a second pass, 128, 256) and of 1 (40, and
// strides that are not multiples of 4), bf16 and fp16 parts, padded strides, the lse of both
// sides in planes of their own strides, and fp32 parts, and rows whose lse is +inf on either side or both (the
// accumulator's garbage must not leak into a row it takes as it is).
//
// Tolerance: both compute lse = max + log1p(exp(min - max)) and the two weights exp(l - lse) in
// fp32 with library functions within a few ulps, then o * wa + p * wp; an element may differ by
// 16 ulps of |o| wa + |p| wp (rounded up to |o| + |p|), the lse by 16 ulps of max + 1 (the
// log1p term is at most log 2, and the sum may cancel to near 0).
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "attention/attention.h"
#include "common/check.h"
#include "common/rng.h"
#include "tests/testlib.h"
#include "tests/gpu/cuda_ok.h"

// The 16-bit encoding (fp32 parts go up as they are) of a value exactly representable in dt (bf16: the high half of the fp32
// bits; fp16: sign, rebased exponent, top 10 significand bits; normal values or 0).
static uint16_t encode16(float x, DType dt) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if (dt == DTYPE_BF16) return (uint16_t)(u >> 16);
    if (x == 0.f) return (uint16_t)(u >> 16);
    const uint32_t sign = u >> 31, exp = (u >> 23) & 0xff, man = u & 0x7fffff;
    return (uint16_t)(sign << 15 | (exp - 127 + 15) << 10 | man >> 13);
}

// Where row i = (b NH + h) T + t of the (B, NH, T) lse sits in the part's (B, 2, NH, T) planes (plane 1).
static size_t part_lse_at(size_t i, int NH, int T) {
    const size_t plane = (size_t)NH * T;
    return i / plane * 2 * plane + plane + i % plane;
}

typedef struct {
    int B, T, NH, HS;
    int64_t acc_row, part_row, part_head;  // element strides (acc's head stride is HS)
    int part_off;                          // elements before the part's first one
} MergeCase;

static void run_merge(MergeCase mc, DType dt, uint64_t seed) {
    const int B = mc.B, T = mc.T, NH = mc.NH, HS = mc.HS;
    const size_t acc_n = (size_t)B * T * mc.acc_row, part_n = (size_t)mc.part_off + (size_t)B * T * mc.part_row;
    const size_t lse_n = (size_t)B * NH * T, lse_part_n = 2 * lse_n;  // the part's plane 1 of 2
    float *acc = xmalloc(acc_n * 4), *part = xcalloc(part_n, 4), *la = xmalloc(lse_n * 4), *lp = xmalloc(lse_part_n * 4);
    uint16_t *part16 = xcalloc(part_n, 2);
    Rng r;
    rng_seed(&r, seed);
    for (size_t i = 0; i < acc_n; i++) acc[i] = 4.f * rng_uniform(&r) - 2.f;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH; h++)
                for (int d = 0; d < HS; d++) {
                    const size_t e = mc.part_off + (size_t)(b * T + t) * mc.part_row + (size_t)h * mc.part_head + d;
                    part[e] = (float)((int)(rng_uniform(&r) * 257.f) - 128) / 32.f;  // exact in bf16 and fp16
                    part16[e] = encode16(part[e], dt);
                }
    for (size_t i = 0; i < lse_part_n; i++) lp[i] = NAN;  // plane 0 of each batch row is not the part's
    for (size_t i = 0; i < lse_n; i++) {  // i = (b NH + h) T + t; the part's at plane 1 of (B, 2, NH, T)
        const int kind = (int)(rng_uniform(&r) * 8.f);  // 0: acc +inf, 1: part +inf, 2: both
        const size_t pi = part_lse_at(i, NH, T);
        la[i] = kind == 0 || kind == 2 ? INFINITY : 6.f * rng_uniform(&r) - 1.f;
        lp[pi] = kind == 1 || kind == 2 ? INFINITY : 6.f * rng_uniform(&r) - 1.f;
    }
    AttnParams a = {0}, p = {0};
    a.B = p.B = B;
    a.T_q = a.T_k = p.T_q = p.T_k = T;
    a.NH = a.NKV = p.NH = p.NKV = NH;
    a.HS = p.HS = HS;
    a.o_st = (AttnStrides){(int64_t)T * mc.acc_row, mc.acc_row, HS};
    p.o_st = (AttnStrides){(int64_t)T * mc.part_row, mc.part_row, mc.part_head};
    p.lse_batch_stride = 2 * (int64_t)NH * T;  // (B, 2, NH, T): plane 1
    p.lse_head_stride = T;
    a.dtype = dt;
    p.dtype = DTYPE_F32;

    // The reference: the CPU merge of the same values (the part in fp32, exactly its 16-bit ones).
    float *ref = xmalloc(acc_n * 4), *ref_l = xmalloc(lse_n * 4);
    memcpy(ref, acc, acc_n * 4);
    memcpy(ref_l, la, lse_n * 4);
    AttnParams ca = a, cp = p;
    ca.out = ref;
    ca.lse = ref_l;
    cp.out = part + mc.part_off;
    cp.lse = lp + NH * T;  // plane 1, by the strides above
    attn_merge_cpu(&ca, &cp);

    char err[256] = "";
    AttnContext *ctx = attn_context_create(DEVICE_CUDA, NULL, ATTN_KERNEL_AUTO, err, sizeof err);
    EXPECT(ctx != NULL, "context: %s", err);
    if (!ctx) return;
    float *d_acc, *d_la, *d_lp;
    void *d_part;
    const size_t es = dt == DTYPE_F32 ? 4 : 2;
    CUDA_OK(cudaMalloc((void **)&d_acc, acc_n * 4));
    CUDA_OK(cudaMalloc((void **)&d_la, lse_n * 4));
    CUDA_OK(cudaMalloc((void **)&d_lp, lse_part_n * 4));
    CUDA_OK(cudaMalloc(&d_part, part_n * es));
    CUDA_OK(cudaMemcpy(d_acc, acc, acc_n * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_la, la, lse_n * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_lp, lp, lse_part_n * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_part, dt == DTYPE_F32 ? (void *)part : (void *)part16, part_n * es, cudaMemcpyHostToDevice));
    AttnParams ga = a, gp = p;
    ga.out = d_acc;
    ga.lse = d_la;
    gp.out = (char *)d_part + mc.part_off * es;
    gp.lse = d_lp + NH * T;
    gp.dtype = dt;
    EXPECT(attn_merge(ctx, &ga, &gp, err, sizeof err) == 0, "merge: %s", err);
    CUDA_OK(cudaDeviceSynchronize());
    float *got = xmalloc(acc_n * 4), *got_l = xmalloc(lse_n * 4);
    CUDA_OK(cudaMemcpy(got, d_acc, acc_n * 4, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(got_l, d_la, lse_n * 4, cudaMemcpyDeviceToHost));

    const double u = 0x1p-24;
    int bad_out = 0, bad_lse = 0, bad_pad = 0;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const size_t l = ((size_t)b * NH + h) * T + t;
                const int same_inf = isinf(ref_l[l]) && isinf(got_l[l]);
                const double in_l = fmax(isinf(la[l]) ? 0 : fabs(la[l]), isinf(lp[part_lse_at(l, NH, T)]) ? 0 : fabs(lp[part_lse_at(l, NH, T)]));
                if (!same_inf && !(fabs((double)got_l[l] - ref_l[l]) <= 16 * u * (in_l + 1))) bad_lse++;
                for (int d = 0; d < HS; d++) {
                    const size_t e = (size_t)(b * T + t) * mc.acc_row + (size_t)h * HS + d;
                    const size_t pe = mc.part_off + (size_t)(b * T + t) * mc.part_row + (size_t)h * mc.part_head + d;
                    const double bound = 16 * u * (fabs(acc[e]) + fabs(part[pe])) + 1e-30;
                    if (!(fabs((double)got[e] - ref[e]) <= bound)) bad_out++;
                }
            }
    // The accumulator's padding (elements past NH * HS in a row) is left alone.
    for (size_t row = 0; row < (size_t)B * T; row++)
        for (int64_t e = (int64_t)NH * HS; e < mc.acc_row; e++)
            if (got[row * mc.acc_row + e] != acc[row * mc.acc_row + e]) bad_pad++;
    printf("  %s B=%d T=%d NH=%d HS=%d rows %lld/%lld/%lld: %d outputs, %d lse, %d padding off\n", dtype_name(dt), B, T, NH,
           HS, (long long)mc.acc_row, (long long)mc.part_row, (long long)mc.part_head, bad_out, bad_lse, bad_pad);
    EXPECT(bad_out == 0 && bad_lse == 0 && bad_pad == 0, "%d outputs, %d lse, %d padding elements off", bad_out,
           bad_lse, bad_pad);
    CUDA_OK(cudaFree(d_acc));
    CUDA_OK(cudaFree(d_la));
    CUDA_OK(cudaFree(d_lp));
    CUDA_OK(cudaFree(d_part));
    attn_context_destroy(ctx);
    free(acc), free(part), free(part16), free(la), free(lp), free(ref), free(ref_l), free(got), free(got_l);
}

int main(int argc, char **argv) {
    (void)argc, (void)argv;
    if (!cuda_device_present()) return 0;
    static const int hs[] = {32, 40, 64, 96, 128, 256};
    for (int k = 0; k < 6; k++) {
        const int HS = hs[k], NH = 3;
        char name[96];
        // Contiguous rows, then padded ones (acc rows + 4, part rows + 8 with heads HS + 4 apart).
        MergeCase dense = {2, 37, NH, HS, (int64_t)NH * HS, (int64_t)NH * HS, HS, 0};
        MergeCase padded = {2, 37, NH, HS, (int64_t)NH * HS + 4, (int64_t)NH * (HS + 4) + 8, HS + 4, 4};
        snprintf(name, sizeof name, "HS %d, bf16, contiguous", HS);
        TEST_CASE(name, run_merge(dense, DTYPE_BF16, 11 + k));
        snprintf(name, sizeof name, "HS %d, fp16, padded strides", HS);
        TEST_CASE(name, run_merge(padded, DTYPE_F16, 31 + k));
    }
    // Strides that are not multiples of 4 (the element-wise kernel), and a part 2 elements in.
    MergeCase odd = {1, 53, 2, 64, 2 * 64 + 3, 2 * 66 + 1, 66, 2};
    TEST_CASE("HS 64, bf16, strides not multiples of 4", run_merge(odd, DTYPE_BF16, 77));
    MergeCase f32 = {2, 29, 3, 64, 3 * 64, 3 * 64, 64, 0};
    TEST_CASE("HS 64, fp32 part", run_merge(f32, DTYPE_F32, 91));
    TEST_CASE("HS 96, fp32 part, padded strides", run_merge((MergeCase){2, 29, 3, 96, 3 * 96 + 4, 3 * 100 + 8, 100, 4}, DTYPE_F32, 93));
    return TEST_SUMMARY();
}
