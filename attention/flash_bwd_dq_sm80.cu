// flash_bwd_dq_sm80: dQ for the deterministic backward. One block per (query tile, head, batch row),
// each warp owning 16 query rows as in the forward; it walks the visible key tiles in a fixed
// order and accumulates dQ = scale * sum_j dS K in registers, so no atomics reorder the sums and
// two runs give the same bits. Costs one more recomputation of S and dP than the atomic path.
#include "attention/flash_common.cuh"
#include "attention/flash_mask.cuh"
#include "attention/flash_tiles.cuh"

template <typename T, int HS, bool EXTRAS>
__global__ void __launch_bounds__(DqTile<HS>::NTHREADS) flash_bwd_dq_kernel(const AttnParams p, const float *dsum) {
    using Tile = DqTile<HS>;
    constexpr int BM = Tile::BM, BN = Tile::BN, NT = Tile::NTHREADS;
    constexpr int KSTEPS = HS / 16;
    constexpr int NS = BN / 8;  // n8 tiles of S and dP per warp
    constexpr int ND = HS / 8;  // n8 tiles of dQ per warp
    extern __shared__ __align__(16) unsigned char smem_raw[];
    auto &sm = smem_storage<DqSmem<T, HS>>(smem_raw);
    T *sQ = sm.q, *sdO = sm.dout, *sK = sm.k, *sV = sm.v;  // (BM, HS), (BM, HS), (BN, HS), (BN, HS)

    const QueryBlock qb = query_block<EXTRAS>(p, BM, BN);
    const int h = qb.h, b = qb.b, m0 = qb.m0, m_valid = qb.m_valid;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;

    const QueryBases<T> base = query_bases<T>(p, qb);
    const T *q = base.q, *k = base.k, *v = base.v;
    const T *dO = tensor_at(static_cast<const T *>(p.dout), p.do_st, b, m0, h);

    const int row0 = m0 + warp * 16 + g;
    float lse2[2], dd[2];
    RowRange rr[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int i = row0 + 8 * r;
        const bool ok = i < p.T_q;
        lse2[r] = ok ? p.lse[attn_lse_offset(&p, b, h) + i] * LOG2E_F : INFINITY;  // padding rows: P = 0
        dd[r] = ok ? dsum[((int64_t)b * p.NH + h) * p.T_q + i] : 0.f;  // D is contiguous
        rr[r] = row_range(p, b, ok ? i : p.T_q - 1);
    }
    const int pos0 = row0 + (int)attn_query_shift(&p);  // position of row0, in keys
    const float scale_log2 = p.scale * LOG2E_F;
    float slope_log2 = 0.f, keep_scale = 1.f;
    uint32_t keep_thresh = 0;
    uint64_t keep_offset = 0;  // the Philox offset, read once (it may sit in device memory)
    if (EXTRAS) {
        if (p.alibi_slopes) slope_log2 = alibi_slope(p, b, h) * LOG2E_F;
        if (p.dropout_p > 0.f) {
            keep_scale = attn_dropout_scale(p.dropout_p), keep_thresh = attn_dropout_threshold(p.dropout_p);
            keep_offset = attn_dropout_offset(&p);
        }
    }

    tile_load_async<BM, HS, NT>(sQ, q, p.q_st.row, m_valid, tid);
    tile_load_async<BM, HS, NT>(sdO, dO, p.do_st.row, m_valid, tid);
    cp_async_commit();

    float dq[ND][4];
#pragma unroll
    for (int i = 0; i < ND; i++) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.f;

    for (int it = 0; it < qb.n_tiles(); it++) {  // the visible, present key tiles
        const int n0 = qb.key_tile(it) * BN;
        tile_load_async<BN, HS, NT>(sK, k + (int64_t)n0 * p.k_st.row, p.k_st.row, p.T_k - n0, tid);
        tile_load_async<BN, HS, NT>(sV, v + (int64_t)n0 * p.v_st.row, p.v_st.row, p.T_k - n0, tid);
        cp_async_commit();
        cp_async_wait<0>();
        __syncthreads();

        float s[NS][4], dp[NS][4];
#pragma unroll
        for (int i = 0; i < NS; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[i][e] = dp[i][e] = 0.f;
        // S = Q K^T and dP = dO V^T, k-step ks (16 columns of the head dimension).
        auto sd_kstep = [&](int ks) {
            uint32_t qa[4], oa[4];
            ldmatrix_x4(qa, frag_addr_a<HS>(sQ, warp * 16, ks * 16, lane));
            ldmatrix_x4(oa, frag_addr_a<HS>(sdO, warp * 16, ks * 16, lane));
#pragma unroll
            for (int np = 0; np < NS / 2; np++) {
                uint32_t kb[4], vb[4];
                ldmatrix_x4(kb, frag_addr_b_nk<HS>(sK, np * 16, ks * 16, lane));
                ldmatrix_x4(vb, frag_addr_b_nk<HS>(sV, np * 16, ks * 16, lane));
                mma_16816<T>(s[2 * np], qa, kb[0], kb[1]);
                mma_16816<T>(s[2 * np + 1], qa, kb[2], kb[3]);
                mma_16816<T>(dp[2 * np], oa, vb[0], vb[1]);
                mma_16816<T>(dp[2 * np + 1], oa, vb[2], vb[3]);
            }
        };
        if constexpr (Tile::KSTEPS_UNROLLED) {
#pragma unroll
            for (int ks = 0; ks < KSTEPS; ks++) sd_kstep(ks);
        } else {
#pragma unroll 1
            for (int ks = 0; ks < KSTEPS; ks++) sd_kstep(ks);
        }

        // dS = P * (dP - D) in place of S, masked per element only in the Masked<true> instance;
        // dropout's keep bits (bit e of keep4[nt]: flash_mask.cuh's element e) one Philox block per
        // 16 elements. Rows past T_q and keys past T_k have P 0.
        unsigned keep4[NS];
#pragma unroll
        for (int nt = 0; nt < NS; nt++) keep4[nt] = 15;
        if (EXTRAS && p.dropout_p > 0.f)
            dropout_fragment_fwd<NS>(p, keep_offset, keep_thresh, b, h, row0 - g, n0, g, t, [&](int nt, int e, bool keep) {
                if (!keep) keep4[nt] &= ~(1u << e);
            });
        auto ds_step = [&](auto masked) {
#pragma unroll
            for (int nt = 0; nt < NS; nt++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int r = e >> 1, j = n0 + nt * 8 + 2 * t + (e & 1);
                    float x = s[nt][e] * scale_log2;
                    if (EXTRAS && p.alibi_slopes) x += alibi_bias_log2(slope_log2, pos0 + 8 * r, j);
                    if (decltype(masked)::value && (j < rr[r].lo || j >= rr[r].hi)) x = -INFINITY;
                    const float pr = exp2f(x - lse2[r]);
                    float d = dp[nt][e];
                    if (EXTRAS && p.dropout_p > 0.f) d = keep4[nt] >> e & 1 ? d * keep_scale : 0.f;
                    s[nt][e] = pr * (d - dd[r]);  // dS
                }
            }
        };
        step_by_class(tile_class(qb.first, qb.last, n0, n0 + BN) != TILE_FULL, ds_step);

#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
            uint32_t a[4];
            c_to_a<T>(a, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
            for (int np = 0; np < HS / 16; np++) {
                uint32_t kb[4];
                ldmatrix_x4_trans(kb, frag_addr_b_kn<HS>(sK, kk * 16, np * 16, lane));
                mma_16816<T>(dq[2 * np], a, kb[0], kb[1]);
                mma_16816<T>(dq[2 * np + 1], a, kb[2], kb[3]);
            }
        }
        __syncthreads();  // every warp is done with this K/V tile
    }
    cp_async_wait<0>();
    __syncthreads();  // the Q/dO copies are done even when no key tile was visited

    if (p.accumulate) {  // dq is fp32 (attention.h): added to from the registers
#pragma unroll
        for (int r = 0; r < 2; r++)
            if (row0 + 8 * r < p.T_q) {
                float *dqr = tensor_at(static_cast<float *>(p.dq), p.dq_st, b, row0 + 8 * r, h);
#pragma unroll
                for (int i = 0; i < ND; i++)
                    add_pair(dqr + i * 8 + 2 * t, dq[i][2 * r] * p.scale, dq[i][2 * r + 1] * p.scale);
            }
        return;
    }
    T *sdQ = sQ + warp * 16 * HS;  // this warp's own rows
#pragma unroll
    for (int i = 0; i < ND; i++)
#pragma unroll
        for (int r = 0; r < 2; r++)
            *reinterpret_cast<uint32_t *>(sdQ + SwizzledTile<HS>::offset(g + 8 * r, i * 8 + 2 * t)) =
                ElemTraits<T>::pack(dq[i][2 * r] * p.scale, dq[i][2 * r + 1] * p.scale);
    __syncwarp();
    T *dqg = tensor_at(static_cast<T *>(p.dq), p.dq_st, b, m0 + warp * 16, h);
    tile_store<16, HS, 32>(dqg, p.dq_st.row, sdQ, p.T_q - (m0 + warp * 16), lane);
}

template <typename T, int HS, bool EXTRAS>
void flash_bwd_dq_launch(const AttnParams &p, const float *dsum, cudaStream_t s) {
    using Tile = DqTile<HS>;
    flash_launch<DqSmem<T, HS>, SM80_SMEM_LIMIT>(flash_bwd_dq_kernel<T, HS, EXTRAS>, dim3(cdiv(p.T_q, Tile::BM), p.NH, p.B),
                                                 Tile::NTHREADS, s, p, dsum);
}

#define INSTANTIATE_DQ(T, HS)                                                                     \
    template void flash_bwd_dq_launch<T, HS, false>(const AttnParams &, const float *, cudaStream_t); \
    template void flash_bwd_dq_launch<T, HS, true>(const AttnParams &, const float *, cudaStream_t);
FLASH_SM80_FOR_EACH_HS(INSTANTIATE_DQ, __nv_bfloat16)
FLASH_SM80_FOR_EACH_HS(INSTANTIATE_DQ, __half)
