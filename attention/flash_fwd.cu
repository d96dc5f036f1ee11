// flash_fwd: the FlashAttention-2 forward kernel for sm80+ (mma.sync m16n8k16, bf16/fp16 inputs,
// fp32 accumulation). One block per (query tile, head, batch row); each warp owns 16 query rows,
// loops over the visible key tiles with an online softmax, writes O once and the fp32 LSE.
#include "attention/flash_common.cuh"
#include "attention/flash_mask.cuh"
#include "attention/flash_tiles.cuh"

template <typename T, int HS, bool EXTRAS>
__global__ void __launch_bounds__(FwdTile<HS>::NTHREADS) flash_fwd_kernel(const AttnParams p) {
    using Tile = FwdTile<HS>;
    constexpr int BM = Tile::BM, BN = Tile::BN, NT = Tile::NTHREADS;
    constexpr int KSTEPS = HS / 16;  // k-steps of S = Q K^T
    constexpr int NS = BN / 8;       // n8 tiles of the scores per warp
    constexpr int NO = HS / 8;       // n8 tiles of the output per warp
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T *sQ = reinterpret_cast<T *>(smem_raw);  // (BM, HS), later the staging area for O
    T *sK = sQ + BM * HS;                     // (BN, HS)
    T *sV = sK + BN * HS;                     // (BN, HS)

    // Causal blocks late in the sequence carry the most key tiles: start them first.
    const int m_block = p.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
    const int h = blockIdx.y, b = blockIdx.z, kvh = h / (p.NH / p.NKV);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int m0 = m_block * BM, m_valid = min(BM, p.T_q - m0);

    const T *q = static_cast<const T *>(p.q) + b * p.q_st.batch + m0 * p.q_st.row + h * p.q_st.head;
    const T *k = static_cast<const T *>(p.k) + b * p.k_st.batch + kvh * p.k_st.head;
    const T *v = static_cast<const T *>(p.v) + b * p.v_st.batch + kvh * p.v_st.head;

    const RowRange first = row_range(p, b, m0), last = row_range(p, b, m0 + m_valid - 1);
    const int nb_begin = max(first.lo, 0) / BN;
    const int nb_end = max(cdiv(min(last.hi, p.T_k), BN), nb_begin);

    // This thread's two rows (g and g+8 of the warp's 16), clamped for the ragged last tile.
    const int row0 = m0 + warp * 16 + g;
    RowRange rr[2] = {row_range(p, b, min(row0, p.T_q - 1)), row_range(p, b, min(row0 + 8, p.T_q - 1))};
    const int pos0 = row0 + (p.T_k - p.T_q);
    const float scale_log2 = p.scale * LOG2E_F;
    float slope_log2 = 0.f, keep_scale = 1.f;
    if (EXTRAS) {
        if (p.alibi_slopes) slope_log2 = p.alibi_slopes[h] * LOG2E_F;
        if (p.dropout_p > 0.f) keep_scale = 1.f / (1.f - p.dropout_p);
    }

    tile_load_async<BM, HS, NT>(sQ, q, p.q_st.row, m_valid, tid);
    cp_async_commit();
    if (nb_end > nb_begin) {
        int n0 = (nb_end - 1) * BN;
        tile_load_async<BN, HS, NT>(sK, k + (int64_t)n0 * p.k_st.row, p.k_st.row, p.T_k - n0, tid);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    uint32_t qf[KSTEPS][4];  // this warp's 16 x HS slice of Q as A fragments
#pragma unroll
    for (int ks = 0; ks < KSTEPS; ks++) ldmatrix_x4(qf[ks], frag_addr_a<HS>(sQ, warp * 16, ks * 16, lane));

    float o[NO][4];  // (16, HS) output accumulator
#pragma unroll
    for (int i = 0; i < NO; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float row_max[2] = {-INFINITY, -INFINITY};  // running max, log2 domain
    float row_sum[2] = {0.f, 0.f};              // this thread's share of the running sum

    // Key tiles from last to first: the partial (diagonal, ragged) tiles come first, then the bulk.
    for (int nb = nb_end - 1; nb >= nb_begin; nb--) {
        const int n0 = nb * BN;
        cp_async_wait<0>();
        __syncthreads();  // K tile nb has landed; every warp is done with the previous V tile
        tile_load_async<BN, HS, NT>(sV, v + (int64_t)n0 * p.v_st.row, p.v_st.row, p.T_k - n0, tid);
        cp_async_commit();

        float s[NS][4];  // (16, BN) scores of this warp
#pragma unroll
        for (int i = 0; i < NS; i++) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ks++) {
#pragma unroll
            for (int np = 0; np < NS / 2; np++) {
                uint32_t kb[4];
                ldmatrix_x4(kb, frag_addr_b_nk<HS>(sK, np * 16, ks * 16, lane));
                mma_16816<T>(s[2 * np], qf[ks], kb[0], kb[1]);
                mma_16816<T>(s[2 * np + 1], qf[ks], kb[2], kb[3]);
            }
        }

        const bool partial = tile_class(first, last, n0, n0 + BN) == TILE_PARTIAL;
#pragma unroll
        for (int nt = 0; nt < NS; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = e >> 1, j = n0 + nt * 8 + 2 * t + (e & 1);
                float x = s[nt][e] * scale_log2;
                if (EXTRAS && p.alibi_slopes) x += alibi_bias_log2(slope_log2, pos0 + 8 * r, j);
                if (partial && (j < rr[r].lo || j >= rr[r].hi)) x = -INFINITY;
                s[nt][e] = x;
            }
        }

        // Online softmax: rescale what was accumulated under the old max. A row that has seen
        // only masked keys keeps max -inf and uses 0 in its place, so exp2 gives 0, never NaN.
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float mx = row_max[r];
#pragma unroll
            for (int nt = 0; nt < NS; nt++) mx = fmaxf(mx, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float m_use = mx == -INFINITY ? 0.f : mx;
            const float corr = exp2f(row_max[r] - m_use);
            row_max[r] = mx;
            row_sum[r] *= corr;
#pragma unroll
            for (int i = 0; i < NO; i++) {
                o[i][2 * r] *= corr;
                o[i][2 * r + 1] *= corr;
            }
#pragma unroll
            for (int nt = 0; nt < NS; nt++) {
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    float pr = exp2f(s[nt][2 * r + c] - m_use);
                    row_sum[r] += pr;
                    if (EXTRAS && p.dropout_p > 0.f) {
                        const int j = n0 + nt * 8 + 2 * t + c;
                        pr = dropout_keep(p, b, h, row0 + 8 * r, j) ? pr * keep_scale : 0.f;
                    }
                    s[nt][2 * r + c] = pr;
                }
            }
        }

        cp_async_wait<0>();
        __syncthreads();  // V tile nb has landed; every warp is done with K tile nb
        if (nb > nb_begin) {
            int n1 = (nb - 1) * BN;
            tile_load_async<BN, HS, NT>(sK, k + (int64_t)n1 * p.k_st.row, p.k_st.row, p.T_k - n1, tid);
        }
        cp_async_commit();

#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
            uint32_t pa[4];
            c_to_a<T>(pa, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
            for (int dp = 0; dp < HS / 16; dp++) {
                uint32_t vb[4];
                ldmatrix_x4_trans(vb, frag_addr_b_kn<HS>(sV, kk * 16, dp * 16, lane));
                mma_16816<T>(o[2 * dp], pa, vb[0], vb[1]);
                mma_16816<T>(o[2 * dp + 1], pa, vb[2], vb[3]);
            }
        }
    }

    // Finish: O /= rowsum; a fully masked row (sum 0) writes 0 and LSE +inf.
    T *sO = sQ + warp * 16 * HS;  // this warp's own rows of sQ (only it ever read them)
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float sum = row_sum[r];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        const float inv = sum > 0.f ? 1.f / sum : 0.f;
        const int row = row0 + 8 * r;
        if (p.lse && t == 0 && row < p.T_q)
            p.lse[((int64_t)b * p.NH + h) * p.T_q + row] =
                sum > 0.f ? (row_max[r] + log2f(sum)) * LN2_F : INFINITY;
#pragma unroll
        for (int i = 0; i < NO; i++) {
            *reinterpret_cast<uint32_t *>(sO + SwizzledTile<HS>::offset(g + 8 * r, i * 8 + 2 * t)) =
                ElemTraits<T>::pack(o[i][2 * r] * inv, o[i][2 * r + 1] * inv);
        }
    }
    __syncwarp();
    T *out = static_cast<T *>(p.out) + b * p.o_st.batch + (int64_t)(m0 + warp * 16) * p.o_st.row +
             h * p.o_st.head;
    tile_store<16, HS, 32>(out, p.o_st.row, sO, p.T_q - (m0 + warp * 16), lane);
}

template <typename T, int HS, bool EXTRAS> void flash_fwd_launch(const AttnParams &p, cudaStream_t s) {
    using Tile = FwdTile<HS>;
    auto kernel = flash_fwd_kernel<T, HS, EXTRAS>;
    ATTN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)Tile::SMEM));
    dim3 grid(cdiv(p.T_q, Tile::BM), p.NH, p.B);
    kernel<<<grid, Tile::NTHREADS, Tile::SMEM, s>>>(p);
    ATTN_CUDA_CHECK(cudaGetLastError());
}

#define INSTANTIATE_FWD(T, HS)                                                  \
    template void flash_fwd_launch<T, HS, false>(const AttnParams &, cudaStream_t); \
    template void flash_fwd_launch<T, HS, true>(const AttnParams &, cudaStream_t);
INSTANTIATE_FWD(__nv_bfloat16, 64)
INSTANTIATE_FWD(__nv_bfloat16, 128)
INSTANTIATE_FWD(__half, 64)
INSTANTIATE_FWD(__half, 128)
