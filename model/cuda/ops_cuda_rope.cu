// ops_cuda_rope: the CUDA backend's rotary position embedding (Backend.rope_forward and
// rope_backward), in place on the query and key heads of the fused qkv buffer in the compute
// dtype. One thread per rotated pair (x[d], x[d + HS/2]): it reads both elements and the
// [cos, sin] pair of its position, rotates in fp32 and rounds once to the dtype (fp32 results
// match the CPU backend's to a rounding: nvcc may fuse the products into FMAs). Backward turns by the opposite angle (the rotation's transpose).
#include "model/cuda/cuda_common.cuh"

#define ROPE_THREADS 256   // threads per block, one pair each

template <typename T>
__global__ void rope_kernel(T *x, const float2 *table, const int *pos, long long n_pairs, int T_,
                            int heads, int half, int OC, float sin_sign) {
    const long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n_pairs) return;
    const int d = (int)(k % half);
    const long long hk = k / half;
    const int h = (int)(hk % heads);
    const long long i = hk / heads;   // token
    const int p = pos ? pos[i] : (int)(i % T_);
    const float2 cs = table[(size_t)p * half + d];
    T *v = x + (size_t)i * OC + (size_t)h * 2 * half;
    const float a = to_f32(v[d]), b = to_f32(v[d + half]), s = sin_sign * cs.y;
    v[d] = from_f32<T>(a * cs.x - b * s);
    v[d + half] = from_f32<T>(b * cs.x + a * s);
}

static void launch_rope(Backend *be, void *x, const float *table, const int *pos, int N, int T,
                        int NH, int NKV, int HS, float sin_sign) {
    const int half = HS / 2, heads = NH + NKV, OC = (NH + 2 * NKV) * HS;
    const long long n_pairs = (long long)N * heads * half;
    if (n_pairs == 0) return;
    dispatch_dtype(be->dtype, [&](auto tag) {
        using E = decltype(tag);
        rope_kernel<E><<<cdiv(n_pairs, ROPE_THREADS), ROPE_THREADS, 0, cuda_ctx(be)->stream>>>(
            (E *)x, (const float2 *)table, pos, n_pairs, T, heads, half, OC, sin_sign);
    });
    CUDA_CHECK_LAUNCH();
}

void cuda_rope_forward(Backend *be, void *qkv, const float *table, const int *pos, int N, int T,
                       int NH, int NKV, int HS) {
    launch_rope(be, qkv, table, pos, N, T, NH, NKV, HS, 1.0f);
}

void cuda_rope_backward(Backend *be, void *dqkv, const float *table, const int *pos, int N, int T,
                        int NH, int NKV, int HS) {
    launch_rope(be, dqkv, table, pos, N, T, NH, NKV, HS, -1.0f);
}
