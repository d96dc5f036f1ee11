// flash_fwd_sm80: the FlashAttention-2 forward kernel for sm80+ (mma.sync m16n8k16, bf16/fp16 inputs,
// fp32 accumulation). One block per (query tile, head, batch row); each warp owns 16 query rows,
// loops over the visible key tiles with an online softmax, writes O once and the fp32 LSE.
#include "attention/flash_common.cuh"
#include "attention/flash_mask.cuh"
#include "attention/flash_tiles.cuh"

template <typename T, int HS, bool EXTRAS>
__global__ void __launch_bounds__(FwdTile<HS>::NTHREADS, FwdTile<HS>::MIN_BLOCKS)
    flash_fwd_kernel(const AttnParams p) {
    using Tile = FwdTile<HS>;
    constexpr int BM = Tile::BM, BN = Tile::BN, NT = Tile::NTHREADS, MT = Tile::MT;
    constexpr int WROWS = 16 * MT;   // query rows per warp
    constexpr int KSTEPS = HS / 16;  // k-steps of S = Q K^T
    constexpr int NS = BN / 8;       // n8 tiles of the scores per m-tile
    constexpr int NO = HS / 8;       // n8 tiles of the output per m-tile
    extern __shared__ __align__(16) unsigned char smem_raw[];
    auto &sm = smem_storage<FwdSmem<T, HS>>(smem_raw);
    T *sQ = sm.q, *sK = sm.k[0], *sV = sm.v[0];  // (BM, HS), 2 x (BN, HS), 2 x (BN, HS)

    const QueryBlock qb = query_block<EXTRAS>(p, BM, BN);
    const int h = qb.h, b = qb.b, m0 = qb.m0, m_valid = qb.m_valid;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;

    const QueryBases<T> base = query_bases<T>(p, qb);
    const T *q = base.q, *k = base.k, *v = base.v;

    // This thread's rows: g and g+8 of each of the warp's m-tiles (clamped for the ragged tail).
    const int wrow0 = m0 + warp * WROWS;
    RowRange rr[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) rr[mt][r] = row_range(p, b, min(wrow0 + mt * 16 + 8 * r + g, p.T_q - 1));
    const float scale_log2 = p.scale * LOG2E_F;
    // Scores stay raw and the scale folds into the exponent's FMA, unless ALiBi must be added
    // in the scaled domain first (or the scale is not positive, which would reverse the max).
    const bool prescale = (EXTRAS && p.alibi_slopes) || !(p.scale > 0.f);
    const float sl = prescale ? 1.f : scale_log2;
    const int pos0 = wrow0 + (int)attn_query_shift(&p);  // position of the warp's first row, in keys
    float slope_log2 = 0.f, keep_scale = 1.f;  // the survivors' scale, applied to O at the end
    uint32_t keep_thresh = 0;
    uint64_t keep_offset = 0;  // the Philox offset, read once (it may sit in device memory)
    if (EXTRAS) {
        if (p.alibi_slopes) slope_log2 = alibi_slope(p, b, h) * LOG2E_F;
        if (p.dropout_p > 0.f) {
            keep_scale = attn_dropout_scale(p.dropout_p), keep_thresh = attn_dropout_threshold(p.dropout_p);
            keep_offset = attn_dropout_offset(&p);
        }
    }

    // Loop step `it` computes key tile qb.key_tile(it) from stage it & 1 while the loads of step
    // it - 1 fill the other stage.
    auto load_kv = [&](int it) {
        const int n0 = qb.key_tile(it) * BN, st = it & 1;
        tile_load_async<BN, HS, NT>(sK + st * BN * HS, k + (int64_t)n0 * p.k_st.row, p.k_st.row, p.T_k - n0, tid);
        tile_load_async<BN, HS, NT>(sV + st * BN * HS, v + (int64_t)n0 * p.v_st.row, p.v_st.row, p.T_k - n0, tid);
    };
    tile_load_async<BM, HS, NT>(sQ, q, p.q_st.row, m_valid, tid);
    if (qb.n_tiles() > 0) load_kv(qb.n_tiles() - 1);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    // Q as A fragments: kept in registers when they fit beside O (HS 64), else re-read per tile.
    uint32_t qf[Tile::Q_IN_REGS ? MT : 1][Tile::Q_IN_REGS ? KSTEPS : 1][4];
    if (Tile::Q_IN_REGS) {
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int ks = 0; ks < KSTEPS; ks++)
                ldmatrix_x4(qf[mt][ks], frag_addr_a<HS>(sQ, warp * WROWS + mt * 16, ks * 16, lane));
    }

    uint32_t voff[HS / 16];  // byte offsets of this lane's V fragment rows, per 16 output columns
#pragma unroll
    for (int dp = 0; dp < HS / 16; dp++) voff[dp] = frag_addr_b_kn<HS>(sV, 0, dp * 16, lane) - smem_u32(sV);

    float o[MT][NO][4];  // (WROWS, HS) output accumulator
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int i = 0; i < NO; i++) o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.f;
    float row_max[MT][2], row_sum[MT][2];  // running max (log2 domain); this thread's share of the sum
#pragma unroll
    for (int mt = 0; mt < MT; mt++) row_max[mt][0] = row_max[mt][1] = -INFINITY, row_sum[mt][0] = row_sum[mt][1] = 0.f;

    // Key tiles from last to first: the partial (diagonal, ragged) tiles come first, then the
    // bulk, each class in its own loop (for_tile_runs; `masked` is a compile-time flag).
    for_tile_runs(tile_runs(qb, BN), 0, [&](int w, auto masked) {
        const int it = qb.n_tiles() - 1 - w;
        const int n0 = qb.key_tile(it) * BN;
        const T *cK = sK + (it & 1) * BN * HS, *cV = sV + (it & 1) * BN * HS;
        cp_async_wait<0>();
        __syncthreads();  // step it's tile has landed; every warp is done with step it+1's, whose stage
                          // the next load overwrites
        if (it > 0) load_kv(it - 1);
        cp_async_commit();

        float s[MT][NS][4];  // (WROWS, BN) scores of this warp
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int i = 0; i < NS; i++) s[mt][i][0] = s[mt][i][1] = s[mt][i][2] = s[mt][i][3] = 0.f;
        // (with Q re-read from shared memory, rolling this loop keeps ptxas from hoisting every
        // fragment load of the tile at once and spilling). Fragment addresses: one swizzled
        // address per k-step, then constant offsets (the swizzle repeats every 8 rows).
#pragma unroll(Tile::Q_IN_REGS ? KSTEPS : 1)
        for (int ks = 0; ks < KSTEPS; ks++) {
            uint32_t qa[MT][4];
            if (Tile::Q_IN_REGS) {
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) qa[mt][e] = qf[Tile::Q_IN_REGS ? mt : 0][Tile::Q_IN_REGS ? ks : 0][e];
            } else {
                const uint32_t qaddr = frag_addr_a<HS>(sQ, warp * WROWS, ks * 16, lane);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) ldmatrix_x4(qa[mt], qaddr + mt * 16 * HS * 2);
            }
            const uint32_t kaddr = frag_addr_b_nk<HS>(cK, 0, ks * 16, lane);
            mma_pairs<T, false>(s, qa, [&](int np) { return kaddr + np * 16 * HS * 2; });
        }

        // Scores to probabilities, masked per element only in the partial tiles' instance.
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            if (prescale) {  // ALiBi (or a non-positive scale): move to the log2 domain first
#pragma unroll
                for (int nt = 0; nt < NS; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int r = e >> 1, j = n0 + nt * 8 + 2 * t + (e & 1);
                        float x = s[mt][nt][e] * scale_log2;
                        if (EXTRAS && p.alibi_slopes)
                            x += alibi_bias_log2(slope_log2, pos0 + mt * 16 + 8 * r + g, j);
                        s[mt][nt][e] = x;
                    }
            }
            if constexpr (decltype(masked)::value) mask_scores<NS>(&s[mt][0][0], rr[mt], n0, t);

            // Online softmax: rescale what was accumulated under the old max. A row that has seen
            // only masked keys keeps max -inf and uses 0 in its place, so exp2 gives 0, never NaN.
#pragma unroll
            for (int r = 0; r < 2; r++) {
                float mx = -INFINITY;
#pragma unroll
                for (int nt = 0; nt < NS; nt++) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * r], s[mt][nt][2 * r + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                mx = fmaxf(row_max[mt][r], mx * sl);  // to the log2 domain (sl > 0 keeps the order)
                const float m_use = mx == -INFINITY ? 0.f : mx;
                const float corr = exp2f(row_max[mt][r] - m_use);
                row_max[mt][r] = mx;
                row_sum[mt][r] *= corr;
#pragma unroll
                for (int i = 0; i < NO; i++) {
                    o[mt][i][2 * r] *= corr;
                    o[mt][i][2 * r + 1] *= corr;
                }
#pragma unroll
                for (int nt = 0; nt < NS; nt++) {
#pragma unroll
                    for (int c = 0; c < 2; c++) {
                        const float pr = exp2f(fmaf(s[mt][nt][2 * r + c], sl, -m_use));
                        row_sum[mt][r] += pr;
                        s[mt][nt][2 * r + c] = pr;
                    }
                }
            }
            // Dropout after the sums (over the undropped probabilities), one Philox block per 16
            // elements (flash_mask.cuh).
            if (EXTRAS && p.dropout_p > 0.f)
                dropout_fragment_fwd<NS>(p, keep_offset, keep_thresh, b, h, wrow0 + mt * 16, n0, g, t,
                                         [&](int nt, int e, bool keep) {
                                             if (!keep) s[mt][nt][e] = 0.f;
                                         });
        }

        const uint32_t vbase = smem_u32(cV);
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
            uint32_t pa[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) c_to_a<T>(pa[mt], s[mt][2 * kk], s[mt][2 * kk + 1]);
            mma_pairs<T, true>(o, pa, [&](int dp) { return vbase + kk * 16 * HS * 2 + voff[dp]; });
        }
    });

    // Finish: O times keep_scale / rowsum; a fully masked row (sum 0) writes 0 and LSE +inf.
    __syncthreads();  // with Q re-read from shared memory, every warp must be done with it
    T *sO = sQ + warp * WROWS * HS;  // this warp's own rows of sQ
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float sum = row_sum[mt][r];
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            const float inv = sum > 0.f ? keep_scale / sum : 0.f;
            const int row = wrow0 + mt * 16 + 8 * r + g;
            if (p.lse && t == 0 && row < p.T_q)
                p.lse[attn_lse_offset(&p, b, h) + row] =
                    sum > 0.f ? (row_max[mt][r] + log2f(sum)) * LN2_F : INFINITY;
#pragma unroll
            for (int i = 0; i < NO; i++) {
                *reinterpret_cast<uint32_t *>(sO + SwizzledTile<HS>::offset(mt * 16 + g + 8 * r, i * 8 + 2 * t)) =
                    ElemTraits<T>::pack(o[mt][i][2 * r] * inv, o[mt][i][2 * r + 1] * inv);
            }
        }
    __syncwarp();
    T *out = tensor_at(static_cast<T *>(p.out), p.o_st, b, wrow0, h);
    tile_store<WROWS, HS, 32>(out, p.o_st.row, sO, p.T_q - wrow0, lane);
}

template <typename T, int HS, bool EXTRAS> void flash_fwd_launch(const AttnParams &p, cudaStream_t s) {
    using Tile = FwdTile<HS>;
    flash_launch<FwdSmem<T, HS>, SM80_SMEM_LIMIT>(flash_fwd_kernel<T, HS, EXTRAS>, dim3(cdiv(p.T_q, Tile::BM), p.NH, p.B),
                                                  Tile::NTHREADS, s, p);
}

#define INSTANTIATE_FWD(T, HS)                                                  \
    template void flash_fwd_launch<T, HS, false>(const AttnParams &, cudaStream_t); \
    template void flash_fwd_launch<T, HS, true>(const AttnParams &, cudaStream_t);
FLASH_SM80_FOR_EACH_HS(INSTANTIATE_FWD, __nv_bfloat16)
FLASH_SM80_FOR_EACH_HS(INSTANTIATE_FWD, __half)
