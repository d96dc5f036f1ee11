// wgmma building blocks (attention/wgmma.cuh) on their own: one warpgroup multiplies 64 x K by
// K x N tiles in every operand orientation the sm90 flash kernels use (K-major and MN-major SW128
// tiles, A from shared memory or from registers, N 64 and 128, K over one and two 64-column
// blocks), bf16 and fp16, against a double-precision product of the same rounded inputs. A wrong
// descriptor field or fragment layout shows here as a named case instead of a wrong attention.
//
// Usage: test_wgmma   (needs a compute capability 9.0 GPU and an sm_90a build)
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "attention/wgmma.cuh"
extern "C" {
#include "common/rng.h"
}
#include "tests/testlib.h"
#include "tests/gpu/cuda_ok.h"

// C (64 x N) = A (64 x K) B (K x N); a and b row-major in global memory, TA / TB the shared
// orientation (0 K-major, 1 MN-major), RS: A from registers (TA ignored).
template <typename T, int N, int K, int TA, int TB, bool RS>
__global__ void wgmma_kernel(const T *a, const T *b, float *c) {
#ifdef FLASH_SM90_DEVICE
    extern __shared__ unsigned char raw[];
    T *sA = reinterpret_cast<T *>(smem_align1024(raw));
    T *sB = sA + 64 * K;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    for (int i = tid; i < 64 * K; i += 128) {
        const int m = i / K, k = i % K;
        sA[TA ? sw128_offset<K>(k, m) : sw128_offset<64>(m, k)] = a[i];
    }
    for (int i = tid; i < K * N; i += 128) {
        const int k = i / N, n = i % N;
        sB[TB ? sw128_offset<K>(k, n) : sw128_offset<N>(n, k)] = b[i];
    }
    fence_proxy_async();
    __syncthreads();
    float d[N / 2];
    for (int i = 0; i < N / 2; i++) d[i] = 0.f;
    const uint32_t abase = smem_u32(sA), bbase = smem_u32(sB);
    auto desc = [](uint32_t base, int rows, int trans, int ks) {
        return trans ? sw128_desc(base + ks * 16 * 128, rows * 128, 1024)
                     : sw128_desc(base + (ks >> 2) * rows * 128 + (ks & 3) * 32, 16, 1024);
    };
    uint32_t af[K / 16][4];
    if (RS) {
        auto pk = [&](int m, int k) {
            return (uint32_t)*reinterpret_cast<const uint16_t *>(&a[m * K + k]) |
                   (uint32_t)*reinterpret_cast<const uint16_t *>(&a[m * K + k + 1]) << 16;
        };
        for (int ks = 0; ks < K / 16; ks++) {
            const int m = warp * 16 + g, k = ks * 16 + 2 * t;
            af[ks][0] = pk(m, k), af[ks][1] = pk(m + 8, k), af[ks][2] = pk(m, k + 8), af[ks][3] = pk(m + 8, k + 8);
        }
    }
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < K / 16; ks++) {
        if (RS) Wgmma<T, N, 0, TB>::rs(d, af[ks], desc(bbase, TB ? K : N, TB, ks), 1);
        else Wgmma<T, N, TA, TB>::ss(d, desc(abase, TA ? K : 64, TA, ks), desc(bbase, TB ? K : N, TB, ks), 1);
    }
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_regs(d);
    for (int j = 0; j < N / 8; j++)
        for (int e = 0; e < 4; e++) c[(warp * 16 + g + 8 * (e >> 1)) * N + 8 * j + 2 * t + (e & 1)] = d[4 * j + e];
#endif
}

template <typename T> static float to_f(T x);
template <> float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
template <> float to_f(__half x) { return __half2float(x); }
template <typename T> static T from_f(float x);
template <> __nv_bfloat16 from_f(float x) { return __float2bfloat16(x); }
template <> __half from_f(float x) { return __float2half(x); }

template <typename T, int N, int K, int TA, int TB, bool RS> static void run(Rng *rng) {
    T *ha = (T *)malloc(64 * K * sizeof(T)), *hb = (T *)malloc(K * N * sizeof(T));
    float *hc = (float *)malloc(64 * N * sizeof(float));
    for (int i = 0; i < 64 * K; i++) ha[i] = from_f<T>(rng_normal(rng));
    for (int i = 0; i < K * N; i++) hb[i] = from_f<T>(rng_normal(rng));
    T *da, *db;
    float *dc;
    CUDA_OK(cudaMalloc(&da, 64 * K * sizeof(T)));
    CUDA_OK(cudaMalloc(&db, K * N * sizeof(T)));
    CUDA_OK(cudaMalloc(&dc, 64 * N * sizeof(float)));
    CUDA_OK(cudaMemcpy(da, ha, 64 * K * sizeof(T), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(db, hb, K * N * sizeof(T), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(dc, 0xFF, 64 * N * sizeof(float)));  // NaN poison
    const int smem = 1024 + (64 * K + K * N) * (int)sizeof(T);
    auto kernel = wgmma_kernel<T, N, K, TA, TB, RS>;
    CUDA_OK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    kernel<<<1, 128, smem>>>(da, db, dc);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaMemcpy(hc, dc, 64 * N * sizeof(float), cudaMemcpyDeviceToHost));
    double worst = 0;
    int bad = 0;
    for (int m = 0; m < 64; m++)
        for (int n = 0; n < N; n++) {
            double ref = 0, mag = 0;
            for (int k = 0; k < K; k++) {
                const double x = (double)to_f(ha[m * K + k]) * to_f(hb[k * N + n]);
                ref += x, mag += fabs(x);
            }
            const double err = fabs(hc[m * N + n] - ref) / (mag + 1e-30);
            if (!(err < 1e-5)) bad++;  // fp32 accumulation of K exact products
            if (!(err <= worst)) worst = err;
        }
    EXPECT(bad == 0, "%d of %d elements off, worst relative error %.3g", bad, 64 * N, worst);
    cudaFree(da), cudaFree(db), cudaFree(dc), free(ha), free(hb), free(hc);
}

int main(void) {
    int dev = 0, major = 0, minor = 0;
    CUDA_OK(cudaGetDevice(&dev));
    CUDA_OK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    CUDA_OK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    cudaFuncAttributes fa;
    CUDA_OK(cudaFuncGetAttributes(&fa, wgmma_kernel<__nv_bfloat16, 64, 64, 0, 0, false>));
    EXPECT(major * 10 + minor == 90 && fa.binaryVersion == 90,
           "needs a compute capability 9.0 GPU and sm_90a code (device %d.%d, code %d)", major, minor,
           fa.binaryVersion);
    if (major * 10 + minor != 90 || fa.binaryVersion != 90) return TEST_SUMMARY();
    Rng rng;
    rng_seed(&rng, 7);
    typedef __nv_bfloat16 BF;
    TEST_CASE("bf16 SS K/K-major N=128 K=128 (S = Q K^T)", (run<BF, 128, 128, 0, 0, false>(&rng)));
    TEST_CASE("bf16 SS K/K-major N=64 K=64", (run<BF, 64, 64, 0, 0, false>(&rng)));
    TEST_CASE("bf16 RS MN-major B N=128 K=64 (O += P V, HS 128)", (run<BF, 128, 64, 0, 1, true>(&rng)));
    TEST_CASE("bf16 RS MN-major B N=64 K=128 (O += P V, HS 64)", (run<BF, 64, 128, 0, 1, true>(&rng)));
    TEST_CASE("bf16 RS K-major B N=128 K=128", (run<BF, 128, 128, 0, 0, true>(&rng)));
    TEST_CASE("bf16 SS MN/MN-major N=64 K=128 (dQ = dS K)", (run<BF, 64, 128, 1, 1, false>(&rng)));
    TEST_CASE("bf16 SS MN/MN-major N=128 K=64", (run<BF, 128, 64, 1, 1, false>(&rng)));
    TEST_CASE("fp16 SS K/K-major N=128 K=128", (run<__half, 128, 128, 0, 0, false>(&rng)));
    TEST_CASE("fp16 RS MN-major B N=128 K=128", (run<__half, 128, 128, 0, 1, true>(&rng)));
    return TEST_SUMMARY();
}
