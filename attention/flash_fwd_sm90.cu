// flash_fwd_sm90: the FlashAttention-2 forward on Hopper's warpgroup MMA (wgmma, sm_90a). One
// block per (query tile, head, batch row); each warpgroup owns 64 query rows. S = Q K^T reads
// both operands from shared memory; the probabilities stay in registers as the A operand of
// O += P V. K/V tiles stream through three cp.async stages handed over by mbarriers. Masking follows flash_fwd.cu (partial
// tiles masked per element, empty tiles skipped); ALiBi and dropout stay on the sm80 kernels.
#include "attention/flash_common.cuh"
#include "attention/flash_mask.cuh"
#include "attention/flash_tiles.cuh"
#include "attention/wgmma.cuh"

template <typename T, int HS, int NWG>
__global__ void __launch_bounds__(Sm90FwdTile<HS, NWG>::NTHREADS, 1) flash_fwd_sm90_kernel(const AttnParams p) {
#ifdef FLASH_SM90_DEVICE
    using Tile = Sm90FwdTile<HS, NWG>;
    constexpr int BM = Tile::BM, BN = Tile::BN, NT = Tile::NTHREADS;
    constexpr int NS = BN / 8, NO = HS / 8;  // n8 column tiles of the scores and of the output
    constexpr int STAGES = Tile::STAGES;
    extern __shared__ unsigned char smem_raw[];
    T *sQ = reinterpret_cast<T *>(smem_align1024(smem_raw));  // (BM, HS) SW128, later O staging
    T *sK = sQ + BM * HS;                                      // STAGES x (BN, HS) SW128
    T *sV = sK + STAGES * BN * HS;                             // STAGES x (BN, HS) SW128
    const uint32_t full0 = smem_u32(sV + STAGES * BN * HS);    // STAGES mbarriers: stage landed
    const uint32_t empty0 = full0 + STAGES * 8;                // STAGES mbarriers: stage released

    const int m_block = p.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
    const int h = blockIdx.y, b = blockIdx.z, kvh = h / (p.NH / p.NKV);
    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    const int m0 = m_block * BM, m_valid = min(BM, p.T_q - m0);

    const T *q = static_cast<const T *>(p.q) + b * p.q_st.batch + m0 * p.q_st.row + h * p.q_st.head;
    const T *k = static_cast<const T *>(p.k) + b * p.k_st.batch + kvh * p.k_st.head;
    const T *v = static_cast<const T *>(p.v) + b * p.v_st.batch + kvh * p.v_st.head;

    const RowRange first = row_range(p, b, m0), last = row_range(p, b, m0 + m_valid - 1);
    const int nb_begin = max(first.lo, 0) / BN;
    const int nb_end = max(cdiv(min(last.hi, p.T_k), BN), nb_begin);

    const int wrow0 = m0 + wg * 64 + warp * 16;  // this warp's first query row
    RowRange rr[2];
#pragma unroll
    for (int r = 0; r < 2; r++) rr[r] = row_range(p, b, min(wrow0 + 8 * r + g, p.T_q - 1));
    const float scale_log2 = p.scale * LOG2E_F;
    const bool prescale = !(p.scale > 0.f);  // a non-positive scale would reverse the max
    const float sl = prescale ? 1.f : scale_log2;

    // Key tiles run from last to first (the partial diagonal and ragged tiles first, then the
    // bulk): tile i is nb_end - 1 - i, in stage i % STAGES. Every thread copies part of each
    // tile and arrives on the stage's `full` barrier when its copies land; every thread arrives
    // on `empty` when its warpgroup is done with the stage. A stage is refilled once all have
    // released it, so warpgroups drift apart by up to a tile instead of meeting every tile.
    const int n_tiles = nb_end - nb_begin;
    auto load_kv = [&](int i) {
        const int n0 = (nb_end - 1 - i) * BN, st = i % STAGES;
        if (i >= STAGES) mbar_wait(empty0 + st * 8, ((i / STAGES) - 1) & 1);
        tile_load_sw128<BN, HS, NT>(sK + st * BN * HS, k + (int64_t)n0 * p.k_st.row, p.k_st.row, p.T_k - n0, tid);
        tile_load_sw128<BN, HS, NT>(sV + st * BN * HS, v + (int64_t)n0 * p.v_st.row, p.v_st.row, p.T_k - n0, tid);
        mbar_arrive_cp_async(full0 + st * 8);
    };
    if (tid == 0)
        for (int st = 0; st < STAGES; st++) mbar_init(full0 + st * 8, NT), mbar_init(empty0 + st * 8, NT);
    __syncthreads();
    tile_load_sw128<BM, HS, NT>(sQ, q, p.q_st.row, m_valid, tid);  // lands with tile 0's barrier
    for (int i = 0; i < STAGES - 1 && i < n_tiles; i++) load_kv(i);

    // Descriptors: this warpgroup's 64 rows of Q and stage 0 of K (K-major), of V (MN-major).
    const uint64_t q_desc = sw128_desc(smem_u32(sQ) + wg * 64 * 128, 16, 1024);
    const uint64_t k_desc0 = sw128_desc(smem_u32(sK), 16, 1024), v_desc0 = sw128_desc(smem_u32(sV), BN * 128, 1024);
    float o[NO * 4];
#pragma unroll
    for (int i = 0; i < NO * 4; i++) o[i] = 0.f;
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};

    for (int i = 0; i < n_tiles; i++) {
        const int nb = nb_end - 1 - i, n0 = nb * BN, st = i % STAGES;
        mbar_wait(full0 + st * 8, (i / STAGES) & 1);
        fence_proxy_async();  // the copies (generic proxy) before the MMAs' reads (async proxy)

        float s[NS * 4];
        const uint64_t k_desc = desc_add(k_desc0, st * BN * HS * 2), v_desc = desc_add(v_desc0, st * BN * HS * 2);
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < HS / 16; ks++)  // the k16 slice: column block ks / 4, byte 32 (ks % 4) of its rows
            Wgmma<T, BN, 0, 0>::ss(s, desc_add(q_desc, (ks >> 2) * BM * 128 + (ks & 3) * 32),
                                   desc_add(k_desc, (ks >> 2) * BN * 128 + (ks & 3) * 32), ks > 0);
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_fence_regs(s);

        if (prescale) {
#pragma unroll
            for (int i = 0; i < NS * 4; i++) s[i] *= scale_log2;
        }
        if (tile_class(first, last, n0, n0 + BN) == TILE_PARTIAL) {
#pragma unroll
            for (int nt = 0; nt < NS; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int r = e >> 1, j = n0 + nt * 8 + 2 * t + (e & 1);
                    if (j < rr[r].lo || j >= rr[r].hi) s[nt * 4 + e] = -INFINITY;
                }
        }
        // Online softmax (flash_fwd.cu): a row that has seen only masked keys keeps max -inf and
        // uses 0 in its place, so exp2 gives 0, never NaN.
        uint32_t pa[BN / 16][4];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float mx = -INFINITY;
#pragma unroll
            for (int nt = 0; nt < NS; nt++) mx = fmaxf(mx, fmaxf(s[nt * 4 + 2 * r], s[nt * 4 + 2 * r + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            mx = fmaxf(row_max[r], mx * sl);
            const float m_use = mx == -INFINITY ? 0.f : mx;
            const float corr = exp2_ftz(row_max[r] - m_use);
            row_max[r] = mx;
            row_sum[r] *= corr;
#pragma unroll
            for (int i = 0; i < NO; i++) {
                o[i * 4 + 2 * r] *= corr;
                o[i * 4 + 2 * r + 1] *= corr;
            }
#pragma unroll
            for (int i = 0; i < NS * 2; i++) {
                const int idx = (i >> 1) * 4 + 2 * r + (i & 1);
                const float pr = exp2_ftz(fmaf(s[idx], sl, -m_use));
                row_sum[r] += pr;
                s[idx] = pr;
            }
        }
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
            pa[kk][0] = ElemTraits<T>::pack(s[8 * kk + 0], s[8 * kk + 1]);
            pa[kk][1] = ElemTraits<T>::pack(s[8 * kk + 2], s[8 * kk + 3]);
            pa[kk][2] = ElemTraits<T>::pack(s[8 * kk + 4], s[8 * kk + 5]);
            pa[kk][3] = ElemTraits<T>::pack(s[8 * kk + 6], s[8 * kk + 7]);
        }

        wgmma_fence_regs(o);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++)
            Wgmma<T, HS, 0, 1>::rs(o, pa[kk], desc_add(v_desc, kk * 16 * 128), 1);
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_fence_regs(o);
        wgmma_fence_regs(pa);
        mbar_arrive(empty0 + st * 8);
        if (i + STAGES - 1 < n_tiles) load_kv(i + STAGES - 1);
    }

    // Finish: O /= rowsum (0 for a fully masked row, LSE +inf), staged through this warpgroup's
    // own rows of sQ (no other warpgroup reads them) and stored with 16-byte writes.
    asm volatile("cp.async.wait_all;\n" ::: "memory");  // the Q copy, when no key tile was visible
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float sum = row_sum[r];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        const float inv = sum > 0.f ? 1.f / sum : 0.f;
        const int row = wrow0 + 8 * r + g;
        if (p.lse && t == 0 && row < p.T_q)
            p.lse[((int64_t)b * p.NH + h) * p.T_q + row] = sum > 0.f ? (row_max[r] + log2f(sum)) * LN2_F : INFINITY;
#pragma unroll
        for (int i = 0; i < NO; i++)
            *reinterpret_cast<uint32_t *>(sQ + sw128_offset<BM>(wg * 64 + warp * 16 + 8 * r + g, i * 8 + 2 * t)) =
                ElemTraits<T>::pack(o[i * 4 + 2 * r] * inv, o[i * 4 + 2 * r + 1] * inv);
    }
    named_barrier(1 + wg, 128);
    const int wrow = m0 + wg * 64;
    T *out = static_cast<T *>(p.out) + b * p.o_st.batch + (int64_t)wrow * p.o_st.row + h * p.o_st.head;
    tile_store_sw128<BM, 64, HS, 128>(out, p.o_st.row, sQ, wg * 64, p.T_q - wrow, tid & 127);
#endif
}

template <typename T, int HS, int NWG> void flash_fwd_sm90_launch(const AttnParams &p, cudaStream_t s) {
    using Tile = Sm90FwdTile<HS, NWG>;
    auto kernel = flash_fwd_sm90_kernel<T, HS, NWG>;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)Tile::SMEM));
    dim3 grid(cdiv(p.T_q, Tile::BM), p.NH, p.B);
    kernel<<<grid, Tile::NTHREADS, Tile::SMEM, s>>>(p);
    CUDA_CHECK(cudaGetLastError());
}

// Whether this binary holds the sm_90a code of the sm90 kernels for the current device (a build
// without -gencode ...sm_90a runs the sm80 family on Hopper).
bool flash_sm90_ok() {
    cudaFuncAttributes a;
    if (cudaFuncGetAttributes(&a, flash_fwd_sm90_kernel<__nv_bfloat16, 64, 2>) != cudaSuccess) return false;
    return a.binaryVersion == 90;
}

#define INSTANTIATE_FWD_SM90(T)                                                    \
    template void flash_fwd_sm90_launch<T, 64, 2>(const AttnParams &, cudaStream_t); \
    template void flash_fwd_sm90_launch<T, 64, 3>(const AttnParams &, cudaStream_t); \
    template void flash_fwd_sm90_launch<T, 128, 2>(const AttnParams &, cudaStream_t);
INSTANTIATE_FWD_SM90(__nv_bfloat16)
INSTANTIATE_FWD_SM90(__half)
