// flash_bwd_sm80: the FlashAttention-2 backward for sm80+. Three launches:
//   preprocess  D = rowsum(dO * O) (B, NH, T_q) fp32, and zeroing of the fp32 dQ accumulator
//               (each left out where the caller holds it: AttnParams.dsum, dq_accum);
//   main        one block per (key tile, KV head, batch row): recomputes P from the saved LSE for
//               every query tile of every query head sharing the KV head, accumulates dK and dV in
//               registers (so GQA sums without a reduction pass) and adds dS K into dQ with atomics;
//   convert     dQ = scale * accumulator, in the element type, through the caller's strides.
// Deterministic mode runs the main kernel without dQ and computes dQ in flash_bwd_dq_sm80.cu instead.
#include "attention/flash_common.cuh"
#include "attention/flash_mask.cuh"
#include "attention/flash_tiles.cuh"

// ---- preprocess ---------------------------------------------------------------------------

// Loads 8 consecutive elements (16 bytes; attn_check guarantees the alignment) as floats.
template <typename T> __device__ __forceinline__ void load8(float f[8], const T *src) {
    const uint4 raw = *reinterpret_cast<const uint4 *>(src);
    const T *e = reinterpret_cast<const T *>(&raw);
#pragma unroll
    for (int j = 0; j < 8; j++) f[j] = ElemTraits<T>::to_float(e[j]);
}

// D = sum_d dO * O: LANES lanes per (b, h, i) row (the largest power of two up to 32 dividing the
// row's HS / 8 16-byte chunks, so rows never straddle warps), each with CHUNKS / LANES 16-byte
// loads of O and of dO.
template <int HS> struct DsumShape {
    static constexpr int CHUNKS = HS / 8, LANES = (CHUNKS & -CHUNKS) < 32 ? (CHUNKS & -CHUNKS) : 32;
};
template <typename T, int HS> __global__ void bwd_dsum_kernel(const AttnParams p, float *dsum) {
    constexpr int CHUNKS = DsumShape<HS>::CHUNKS, LANES = DsumShape<HS>::LANES;  // lanes per row
    const int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / LANES;
    const int c = (threadIdx.x % LANES) * 8;
    const bool ok = row < (int64_t)p.B * p.NH * p.T_q;
    float acc = 0.f;
    if (ok) {
        int b, h, i;
        split_row(p, row, &b, &h, &i);
        const T *orow = tensor_at(static_cast<const T *>(p.out), p.o_st, b, i, h) + c;
        const T *drow = tensor_at(static_cast<const T *>(p.dout), p.do_st, b, i, h) + c;
#pragma unroll
        for (int k = 0; k < CHUNKS / LANES; k++) {
            float o[8], d[8];
            load8(o, orow + k * LANES * 8);
            load8(d, drow + k * LANES * 8);
#pragma unroll
            for (int j = 0; j < 8; j++) acc += o[j] * d[j];
        }
    }
#pragma unroll
    for (int off = LANES / 2; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (ok && c == 0) dsum[row] = acc;  // row = (b * NH + h) * T_q + i
}

template <typename T, int HS> void launch_dsum(const AttnParams &p, float *dsum, cudaStream_t s) {
    constexpr int THREADS = 256;
    const int64_t rows = (int64_t)p.B * p.NH * p.T_q;
    const unsigned blocks = (unsigned)((rows * DsumShape<HS>::LANES + THREADS - 1) / THREADS);
    bwd_dsum_kernel<T, HS><<<blocks, THREADS, 0, s>>>(p, dsum);
}

// attn_select_kernel only returns the head sizes of FLASH_SM80_FOR_EACH_HS for the flash families.
// dsum NULL: the caller's D is ready (attention.h's dsum_ready); only the dQ accumulator is zeroed.
template <typename T>
void flash_bwd_preprocess(const AttnParams &p, float *dsum, float *dq_accum, cudaStream_t s) {
    if (dsum) switch (p.HS) {
    case 32: launch_dsum<T, 32>(p, dsum, s); break;
    case 64: launch_dsum<T, 64>(p, dsum, s); break;
    case 96: launch_dsum<T, 96>(p, dsum, s); break;
    case 128: launch_dsum<T, 128>(p, dsum, s); break;
    default: launch_dsum<T, 256>(p, dsum, s); break;
    }
    if (dq_accum) cudaMemsetAsync(dq_accum, 0, attn_dq_acc_floats(&p) * sizeof(float), s);
}

// ---- convert ------------------------------------------------------------------------------

// dQ = scale * accumulator: 8 consecutive columns per thread (two 16-byte loads, one store; the
// accumulator's 8 x 8 sub-tiles keep them contiguous). With accumulate, dq is fp32 (attention.h)
// and the scaled accumulator is added to it instead.
template <typename T> __global__ void bwd_convert_dq_kernel(const AttnParams p, const float *acc) {
    const int64_t idx = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;  // over (B, NH, T_q, HS)
    if (idx >= (int64_t)p.B * p.NH * p.T_q * p.HS) return;
    const int c = (int)(idx % p.HS);
    int b, h, i;
    split_row(p, idx / p.HS, &b, &h, &i);
    const float *a = acc + dq_acc_offset(p, b, h, i, c);
    const float4 lo = *reinterpret_cast<const float4 *>(a), hi = *reinterpret_cast<const float4 *>(a + 4);
    if (p.accumulate) {
        float4 *dq = reinterpret_cast<float4 *>(tensor_at(static_cast<float *>(p.dq), p.dq_st, b, i, h) + c);
        const float4 d0 = dq[0], d1 = dq[1];
        dq[0] = make_float4(d0.x + lo.x * p.scale, d0.y + lo.y * p.scale, d0.z + lo.z * p.scale, d0.w + lo.w * p.scale);
        dq[1] = make_float4(d1.x + hi.x * p.scale, d1.y + hi.y * p.scale, d1.z + hi.z * p.scale, d1.w + hi.w * p.scale);
        return;
    }
    uint4 out;
    out.x = ElemTraits<T>::pack(lo.x * p.scale, lo.y * p.scale);
    out.y = ElemTraits<T>::pack(lo.z * p.scale, lo.w * p.scale);
    out.z = ElemTraits<T>::pack(hi.x * p.scale, hi.y * p.scale);
    out.w = ElemTraits<T>::pack(hi.z * p.scale, hi.w * p.scale);
    T *dq = tensor_at(static_cast<T *>(p.dq), p.dq_st, b, i, h);
    *reinterpret_cast<uint4 *>(dq + c) = out;
}

template <typename T> void flash_bwd_convert_dq(const AttnParams &p, const float *dq_accum, cudaStream_t s) {
    const int64_t n8 = (int64_t)p.B * p.NH * p.T_q * p.HS / 8;
    bwd_convert_dq_kernel<T><<<(unsigned)((n8 + 255) / 256), 256, 0, s>>>(p, dq_accum);
}

// ---- main kernel --------------------------------------------------------------------------

// a = b = 0 for two register blocks of MT x NT accumulator fragments.
template <int MT, int NT> __device__ __forceinline__ void zero_frags(float (&a)[MT][NT][4], float (&b)[MT][NT][4]) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int i = 0; i < NT; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) a[mt][i][e] = b[mt][i][e] = 0.f;
}

template <typename T, int HS, bool EXTRAS>
__global__ void __launch_bounds__(BwdTile<HS>::NTHREADS, 1)
    flash_bwd_kernel(const AttnParams p, const float *dsum, float *dq_accum) {
    using Tile = BwdTile<HS>;
    constexpr int BM = Tile::BM, BN = Tile::BN, NT = Tile::NTHREADS;
    constexpr int SD_MT = Tile::SD_MT, SD_NT = Tile::SD_NT;
    constexpr int KV_MT = Tile::KV_MT, KV_ND = Tile::KV_ND;
    constexpr int DQ_MT = Tile::DQ_MT, DQ_ND = Tile::DQ_ND;
    constexpr int KSTEPS = HS / 16;  // k-steps over the head dimension
    using Smem = BwdSmem<T, HS>;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    Smem &sm = smem_storage<Smem>(smem_raw);
    T *sK = sm.k, *sV = sm.v, *sQ = sm.q[0], *sdO = sm.dout[0], *sP = sm.p, *sdS = sm.ds;
    float *sLse = sm.lse[0], *sD = sm.d[0];

    const int n_block = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int n0 = n_block * BN, n_valid = min(BN, p.T_k - n0);

    const BwdPairs pairs = bwd_pairs<EXTRAS>(p, b, kvh, n0, n_valid, BM);
    const T *k = tensor_at(static_cast<const T *>(p.k), p.k_st, b, n0, kvh);
    const T *v = tensor_at(static_cast<const T *>(p.v), p.v_st, b, n0, kvh);
    if (pairs.total > 0) {  // a key tile no query reads (masked, or absent from every block list) writes zeros
        tile_load_async<BN, HS, NT>(sK, k, p.k_st.row, n_valid, tid);
        tile_load_async<BN, HS, NT>(sV, v, p.v_st.row, n_valid, tid);
    }

    // Q, dO, LSE and D of pair `it` into `stage`. Rows past T_q are zero-filled: their Q and dO
    // are 0, so whatever P they get (LSE reads 0), their dS = P * (0 - 0) and P dO add nothing.
    auto load_stage = [&](int it, int stage) {
        const int h = pairs.head(it), m0 = pairs.m0(it, BM);
        const int m_valid = min(BM, p.T_q - m0);
        const T *q = tensor_at(static_cast<const T *>(p.q), p.q_st, b, m0, h);
        const T *d = tensor_at(static_cast<const T *>(p.dout), p.do_st, b, m0, h);
        tile_load_async<BM, HS, NT>(sQ + stage * BM * HS, q, p.q_st.row, m_valid, tid);
        tile_load_async<BM, HS, NT>(sdO + stage * BM * HS, d, p.do_st.row, m_valid, tid);
        load_lse_d<BM, NT>(sLse + stage * BM, sD + stage * BM, p, dsum, b, h, m0, m_valid, tid);
    };

    float dk[KV_MT][KV_ND][4], dv[KV_MT][KV_ND][4];  // this warp's (32 keys, HS / KV_WD) blocks
    zero_frags(dk, dv);

    const float scale_log2 = p.scale * LOG2E_F;
    const float keep_scale = EXTRAS && p.dropout_p > 0.f ? attn_dropout_scale(p.dropout_p) : 1.f;
    const uint32_t keep_thresh = EXTRAS ? attn_dropout_threshold(p.dropout_p) : 0u;
    const uint64_t keep_offset = EXTRAS && p.dropout_p > 0.f ? attn_dropout_offset(&p) : 0;  // read once
    const int pos_shift = (int)attn_query_shift(&p);  // query i sits at key position i + pos_shift
    // exp(scale * S - LSE) in the log2 domain with one FMA; ALiBi adds its bias after scaling.
    const float sl = EXTRAS && p.alibi_slopes ? 1.f : scale_log2;

    // This warp's blocks in the three grids (tile-relative row / column origins).
    const int sd_q0 = (warp % Tile::SD_WM) * 16 * SD_MT, sd_k0 = (warp / Tile::SD_WM) * 8 * SD_NT;
    const int kv_k0 = (warp % Tile::KV_WN) * 16 * KV_MT, kv_d0 = (warp / Tile::KV_WN) * 8 * KV_ND;
    const int dq_q0 = (warp % Tile::DQ_WM) * 16 * DQ_MT, dq_d0 = (warp / Tile::DQ_WM) * 8 * DQ_ND;
    // dO and V sit at fixed byte distances from Q and K, dS from P (the same swizzled layout).
    constexpr uint32_t V_FROM_K = sizeof(Smem::k), DO_FROM_Q = sizeof(Smem::q), DS_FROM_P = sizeof(Smem::p);
    // The swizzle repeats every 8 rows, so a fragment address moves down rows by a constant but
    // across columns by a recomputed offset: this lane's offsets per 16-column block, from the
    // tile's first row (bytes).
    uint32_t off_kv[KV_ND / 2], off_pa[KV_MT], off_dq[DQ_ND / 2];
#pragma unroll
    for (int np = 0; np < KV_ND / 2; np++) off_kv[np] = frag_addr_b_kn<HS>(sQ, 0, kv_d0 + 16 * np, lane) - smem_u32(sQ);
#pragma unroll
    for (int mt = 0; mt < KV_MT; mt++) off_pa[mt] = frag_addr_a_km<BN>(sP, kv_k0 + 16 * mt, 0, lane) - smem_u32(sP);
#pragma unroll
    for (int np = 0; np < DQ_ND / 2; np++) off_dq[np] = frag_addr_b_kn<HS>(sK, 0, dq_d0 + 16 * np, lane) - smem_u32(sK);

    if (pairs.total > 0) load_stage(0, 0);
    cp_async_commit();
    for (int it = 0; it < pairs.total; it++) {
        const int stage = it & 1;
        cp_async_wait<0>();
        __syncthreads();  // this stage (and K, V) landed; every warp is done with pair it-1, so
                          // the other stage, P and dS may be overwritten
        if (it + 1 < pairs.total) load_stage(it + 1, stage ^ 1);
        cp_async_commit();

        const int h = pairs.head(it), m0 = pairs.m0(it, BM);
        const int m_valid = min(BM, p.T_q - m0);
        const T *cQ = sQ + stage * BM * HS;
        const float *cLse = sLse + stage * BM, *cD = sD + stage * BM;
        const RowRange first = row_range(p, b, m0), last = row_range(p, b, m0 + m_valid - 1);

        // S = Q K^T for this warp's (32 queries, SD_NT * 8 keys), turned into P = exp(S - LSE) in
        // place; then dP = dO V^T (one product at a time keeps the live fragments few). These two
        // loops unrolled fully were 2-5% faster than rolled on H200; the dK/dV loop below stays
        // rolled: unrolling it (by 2 or fully) measured slower.
        float s[SD_MT][SD_NT][4], dp[SD_MT][SD_NT][4];
        zero_frags(s, dp);
        // acc += A B^T over HS for this warp's block: A = Q (a_off 0) or dO (a_off DO_FROM_Q) of
        // this stage, B = K (b_off 0) or V (b_off V_FROM_K).
        auto sd_product = [&](float (&acc)[SD_MT][SD_NT][4], uint32_t a_off, uint32_t b_off) {
#pragma unroll(KSTEPS)
            for (int ks = 0; ks < KSTEPS; ks++) {
                uint32_t a[SD_MT][4];
                const uint32_t aaddr = frag_addr_a<HS>(cQ, sd_q0, ks * 16, lane) + a_off;
#pragma unroll
                for (int mt = 0; mt < SD_MT; mt++) ldmatrix_x4(a[mt], aaddr + mt * 16 * HS * 2);
                const uint32_t baddr = frag_addr_b_nk<HS>(sK, sd_k0, ks * 16, lane) + b_off;
                mma_pairs<T, false>(acc, a, [&](int np) { return baddr + np * 16 * HS * 2; });
            }
        };
        sd_product(s, 0, 0);
        const float slope_log2 = EXTRAS && p.alibi_slopes ? alibi_slope(p, b, h) * LOG2E_F : 0.f;
        // P = exp(S - LSE) in place of S, masked per element only in the Masked<true> instance.
        auto p_step = [&](auto masked) {
            constexpr bool MASKED = decltype(masked)::value;
#pragma unroll
            for (int mt = 0; mt < SD_MT; mt++)
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const int row = sd_q0 + 16 * mt + 8 * r + g, i = m0 + row;  // query of this thread
                    const float lse2 = cLse[row] * LOG2E_F;
                    RowRange rr = {0, 0};
                    if (MASKED) rr = row_range(p, b, min(i, p.T_q - 1));
#pragma unroll
                    for (int nt = 0; nt < SD_NT; nt++)
#pragma unroll
                        for (int c = 0; c < 2; c++) {
                            const int key = n0 + sd_k0 + 8 * nt + 2 * t + c;
                            float x = s[mt][nt][2 * r + c];
                            if (EXTRAS && p.alibi_slopes) x = x * scale_log2 + alibi_bias_log2(slope_log2, i + pos_shift, key);
                            const bool hidden = MASKED && (key < rr.lo || key >= rr.hi);
                            s[mt][nt][2 * r + c] = hidden ? 0.f : exp2f(fmaf(x, sl, -lse2));
                        }
                }
        };
        step_by_class(tile_class(first, last, n0, n0 + BN) != TILE_FULL, p_step);
        sd_product(dp, DO_FROM_Q, V_FROM_K);

        // dS = P * (dP - D); P (after dropout) and dS to shared memory. The keep bits (bit e of
        // keep4[nt]: flash_mask.cuh's element e) one Philox block per 16 elements.
#pragma unroll
        for (int mt = 0; mt < SD_MT; mt++) {
            unsigned keep4[SD_NT];
#pragma unroll
            for (int nt = 0; nt < SD_NT; nt++) keep4[nt] = 15;
            if (EXTRAS && p.dropout_p > 0.f)
                dropout_fragment_fwd<SD_NT>(p, keep_offset, keep_thresh, b, h, m0 + sd_q0 + 16 * mt, n0 + sd_k0, g, t,
                                            [&](int nt, int e, bool keep) {
                                                if (!keep) keep4[nt] &= ~(1u << e);
                                            });
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int row = sd_q0 + 16 * mt + 8 * r + g;
                const float dd = cD[row];
#pragma unroll
                for (int nt = 0; nt < SD_NT; nt++) {
                    float pv[2], dsv[2];
#pragma unroll
                    for (int c = 0; c < 2; c++) {
                        const float pr = s[mt][nt][2 * r + c];
                        float d = dp[mt][nt][2 * r + c], pk = pr;
                        if (EXTRAS && p.dropout_p > 0.f) {  // rows past T_q (dO 0) and keys past T_k (P 0) add 0
                            const bool keep = keep4[nt] >> (2 * r + c) & 1;
                            d = keep ? d * keep_scale : 0.f;
                            pk = keep ? pr * keep_scale : 0.f;
                        }
                        pv[c] = pk;
                        dsv[c] = pr * (d - dd);
                    }
                    const int off = SwizzledTile<BN>::offset(row, sd_k0 + 8 * nt + 2 * t);
                    *reinterpret_cast<uint32_t *>(sP + off) = ElemTraits<T>::pack(pv[0], pv[1]);
                    *reinterpret_cast<uint32_t *>(sdS + off) = ElemTraits<T>::pack(dsv[0], dsv[1]);
                }
            }
        }
        __syncthreads();  // P and dS complete

        if (dq_accum) {
            // dQ (BM, HS) += dS (BM, BN) K (BN, HS): this warp's (32 queries, DQ_ND * 8 columns)
            float dq[DQ_MT][DQ_ND][4];
#pragma unroll
            for (int mt = 0; mt < DQ_MT; mt++)
#pragma unroll
                for (int i = 0; i < DQ_ND; i++) dq[mt][i][0] = dq[mt][i][1] = dq[mt][i][2] = dq[mt][i][3] = 0.f;
#pragma unroll
            for (int ks = 0; ks < BN / 16; ks++) {
                uint32_t a[DQ_MT][4];
                const uint32_t saddr = frag_addr_a<BN>(sdS, dq_q0, ks * 16, lane);
#pragma unroll
                for (int mt = 0; mt < DQ_MT; mt++) ldmatrix_x4(a[mt], saddr + mt * 16 * BN * 2);
                mma_pairs<T, true>(dq, a, [&](int np) { return smem_u32(sK) + ks * 16 * HS * 2 + off_dq[np]; });
            }
#pragma unroll
            for (int mt = 0; mt < DQ_MT; mt++)
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const int row = dq_q0 + 16 * mt + 8 * r + g;
                    if (row < m_valid) {
#pragma unroll
                        for (int i = 0; i < DQ_ND; i++)
                            atomic_add_pair(dq_accum + dq_acc_offset(p, b, h, m0 + row, dq_d0 + 8 * i + 2 * t),
                                            dq[mt][i][2 * r], dq[mt][i][2 * r + 1]);
                    }
                }
        }

        // dV += P^T dO and dK += dS^T Q over the BM queries, for this warp's (32 keys, KV_ND * 8 cols)
#pragma unroll 1
        for (int kk = 0; kk < BM / 16; kk++) {
            uint32_t pa[KV_MT][4], sa[KV_MT][4];
            const uint32_t pbase = smem_u32(sP) + kk * 16 * BN * 2, qbase = smem_u32(cQ) + kk * 16 * HS * 2;
#pragma unroll
            for (int mt = 0; mt < KV_MT; mt++) {
                ldmatrix_x4_trans(pa[mt], pbase + off_pa[mt]);
                ldmatrix_x4_trans(sa[mt], pbase + off_pa[mt] + DS_FROM_P);
            }
#pragma unroll
            for (int np = 0; np < KV_ND / 2; np++) {
                uint32_t qb[4], ob[4];
                ldmatrix_x4_trans(qb, qbase + off_kv[np]);
                ldmatrix_x4_trans(ob, qbase + off_kv[np] + DO_FROM_Q);
#pragma unroll
                for (int mt = 0; mt < KV_MT; mt++) {
                    mma_16816<T>(dv[mt][2 * np], pa[mt], ob[0], ob[1]);
                    mma_16816<T>(dv[mt][2 * np + 1], pa[mt], ob[2], ob[3]);
                    mma_16816<T>(dk[mt][2 * np], sa[mt], qb[0], qb[1]);
                    mma_16816<T>(dk[mt][2 * np + 1], sa[mt], qb[2], qb[3]);
                }
            }
        }
    }
    cp_async_wait<0>();
    __syncthreads();  // every warp is done with K and V (also when no query tile saw this key tile)

    if (p.accumulate) {  // dk, dv are fp32 (attention.h), this block's key rows its own: added to
#pragma unroll
        for (int mt = 0; mt < KV_MT; mt++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int row = kv_k0 + 16 * mt + 8 * r + g;
                if (row >= n_valid) continue;
                float *dkr = tensor_at(static_cast<float *>(p.dk), p.dk_st, b, n0 + row, kvh) + kv_d0 + 2 * t;
                float *dvr = tensor_at(static_cast<float *>(p.dv), p.dv_st, b, n0 + row, kvh) + kv_d0 + 2 * t;
#pragma unroll
                for (int i = 0; i < KV_ND; i++) {
                    add_pair(dkr + 8 * i, dk[mt][i][2 * r] * p.scale, dk[mt][i][2 * r + 1] * p.scale);
                    add_pair(dvr + 8 * i, dv[mt][i][2 * r], dv[mt][i][2 * r + 1]);
                }
            }
        return;
    }
    // dK = scale * dS^T Q and dV, staged through sK and sV, then stored with 16-byte writes.
#pragma unroll
    for (int mt = 0; mt < KV_MT; mt++)
#pragma unroll
        for (int i = 0; i < KV_ND; i++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int off = SwizzledTile<HS>::offset(kv_k0 + 16 * mt + 8 * r + g, kv_d0 + 8 * i + 2 * t);
                *reinterpret_cast<uint32_t *>(sK + off) =
                    ElemTraits<T>::pack(dk[mt][i][2 * r] * p.scale, dk[mt][i][2 * r + 1] * p.scale);
                *reinterpret_cast<uint32_t *>(sV + off) = ElemTraits<T>::pack(dv[mt][i][2 * r], dv[mt][i][2 * r + 1]);
            }
    __syncthreads();
    T *dkg = tensor_at(static_cast<T *>(p.dk), p.dk_st, b, n0, kvh);
    T *dvg = tensor_at(static_cast<T *>(p.dv), p.dv_st, b, n0, kvh);
    tile_store<BN, HS, NT>(dkg, p.dk_st.row, sK, n_valid, tid);
    tile_store<BN, HS, NT>(dvg, p.dv_st.row, sV, n_valid, tid);
}

template <typename T, int HS, bool EXTRAS>
void flash_bwd_launch(const AttnParams &p, float *dsum, float *dq_accum, cudaStream_t s) {
    using Tile = BwdTile<HS>;
    flash_launch<BwdSmem<T, HS>, SM80_SMEM_LIMIT>(flash_bwd_kernel<T, HS, EXTRAS>, dim3(cdiv(p.T_k, Tile::BN), p.NKV, p.B),
                                                  Tile::NTHREADS, s, p, dsum, dq_accum);
}

#define INSTANTIATE_BWD(T, HS)                                                                        \
    template void flash_bwd_launch<T, HS, false>(const AttnParams &, float *, float *, cudaStream_t); \
    template void flash_bwd_launch<T, HS, true>(const AttnParams &, float *, float *, cudaStream_t);
FLASH_SM80_FOR_EACH_HS(INSTANTIATE_BWD, __nv_bfloat16)
FLASH_SM80_FOR_EACH_HS(INSTANTIATE_BWD, __half)
template void flash_bwd_preprocess<__nv_bfloat16>(const AttnParams &, float *, float *, cudaStream_t);
template void flash_bwd_preprocess<__half>(const AttnParams &, float *, float *, cudaStream_t);
template void flash_bwd_convert_dq<__nv_bfloat16>(const AttnParams &, const float *, cudaStream_t);
template void flash_bwd_convert_dq<__half>(const AttnParams &, const float *, cudaStream_t);
