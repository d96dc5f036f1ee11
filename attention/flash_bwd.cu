// flash_bwd: the FlashAttention-2 backward for sm80+. Three launches:
//   preprocess  D = rowsum(dO * O) (B, NH, T_q) fp32, and zeroing of the fp32 dQ accumulator;
//   main        one block per (key tile, KV head, batch row): recomputes P from the saved LSE for
//               every query tile of every query head sharing the KV head, accumulates dK and dV in
//               registers (so GQA sums without a reduction pass) and adds dS K into dQ with atomics;
//   convert     dQ = scale * accumulator, in the element type, through the caller's strides.
// Deterministic mode runs the main kernel without dQ and computes dQ in flash_bwd_dq.cu instead.
#include "attention/flash_common.cuh"
#include "attention/flash_mask.cuh"
#include "attention/flash_tiles.cuh"

// ---- preprocess ---------------------------------------------------------------------------

// One warp per (b, i, h) row: D = sum_d dO * O.
template <typename T, int HS> __global__ void bwd_dsum_kernel(const AttnParams p, float *dsum) {
    const int64_t row = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= (int64_t)p.B * p.NH * p.T_q) return;
    const int i = (int)(row % p.T_q), h = (int)((row / p.T_q) % p.NH), b = (int)(row / ((int64_t)p.T_q * p.NH));
    const T *o = static_cast<const T *>(p.out) + b * p.o_st.batch + i * p.o_st.row + h * p.o_st.head;
    const T *d = static_cast<const T *>(p.dout) + b * p.do_st.batch + i * p.do_st.row + h * p.do_st.head;
    float acc = 0.f;
#pragma unroll
    for (int c = lane; c < HS; c += 32) acc += ElemTraits<T>::to_float(o[c]) * ElemTraits<T>::to_float(d[c]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) dsum[row] = acc;  // row = (b * NH + h) * T_q + i
}

template <typename T>
void flash_bwd_preprocess(const AttnParams &p, float *dsum, float *dq_accum, cudaStream_t s) {
    constexpr int WARPS = 8;
    const int64_t rows = (int64_t)p.B * p.NH * p.T_q;
    const unsigned blocks = (unsigned)((rows + WARPS - 1) / WARPS);
    if (p.HS == 64) bwd_dsum_kernel<T, 64><<<blocks, 32 * WARPS, 0, s>>>(p, dsum);
    else bwd_dsum_kernel<T, 128><<<blocks, 32 * WARPS, 0, s>>>(p, dsum);
    ATTN_CUDA_CHECK(cudaGetLastError());
    if (dq_accum) ATTN_CUDA_CHECK(cudaMemsetAsync(dq_accum, 0, (size_t)rows * p.HS * sizeof(float), s));
}

// ---- convert ------------------------------------------------------------------------------

template <typename T> __global__ void bwd_convert_dq_kernel(const AttnParams p, const float *acc) {
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;  // over (B, NH, T_q, HS)
    if (idx >= (int64_t)p.B * p.NH * p.T_q * p.HS) return;
    const int c = (int)(idx % p.HS);
    const int64_t row = idx / p.HS;
    const int i = (int)(row % p.T_q), h = (int)((row / p.T_q) % p.NH), b = (int)(row / ((int64_t)p.T_q * p.NH));
    T *dq = static_cast<T *>(p.dq) + b * p.dq_st.batch + i * p.dq_st.row + h * p.dq_st.head;
    dq[c] = ElemTraits<T>::from_float(acc[idx] * p.scale);
}

template <typename T> void flash_bwd_convert_dq(const AttnParams &p, const float *dq_accum, cudaStream_t s) {
    const int64_t n = (int64_t)p.B * p.NH * p.T_q * p.HS;
    bwd_convert_dq_kernel<T><<<(unsigned)((n + 255) / 256), 256, 0, s>>>(p, dq_accum);
    ATTN_CUDA_CHECK(cudaGetLastError());
}

// ---- main kernel --------------------------------------------------------------------------

template <typename T, int HS, bool EXTRAS>
__global__ void __launch_bounds__(BwdTile<HS>::NTHREADS)
    flash_bwd_kernel(const AttnParams p, const float *dsum, float *dq_accum) {
    using Tile = BwdTile<HS>;
    constexpr int BM = Tile::BM, BN = Tile::BN, NT = Tile::NTHREADS, MT = Tile::MT;
    constexpr int WKEYS = 16 * MT;   // keys per warp
    constexpr int KSTEPS = HS / 16;  // k-steps over the head dimension
    constexpr int NQ = BM / 8;       // n8 tiles of S^T (query columns) per m-tile
    constexpr int ND = HS / 8;       // n8 tiles of dK, dV per m-tile
    static_assert(MT * NQ * 4 <= 32, "dropout keep bits of one tile must fit a uint32");
    constexpr int DQ_COLS = HS / Tile::WN;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T *sK = reinterpret_cast<T *>(smem_raw);  // (BN, HS)
    T *sV = sK + BN * HS;                     // (BN, HS)
    T *sQ = sV + BN * HS;                     // 2 stages of (BM, HS)
    T *sdO = sQ + 2 * BM * HS;                // 2 stages of (BM, HS)
    T *sdS = sdO + 2 * BM * HS;               // (BN, BM): dS^T in the element type, for dQ = dS K
    float *sLse = reinterpret_cast<float *>(sdS + BN * BM);  // 2 stages of (BM): LSE * log2(e)
    float *sD = sLse + 2 * BM;                               // 2 stages of (BM)
    int *sLo = reinterpret_cast<int *>(sD + 2 * BM);         // 2 stages of (BM): row ranges
    int *sHi = sLo + 2 * BM;

    const int n_block = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
    const int G = p.NH / p.NKV;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int n0 = n_block * BN, n_valid = min(BN, p.T_k - n0);

    const T *k = static_cast<const T *>(p.k) + b * p.k_st.batch + (int64_t)n0 * p.k_st.row + kvh * p.k_st.head;
    const T *v = static_cast<const T *>(p.v) + b * p.v_st.batch + (int64_t)n0 * p.v_st.row + kvh * p.v_st.head;
    tile_load_async<BN, HS, NT>(sK, k, p.k_st.row, n_valid, tid);
    tile_load_async<BN, HS, NT>(sV, v, p.v_st.row, n_valid, tid);
    cp_async_commit();

    int q_begin, q_end;
    query_span(p, b, n0, n0 + n_valid, &q_begin, &q_end);
    const int mb_begin = q_begin / BM;
    const int n_mb = q_end > q_begin ? cdiv(q_end, BM) - mb_begin : 0;
    const int total = G * n_mb;  // (query head, query tile) pairs, head-major

    auto load_stage = [&](int it, int stage) {
        const int h = kvh * G + it / n_mb, m0 = (mb_begin + it % n_mb) * BM;
        const int m_valid = min(BM, p.T_q - m0);
        const T *q = static_cast<const T *>(p.q) + b * p.q_st.batch + (int64_t)m0 * p.q_st.row + h * p.q_st.head;
        const T *d = static_cast<const T *>(p.dout) + b * p.do_st.batch + (int64_t)m0 * p.do_st.row + h * p.do_st.head;
        tile_load_async<BM, HS, NT>(sQ + stage * BM * HS, q, p.q_st.row, m_valid, tid);
        tile_load_async<BM, HS, NT>(sdO + stage * BM * HS, d, p.do_st.row, m_valid, tid);
        for (int r = tid; r < BM; r += NT) {
            const int i = m0 + r;
            const int64_t li = ((int64_t)b * p.NH + h) * p.T_q + i;
            const bool ok = i < p.T_q;
            // rows past T_q get LSE +inf, so their P is exactly 0 and they contribute nothing
            sLse[stage * BM + r] = ok ? p.lse[li] * LOG2E_F : INFINITY;
            sD[stage * BM + r] = ok ? dsum[li] : 0.f;
            const RowRange rr = row_range(p, b, ok ? i : p.T_q - 1);
            sLo[stage * BM + r] = rr.lo;
            sHi[stage * BM + r] = ok ? rr.hi : rr.lo;
        }
    };

    float dk[MT][ND][4], dv[MT][ND][4];  // (WKEYS, HS) each: this warp's keys
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int i = 0; i < ND; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) dk[mt][i][e] = dv[mt][i][e] = 0.f;

    const float scale_log2 = p.scale * LOG2E_F;
    const float keep_scale = EXTRAS && p.dropout_p > 0.f ? 1.f / (1.f - p.dropout_p) : 1.f;
    const int key_row = warp * WKEYS + g;  // this thread's keys: key_row + 16 mt + 8 r
    const int pos_shift = p.T_k - p.T_q;             // aligned position of query i is i + pos_shift

    // Fragment addresses: one swizzled address per k-step (or per 16 columns), then constant
    // offsets, since the swizzle repeats every 8 rows; V, dO mirror K, Q at fixed distances.
    constexpr uint32_t V_FROM_K = BN * HS * 2, DO_FROM_Q = 2 * BM * HS * 2;  // bytes
    uint32_t off_kn[HS / 16];  // [k][n] fragments of dO / Q (dV, dK products), per 16 columns
#pragma unroll
    for (int dp = 0; dp < HS / 16; dp++) off_kn[dp] = frag_addr_b_kn<HS>(sQ, 0, dp * 16, lane) - smem_u32(sQ);
    const int wm = warp % Tile::WM, wn = warp / Tile::WM;  // this warp's dQ block
    uint32_t off_dq[DQ_COLS / 16];  // K fragments of the dQ product, per 16 columns
#pragma unroll
    for (int np = 0; np < DQ_COLS / 16; np++)
        off_dq[np] = frag_addr_b_kn<HS>(sK, 0, wn * DQ_COLS + np * 16, lane) - smem_u32(sK);
    const uint32_t ds_addr = frag_addr_a_km<BM>(sdS, wm * 16, 0, lane);
    const float sl = (EXTRAS && p.alibi_slopes) || !(p.scale > 0.f) ? 1.f : scale_log2;  // see flash_fwd.cu

    if (total > 0) load_stage(0, 0);
    cp_async_commit();
    for (int it = 0; it < total; it++) {
        const int stage = it & 1;
        if (it + 1 < total) load_stage(it + 1, stage ^ 1);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();  // K, V and this stage's Q, dO, LSE, D, ranges are in shared memory

        const int h = kvh * G + it / n_mb, m0 = (mb_begin + it % n_mb) * BM;
        const int m_valid = min(BM, p.T_q - m0);
        const T *cQ = sQ + stage * BM * HS, *cdO = sdO + stage * BM * HS;
        const float *cLse = sLse + stage * BM, *cD = sD + stage * BM;
        const int *cLo = sLo + stage * BM, *cHi = sHi + stage * BM;
        const RowRange first = {cLo[0], cHi[0]}, last = {cLo[m_valid - 1], cHi[m_valid - 1]};
        const bool partial = tile_class(first, last, n0, n0 + BN) != TILE_FULL;
        const float slope_log2 = EXTRAS && p.alibi_slopes ? p.alibi_slopes[h] * LOG2E_F : 0.f;
        float lse2[NQ][2], dd[NQ][2];  // this thread's query columns nt*8 + 2t + c
#pragma unroll
        for (int nt = 0; nt < NQ; nt++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                lse2[nt][c] = cLse[nt * 8 + 2 * t + c];
                dd[nt][c] = cD[nt * 8 + 2 * t + c];
            }

        // S^T = K_w Q^T and dP^T = V_w dO^T, both (WKEYS, BM)
        float st[MT][NQ][4], dpt[MT][NQ][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int i = 0; i < NQ; i++)
#pragma unroll
                for (int e = 0; e < 4; e++) st[mt][i][e] = dpt[mt][i][e] = 0.f;
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ks++) {
            uint32_t ka[MT][4], va[MT][4];
            const uint32_t kaddr = frag_addr_a<HS>(sK, warp * WKEYS, ks * 16, lane);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                ldmatrix_x4(ka[mt], kaddr + mt * 16 * HS * 2);
                ldmatrix_x4(va[mt], kaddr + mt * 16 * HS * 2 + V_FROM_K);
            }
            const uint32_t qaddr = frag_addr_b_nk<HS>(cQ, 0, ks * 16, lane);
#pragma unroll
            for (int np = 0; np < NQ / 2; np++) {
                uint32_t qb[4], ob[4];
                ldmatrix_x4(qb, qaddr + np * 16 * HS * 2);
                ldmatrix_x4(ob, qaddr + np * 16 * HS * 2 + DO_FROM_Q);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma_16816<T>(st[mt][2 * np], ka[mt], qb[0], qb[1]);
                    mma_16816<T>(st[mt][2 * np + 1], ka[mt], qb[2], qb[3]);
                    mma_16816<T>(dpt[mt][2 * np], va[mt], ob[0], ob[1]);
                    mma_16816<T>(dpt[mt][2 * np + 1], va[mt], ob[2], ob[3]);
                }
            }
        }

        // P^T (undropped) in st; dS^T in dpt; the dropped, rescaled P^T goes to the dV product.
        uint32_t keep_bits = 0;
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NQ; nt++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int key = n0 + key_row + 16 * mt + 8 * (e >> 1);
                    const int qc = nt * 8 + 2 * t + (e & 1);  // query column within the tile
                    float x = st[mt][nt][e];
                    if (EXTRAS && p.alibi_slopes) x = x * scale_log2 + alibi_bias_log2(slope_log2, m0 + qc + pos_shift, key);
                    if (partial && (key < cLo[qc] || key >= cHi[qc])) x = -INFINITY;
                    const float pr = exp2f(fmaf(x, sl, -lse2[nt][e & 1]));
                    float dp = dpt[mt][nt][e];
                    if (EXTRAS && p.dropout_p > 0.f) {
                        const bool keep = m0 + qc < p.T_q && key < p.T_k && dropout_keep(p, b, h, m0 + qc, key);
                        keep_bits |= (uint32_t)keep << ((mt * NQ + nt) * 4 + e);
                        dp = keep ? dp * keep_scale : 0.f;
                    }
                    st[mt][nt][e] = pr;
                    dpt[mt][nt][e] = pr * (dp - dd[nt][e & 1]);
                }
            }

        // dV += P_drop^T dO and dK += dS^T Q over the BM queries
        const uint32_t qbase = smem_u32(cQ);
#pragma unroll
        for (int kk = 0; kk < BM / 16; kk++) {
            uint32_t pa[MT][4], sa[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                float p0[4], p1[4];
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    p0[e] = st[mt][2 * kk][e];
                    p1[e] = st[mt][2 * kk + 1][e];
                    if (EXTRAS && p.dropout_p > 0.f) {
                        p0[e] = (keep_bits >> ((mt * NQ + 2 * kk) * 4 + e)) & 1u ? p0[e] * keep_scale : 0.f;
                        p1[e] = (keep_bits >> ((mt * NQ + 2 * kk + 1) * 4 + e)) & 1u ? p1[e] * keep_scale : 0.f;
                    }
                }
                c_to_a<T>(pa[mt], p0, p1);
                c_to_a<T>(sa[mt], dpt[mt][2 * kk], dpt[mt][2 * kk + 1]);
            }
#pragma unroll
            for (int dp = 0; dp < HS / 16; dp++) {
                uint32_t ob[4], qb[4];
                ldmatrix_x4_trans(qb, qbase + kk * 16 * HS * 2 + off_kn[dp]);
                ldmatrix_x4_trans(ob, qbase + kk * 16 * HS * 2 + off_kn[dp] + DO_FROM_Q);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma_16816<T>(dv[mt][2 * dp], pa[mt], ob[0], ob[1]);
                    mma_16816<T>(dv[mt][2 * dp + 1], pa[mt], ob[2], ob[3]);
                    mma_16816<T>(dk[mt][2 * dp], sa[mt], qb[0], qb[1]);
                    mma_16816<T>(dk[mt][2 * dp + 1], sa[mt], qb[2], qb[3]);
                }
            }
        }

        if (dq_accum) {
            // dS^T to shared memory, then dQ (BM, HS) += dS (BM, BN) K (BN, HS) over a warp grid
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int nt = 0; nt < NQ; nt++)
#pragma unroll
                    for (int r = 0; r < 2; r++)
                        *reinterpret_cast<uint32_t *>(sdS + SwizzledTile<BM>::offset(key_row + 16 * mt + 8 * r,
                                                                                      nt * 8 + 2 * t)) =
                            ElemTraits<T>::pack(dpt[mt][nt][2 * r], dpt[mt][nt][2 * r + 1]);
            __syncthreads();
            float dq[DQ_COLS / 8][4];
#pragma unroll
            for (int i = 0; i < DQ_COLS / 8; i++) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.f;
#pragma unroll
            for (int ks = 0; ks < BN / 16; ks++) {
                uint32_t a[4];
                ldmatrix_x4_trans(a, ds_addr + ks * 16 * BM * 2);
#pragma unroll
                for (int np = 0; np < DQ_COLS / 16; np++) {
                    uint32_t kb[4];
                    ldmatrix_x4_trans(kb, smem_u32(sK) + ks * 16 * HS * 2 + off_dq[np]);
                    mma_16816<T>(dq[2 * np], a, kb[0], kb[1]);
                    mma_16816<T>(dq[2 * np + 1], a, kb[2], kb[3]);
                }
            }
            float *acc = dq_accum + (((int64_t)b * p.NH + h) * p.T_q + m0) * HS;
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int row = wm * 16 + g + 8 * r;
                if (row < m_valid) {
#pragma unroll
                    for (int i = 0; i < DQ_COLS / 8; i++) {
                        const int col = wn * DQ_COLS + i * 8 + 2 * t;
                        atomicAdd(acc + (int64_t)row * HS + col, dq[i][2 * r]);
                        atomicAdd(acc + (int64_t)row * HS + col + 1, dq[i][2 * r + 1]);
                    }
                }
            }
        }
        __syncthreads();  // this stage and sdS may be overwritten from here on
    }
    cp_async_wait<0>();
    __syncthreads();  // K/V copies done (also when no query tile saw this key tile)

    // dK = scale * dS^T Q, staged with dV through this warp's own rows of sK / sV.
    T *sdK = sK + warp * WKEYS * HS, *sdV = sV + warp * WKEYS * HS;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int i = 0; i < ND; i++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int off = SwizzledTile<HS>::offset(16 * mt + g + 8 * r, i * 8 + 2 * t);
                *reinterpret_cast<uint32_t *>(sdK + off) =
                    ElemTraits<T>::pack(dk[mt][i][2 * r] * p.scale, dk[mt][i][2 * r + 1] * p.scale);
                *reinterpret_cast<uint32_t *>(sdV + off) = ElemTraits<T>::pack(dv[mt][i][2 * r], dv[mt][i][2 * r + 1]);
            }
    __syncwarp();
    const int krow = n0 + warp * WKEYS;
    T *dkg = static_cast<T *>(p.dk) + b * p.dk_st.batch + (int64_t)krow * p.dk_st.row + kvh * p.dk_st.head;
    T *dvg = static_cast<T *>(p.dv) + b * p.dv_st.batch + (int64_t)krow * p.dv_st.row + kvh * p.dv_st.head;
    tile_store<WKEYS, HS, 32>(dkg, p.dk_st.row, sdK, p.T_k - krow, lane);
    tile_store<WKEYS, HS, 32>(dvg, p.dv_st.row, sdV, p.T_k - krow, lane);
}

template <typename T, int HS, bool EXTRAS>
void flash_bwd_launch(const AttnParams &p, float *dsum, float *dq_accum, cudaStream_t s) {
    using Tile = BwdTile<HS>;
    auto kernel = flash_bwd_kernel<T, HS, EXTRAS>;
    ATTN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)Tile::SMEM));
    dim3 grid(cdiv(p.T_k, Tile::BN), p.NKV, p.B);
    kernel<<<grid, Tile::NTHREADS, Tile::SMEM, s>>>(p, dsum, dq_accum);
    ATTN_CUDA_CHECK(cudaGetLastError());
}

#define INSTANTIATE_BWD(T, HS)                                                                        \
    template void flash_bwd_launch<T, HS, false>(const AttnParams &, float *, float *, cudaStream_t); \
    template void flash_bwd_launch<T, HS, true>(const AttnParams &, float *, float *, cudaStream_t);
INSTANTIATE_BWD(__nv_bfloat16, 64)
INSTANTIATE_BWD(__nv_bfloat16, 128)
INSTANTIATE_BWD(__half, 64)
INSTANTIATE_BWD(__half, 128)
template void flash_bwd_preprocess<__nv_bfloat16>(const AttnParams &, float *, float *, cudaStream_t);
template void flash_bwd_preprocess<__half>(const AttnParams &, float *, float *, cudaStream_t);
template void flash_bwd_convert_dq<__nv_bfloat16>(const AttnParams &, const float *, cudaStream_t);
template void flash_bwd_convert_dq<__half>(const AttnParams &, const float *, cudaStream_t);
