// merge_cuda: attn_merge on the GPU (attention/attention.h), the same exact combination as
// merge_cpu.c: a partial result over other keys (out of dtype, fp32 lse) into an fp32
// accumulator, through their log-sum-exp, from the larger lse down. One warp per query row
// (b, h, i); its lanes cover the head dimension.
#include "attention/attention_gpu.h"
#include "attention/flash_common.cuh"
#include "attention/mask.h"

namespace {

constexpr int MERGE_WARPS = 8;

template <typename T>
__global__ void __launch_bounds__(MERGE_WARPS * 32) merge_kernel(const AttnParams acc, const AttnParams part) {
    const int64_t row = (int64_t)blockIdx.x * MERGE_WARPS + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (row >= (int64_t)acc.B * acc.NH * acc.T_q) return;
    const int i = (int)(row % acc.T_q), h = (int)(row / acc.T_q % acc.NH);
    const int b = (int)(row / ((int64_t)acc.T_q * acc.NH));
    const float lp = part.lse[attn_lse_offset(&part, b, h) + i];
    if (lp == INFINITY) return;  // no visible key in the part: it adds nothing
    float *la = acc.lse + attn_lse_offset(&acc, b, h) + i;
    const float a = *la;
    float wa = 0.f, wp = 1.f, lse = lp;  // an empty accumulator (lse +inf) takes the part
    if (a != INFINITY) {
        const float hi = fmaxf(a, lp), lo = fminf(a, lp);
        lse = hi + log1pf(expf(lo - hi));
        wa = expf(a - lse);
        wp = expf(lp - lse);
    }
    float *o = static_cast<float *>(acc.out) + b * acc.o_st.batch + i * acc.o_st.row + h * acc.o_st.head;
    const T *op = static_cast<const T *>(part.out) + b * part.o_st.batch + i * part.o_st.row + h * part.o_st.head;
    for (int d = lane; d < acc.HS; d += 32) o[d] = (a == INFINITY ? 0.f : o[d] * wa) + ElemTraits<T>::to_float(op[d]) * wp;
    if (lane == 0) *la = lse;
}

}  // namespace

int attn_gpu_merge(AttnGpu *g, const AttnParams *acc, const AttnParams *part, char *err, size_t errlen) {
    const int64_t rows = (int64_t)acc->B * acc->NH * acc->T_q;
    const dim3 grid((unsigned)((rows + MERGE_WARPS - 1) / MERGE_WARPS));
    cudaStream_t s = (cudaStream_t)attn_gpu_stream(g);
    switch (part->dtype) {
    case DTYPE_BF16: merge_kernel<__nv_bfloat16><<<grid, MERGE_WARPS * 32, 0, s>>>(*acc, *part); break;
    case DTYPE_F16: merge_kernel<__half><<<grid, MERGE_WARPS * 32, 0, s>>>(*acc, *part); break;
    default: merge_kernel<float><<<grid, MERGE_WARPS * 32, 0, s>>>(*acc, *part); break;
    }
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        snprintf(err, errlen, "attention: the merge kernel failed to launch: %s", cudaGetErrorString(e));
        return -1;
    }
    return 0;
}
