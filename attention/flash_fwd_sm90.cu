// flash_fwd_sm90: the FlashAttention-2 forward on Hopper's warpgroup MMA (wgmma, sm_90a). One
// block per (query tile, head, batch row); each warpgroup owns 64 query rows. S = Q K^T reads
// both operands from shared memory; the probabilities stay in registers as the A operand of
// O += P V. Q and K/V tiles are copied by the copy engine (TMA); K/V stream through two or three
// stages handed over by mbarriers. The loop is software-pipelined as in FlashAttention-3: S of
// the next key tile is issued before O += P V of the current one, so the softmax runs while the
// tensor cores work. Masking follows
// flash_fwd_sm80.cu (partial tiles masked per element, empty tiles skipped). Soft-capping, ALiBi
// and dropout live in the EXTRAS instances only (flash_mask.cuh's ScoreRule and dropout fragment bytes), so
// the plain instance keeps its registers; dropout draws the same mask as every implementation.
#include "attention/flash_common.cuh"
#include "attention/flash_mask.cuh"
#include "attention/flash_tiles.cuh"
#include "attention/tma.cuh"
#include "attention/wgmma.cuh"

// HS is the tiles' head width (a multiple of 64), HS_OUT <= HS the tensors' head size: the
// columns past it read as zeros (sm90_tile_hs) and are not stored.
template <typename T, int HS, int NWG, bool EXTRAS, int HS_OUT = HS, int BLOCKS = 1>
__global__ void __launch_bounds__(Sm90FwdTile<HS, NWG, BLOCKS>::NTHREADS, BLOCKS)
    flash_fwd_sm90_kernel(const AttnParams p, const __grid_constant__ CUtensorMap tm_q,
                          const __grid_constant__ CUtensorMap tm_k, const __grid_constant__ CUtensorMap tm_v) {
#ifdef FLASH_SM90_DEVICE
    using Tile = Sm90FwdTile<HS, NWG, BLOCKS>;
    constexpr int BM = Tile::BM, BN = Tile::BN;
    constexpr int NS = BN / 8, NO = HS / 8;  // n8 column tiles of the scores and of the output
    constexpr int STAGES = Tile::STAGES;
    extern __shared__ unsigned char smem_raw[];
    auto &sm = smem_storage<Sm90FwdSmem<T, HS, NWG, BLOCKS>>(smem_raw);
    T *sQ = sm.q, *sK = sm.k[0], *sV = sm.v[0];  // (BM, HS), STAGES x (BN, HS), STAGES x (BN, HS)
    // K and V of a stage on mbarriers of their own (Tile::KV_APART), else full_k and empty_k
    // stand for the whole stage.
    constexpr bool KV_APART = Tile::KV_APART;
    const uint32_t full_k0 = smem_u32(sm.full_k), empty_k0 = smem_u32(sm.empty_k);
    const uint32_t full_v0 = smem_u32(sm.full_v), empty_v0 = smem_u32(sm.empty_v);

    const QueryBlock qb = query_block<EXTRAS>(p, BM, BN);
    const int h = qb.h, b = qb.b, kvh = qb.kvh, m0 = qb.m0;
    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;

    const int wrow0 = m0 + wg * 64 + warp * 16;  // this warp's first query row
    RowRange rr[2];
#pragma unroll
    for (int r = 0; r < 2; r++) rr[r] = row_range(p, b, min(wrow0 + 8 * r + g, p.T_q - 1));
    const float scale_log2 = p.scale * LOG2E_F;
    // Scores stay raw and the scale folds into the exponent's FMA, unless the cap or ALiBi must
    // apply to the scaled score first (or the scale is not positive, which would reverse the max).
    const bool prescale = (EXTRAS && score_rule_applies(p)) || !(p.scale > 0.f);
    const float sl = prescale ? 1.f : scale_log2;
    ScoreRule rule{};
    int pos0 = 0;  // aligned position of the warp's first row, in keys
    float keep_scale = 1.f;  // applied to O once, at the end
    uint32_t keep_thresh = 0;
    uint64_t keep_offset = 0;  // the Philox offset, read once (it may sit in device memory)
    uint64_t keep_block = 0;   // PACKED_KEEP: the lane's Philox block at key 0 (dropout_lane_block_fwd)
    uint32_t keep_bias = 0;    // dropout_lane_bias(keep_thresh)
    static_assert(NS % 4 == 0, "dropout draws 32 keys at a time");
    // HS 64 ANDs the dropout bytes into the packed P (dropout_pair_masks); HS 128 and up, where
    // that measured 0.89-0.91x at 8K keys (docs/PERFORMANCE.md), test each fp32 element instead.
    constexpr bool PACKED_KEEP = HS == 64;
    uint32_t drop[NS / 4][2][2];  // PACKED_KEEP: the tile's dropout bytes (dropout_bytes_fwd), softmax to pack
    if constexpr (EXTRAS) {
        rule = score_rule(p, b, h);
        pos0 = wrow0 + (int)attn_query_shift(&p);
        if (p.dropout_p > 0.f) {
            keep_scale = attn_dropout_scale(p.dropout_p), keep_thresh = attn_dropout_threshold(p.dropout_p);
            keep_offset = attn_dropout_offset(&p);
            keep_bias = dropout_lane_bias(keep_thresh);
            if constexpr (PACKED_KEEP) keep_block = dropout_lane_block_fwd(p, b, h, wrow0, g, t);
        }
    }

    // Key tiles run from last to first (the partial diagonal and ragged tiles first, then the
    // bulk): tile i starts at key key_n0(i), in stage i % STAGES. One thread has the copy engine
    // load each tile's K and V (keys past T_k read as zeros), which land on the stage's `full_k`
    // and (KV_APART) `full_v` barriers; every MMA thread arrives on `empty_k` once its
    // S = Q K^T of the tile has completed and on `empty_v` once its O += P V has (without
    // KV_APART on `empty_k`, then). K and V are refilled once all have released them, so
    // warpgroups drift apart by up to a tile instead of meeting every tile. Q lands with K of
    // tile 0 (rows past T_q read as zeros).
    const int n_tiles = qb.n_tiles();
    auto key_n0 = [&](int i) { return qb.key_tile(n_tiles - 1 - i) * BN; };  // i-th tile from the last
    auto load_k = [&](int i) {  // one thread; Q lands with K of tile 0, V too without KV_APART
        const int n0 = key_n0(i), st = i % STAGES;
        const uint32_t full = full_k0 + st * 8;
        if (i >= STAGES) mbar_wait(empty_k0 + st * 8, ((i / STAGES) - 1) & 1);
        mbar_arrive_expect_tx(full, ((KV_APART ? 1 : 2) * BN + (i == 0 ? BM : 0)) * HS * 2);
        if (i == 0) tma_load_sw128<BM, HS>(sQ, &tm_q, m0, h, b, full);
        tma_load_sw128<BN, HS>(sK + st * BN * HS, &tm_k, n0, kvh, b, full);
        if (!KV_APART) tma_load_sw128<BN, HS>(sV + st * BN * HS, &tm_v, n0, kvh, b, full);
    };
    auto load_v = [&](int i) {  // one thread, KV_APART
        if constexpr (!KV_APART) return;
        const int st = i % STAGES;
        const uint32_t full = full_v0 + st * 8;
        if (i >= STAGES) mbar_wait(empty_v0 + st * 8, ((i / STAGES) - 1) & 1);
        mbar_arrive_expect_tx(full, BN * HS * 2);
        tma_load_sw128<BN, HS>(sV + st * BN * HS, &tm_v, key_n0(i), kvh, b, full);
    };
    if (tid == 0) {
        for (int st = 0; st < STAGES; st++) {
            mbar_init(full_k0 + st * 8, 1), mbar_init(empty_k0 + st * 8, Tile::NMMA);
            if (KV_APART) mbar_init(full_v0 + st * 8, 1), mbar_init(empty_v0 + st * 8, Tile::NMMA);
        }
        mbar_init_fence();
        for (int i = 0; i < STAGES && i < n_tiles; i++) load_k(i), load_v(i);
    }
    __syncthreads();
    // The producer warpgroup (Tile::PRODUCER) issues the refills, each once its stage is released,
    // with KV_APART K of tile i before V of tile i - 1 (S of tile i and O += P V of tile i - 1 go
    // out together, and K's stage is released first); otherwise thread 0 does, after its own
    // warpgroup's release (the step below).
    if constexpr (Tile::PRODUCER) {
        if (wg == NWG) {
            setmaxnreg_dec<Tile::REGS_PRODUCER>();
            if (tid == Tile::NMMA)
                for (int i = STAGES; i <= n_tiles; i++) {
                    if (i < n_tiles) load_k(i);
                    if (i - 1 >= STAGES) load_v(i - 1);
                }
            return;
        }
        setmaxnreg_inc<Tile::REGS_MMA>();
    }

    // Descriptors: this warpgroup's 64 rows of Q and stage 0 of K (K-major), of V (MN-major).
    const uint64_t q_desc = sw128_desc(smem_u32(sQ) + wg * 64 * 128, 16, 1024);
    const uint64_t k_desc0 = sw128_desc(smem_u32(sK), 16, 1024), v_desc0 = sw128_desc(smem_u32(sV), BN * 128, 1024);
    // Lazy rescaling (FlashAttention-4's): a row's running max moves only when a tile's scores
    // pass it by more than 8 (log2 units), so P stays below 2^8 and O is rescaled only on the
    // tiles where a row of the warp moved; the LSE and the final 1 / sum use the same max, so the
    // softmax is the same. Measured 1.02-1.09x at D 128 and 1.04x at D 64's short causal rows
    // (docs/PERFORMANCE.md). The three-warpgroup instance lost 17-21% with it (0.91-1.00x under
    // the producer) and the two-block feature instance would spill: both keep the exact max.
    constexpr bool LAZY = NWG == 2 && !(EXTRAS && BLOCKS == 2);
    float o[NO * 4], s[NS * 4];
#pragma unroll
    for (int i = 0; i < NO * 4; i++) o[i] = 0.f;
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f}, corr[2];
    uint32_t pa[BN / 16][4];

    // S = Q K^T of tile i (waits for its stage), issued and committed as one wgmma group.
    auto issue_scores = [&](int i) {
        const int st = i % STAGES;
        mbar_wait(full_k0 + st * 8, (i / STAGES) & 1);
        const uint64_t k_desc = desc_add(k_desc0, st * BN * HS * 2);
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < HS / 16; ks++)  // the k16 slice: column block ks / 4, byte 32 (ks % 4) of its rows
            Wgmma<T, BN, 0, 0>::ss(s, desc_add(q_desc, (ks >> 2) * BM * 128 + (ks & 3) * 32),
                                   desc_add(k_desc, (ks >> 2) * BN * 128 + (ks & 3) * 32), ks > 0);
        wgmma_commit();
    };
    // O += P V of tile i, one wgmma group (P from registers, V from its stage; KV_APART waits
    // for V here).
    auto issue_pv = [&](int i) {
        const int st = i % STAGES;
        if (KV_APART) mbar_wait(full_v0 + st * 8, (i / STAGES) & 1);
        const uint64_t v_desc = desc_add(v_desc0, st * BN * HS * 2);
        wgmma_fence_regs(o);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) Wgmma<T, HS, 0, 1>::rs(o, pa[kk], desc_add(v_desc, kk * 16 * 128), 1);
        wgmma_commit();
    };
    // Online softmax of tile i's scores in s (flash_fwd_sm80.cu): s becomes P, the running max and
    // sum move on, corr is the factor O still has to take. A row that has seen only masked keys
    // keeps max -inf and uses 0 in its place, so exp2 gives 0, never NaN. Only partial tiles
    // are masked: `masked` is a compile-time flag (the loop forms below).
    auto softmax = [&](int i, auto masked) {
        const int n0 = key_n0(i);
        if (EXTRAS && prescale) {
#pragma unroll
            for (int e = 0; e < NS * 4; e++) {
                float dcap;
                s[e] = score_log2(rule, s[e], pos0 + 8 * ((e >> 1) & 1) + g, n0 + (e >> 2) * 8 + 2 * t + (e & 1), &dcap);
            }
        } else if (prescale) {
#pragma unroll
            for (int e = 0; e < NS * 4; e++) s[e] *= scale_log2;
        }
        if constexpr (decltype(masked)::value) mask_scores<NS>(s, rr, n0, t);
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float mx = -INFINITY;
#pragma unroll
            for (int nt = 0; nt < NS; nt++) mx = fmaxf(mx, fmaxf(s[nt * 4 + 2 * r], s[nt * 4 + 2 * r + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            // LAZY: the max stays unless passed by more than 8; corr is then exactly 1.
            mx = fmaxf(row_max[r], mx * sl);
            if (LAZY && !(mx > row_max[r] + 8.f)) mx = row_max[r];
            const float m_use = mx == -INFINITY ? 0.f : mx;
            corr[r] = LAZY && mx == row_max[r] ? 1.f : exp2_ftz(row_max[r] - m_use);
            row_max[r] = mx;
            float sum = 0.f;
#pragma unroll
            for (int e = 0; e < NS * 2; e++) {
                const int idx = (e >> 1) * 4 + 2 * r + (e & 1);
                s[idx] = exp2_ftz(fmaf(s[idx], sl, -m_use));
                sum += s[idx];
            }
            row_sum[r] = row_sum[r] * corr[r] + sum;
        }
        // Dropout after the sum (which is over the undropped probabilities), one Philox block
        // per 16 elements (flash_mask.cuh), drawn here under O += P V; the survivors' scale
        // waits for the output. With PACKED_KEEP the bytes wait in `drop` for rescale_and_pack;
        // without, each fp32 element is tested here.
        if (EXTRAS && p.dropout_p > 0.f) {
            if constexpr (PACKED_KEEP) {
#pragma unroll
                for (int k = 0; k < NS / 4; k++) dropout_bytes_fwd(p, keep_offset, keep_block + n0 + 32 * k, g, drop[k]);
            } else {
                dropout_fragment_fwd<NS>(p, keep_offset, keep_thresh, b, h, wrow0, n0, g, t, [&](int nt, int e, bool keep) {
                    if (!keep) s[nt * 4 + e] = 0.f;
                });
            }
        }
    };
    // O *= corr (LAZY: only where a row of the warp moved its max), then P (fp32 in s) packed
    // into pa, the A operand of the next O += P V.
    auto rescale_and_pack = [&]() {
        if (!LAZY || __any_sync(0xffffffffu, corr[0] != 1.f || corr[1] != 1.f))
#pragma unroll
            for (int i = 0; i < NO; i++)
#pragma unroll
                for (int e = 0; e < 4; e++) o[i * 4 + e] *= corr[e >> 1];
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++)
#pragma unroll
            for (int e = 0; e < 4; e++) pa[kk][e] = ElemTraits<T>::pack(s[8 * kk + 2 * e], s[8 * kk + 2 * e + 1]);
        // pa[kk][e] holds row g + 8 (e & 1) of n8 tile 2 kk + (e >> 1): word e & 1 of 16-key tile
        // kk & 1 of draw kk >> 1, its even bytes for tile 2 kk and odd ones for 2 kk + 1.
        if (EXTRAS && PACKED_KEEP && p.dropout_p > 0.f) {
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++)
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    uint32_t even, odd;
                    dropout_pair_masks(drop[kk >> 1][kk & 1][r], keep_bias, even, odd);
                    pa[kk][r] &= even;
                    pa[kk][2 + r] &= odd;
                }
        }
    };

    // Software pipeline (FlashAttention-3's intra-warpgroup overlap): while O += P V of tile
    // i - 1 runs on the tensor cores, the softmax of tile i (whose S = Q K^T was issued just
    // before) runs on the other units. Tile i is key_n0(i) (last to first: the partial
    // diagonal and ragged tiles first, then the bulk), in stage i % STAGES; a stage is released
    // once its O += P V has completed, and refilled with tile i + STAGES. Each tile's softmax
    // is the instance of its class, picked per tile inside one loop (TileByClass) or, in the
    // SPLIT instances, with the masked and unmasked steps in loops of their own (for_tile_runs),
    // so that loop holds one softmax. ptxas keeps the softmax between the two waits in the first
    // form; in the split one it places the wait for O += P V before the softmax, so the overlap
    // within a warpgroup is lost and the warpgroups take turns (below) to get it back. Measured
    // (docs/PERFORMANCE.md): split loops with turns at HS 64 with three warpgroups (from 4K
    // queries), 1.04-1.07x the split loops alone; one loop at HS 64 with two warpgroups,
    // 1.04-1.06x the split loops, and at HS 128, where the split loops measured 0.95-0.99x.
    // Turns with one loop measured 0.90-0.96x while thread 0 refilled the stages; with the
    // producer warpgroup, 1.03-1.04x the producer alone at HS 128 at 1K and 2K queries, level
    // (0.99-1.01x) from 8K (docs/PERFORMANCE.md). Three warpgroups under the producer keep the
    // split loops: one loop there measured 0.94-1.05x (0.97x in the median). The feature
    // instances run one loop too (at HS 64 with dropout about level with split loops,
    // 1.00-1.03x) and at HS 64 mask their first tile whatever its class.
    constexpr bool SPLIT = HS == 64 && NWG == 3;
    auto tile_softmax = [&](int i, auto masked) {
        if constexpr (std::is_same<decltype(masked), TileByClass>::value) {
            const int n0 = key_n0(i);
            step_by_class(tile_class(qb.first, qb.last, n0, n0 + BN) == TILE_PARTIAL, [&](auto m) { softmax(i, m); });
        } else {
            softmax(i, masked);
        }
    };
    // Warpgroup turns in the PRODUCER instances (FlashAttention-3's ping-pong; not with two
    // blocks per SM, where the other block fills the gaps): the warpgroups issue
    // their tensor-core work one after the other, so one's softmax runs while the next one's
    // GEMMs do. Warpgroup wg takes a turn on named barrier TURN0 + wg once warpgroup wg - 1
    // (mod NWG) has arrived on it after issuing its own; warpgroup 0 takes its first turn at once
    // and the last one does not hand on its last, so each barrier completes as often as it is
    // waited on (turns: S of tile 0, then S of tile i with O += P V of tile i - 1, then
    // O += P V of the last tile).
    constexpr int TURN0 = 8;           // ids 1 .. NWG stage the output below
    constexpr int TURN_THREADS = 256;  // the warpgroup that waits and the one that arrives
    constexpr bool TURNS = Tile::PRODUCER;
    auto turn_begin = [&](bool first) {
        if (TURNS && (!first || wg > 0)) named_barrier(TURN0 + wg, TURN_THREADS);
    };
    auto turn_end = [&](bool last) {
        if (TURNS && (!last || wg < NWG - 1)) named_barrier_arrive(TURN0 + (wg + 1) % NWG, TURN_THREADS);
    };
    if (n_tiles > 0) {
        turn_begin(true);
        issue_scores(0);
        turn_end(false);
        wgmma_wait<0>();
        wgmma_fence_regs(s);
        if (KV_APART) mbar_arrive(empty_k0);
        if constexpr (EXTRAS && HS == 64) softmax(0, Masked<true>());
        else tile_softmax(0, TileByClass());
        rescale_and_pack();
    }
    auto step = [&](int i, auto masked) {
        turn_begin(false);
        issue_scores(i);
        issue_pv(i - 1);
        turn_end(false);
        wgmma_wait<1>();  // S of tile i (KV_APART: its K is released)
        wgmma_fence_regs(s);
        if (KV_APART) mbar_arrive(empty_k0 + (i % STAGES) * 8);
        tile_softmax(i, masked);
        wgmma_wait<0>();  // O += P V of tile i - 1
        wgmma_fence_regs(o);
        wgmma_fence_regs(pa);
        mbar_arrive((KV_APART ? empty_v0 : empty_k0) + ((i - 1) % STAGES) * 8);
        if (!Tile::PRODUCER && tid == 0 && i - 1 + STAGES < n_tiles) load_k(i - 1 + STAGES), load_v(i - 1 + STAGES);
        rescale_and_pack();
    };
    if constexpr (SPLIT) {
        for_tile_runs(tile_runs(qb, BN), 1, step);
    } else {
        for (int i = 1; i < n_tiles; i++) step(i, TileByClass());
    }
    if (n_tiles > 0) {
        turn_begin(false);
        issue_pv(n_tiles - 1);
        turn_end(true);
        wgmma_wait<0>();
        wgmma_fence_regs(o);
        wgmma_fence_regs(pa);
    }

    // Finish: O times keep_scale / rowsum (0 for a fully masked row, LSE +inf), staged through this warpgroup's
    // own rows of sQ (no other warpgroup reads them) and stored with 16-byte writes.
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float sum = row_sum[r];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        const float inv = sum > 0.f ? keep_scale / sum : 0.f;
        const int row = wrow0 + 8 * r + g;
        if (p.lse && t == 0 && row < p.T_q)
            p.lse[attn_lse_offset(&p, b, h) + row] = sum > 0.f ? (row_max[r] + log2f(sum)) * LN2_F : INFINITY;
#pragma unroll
        for (int i = 0; i < NO; i++)
            *reinterpret_cast<uint32_t *>(sQ + sw128_offset<BM>(wg * 64 + warp * 16 + 8 * r + g, i * 8 + 2 * t)) =
                ElemTraits<T>::pack(o[i * 4 + 2 * r] * inv, o[i * 4 + 2 * r + 1] * inv);
    }
    named_barrier(1 + wg, 128);
    const int wrow = m0 + wg * 64;
    T *out = tensor_at(static_cast<T *>(p.out), p.o_st, b, wrow, h);
    tile_store_sw128<BM, 64, HS_OUT, 128>(out, p.o_st.row, sQ, wg * 64, p.T_q - wrow, tid & 127);
#endif
}

template <typename T, int HS, int NWG, bool EXTRAS, int BLOCKS>
CUresult flash_fwd_sm90_launch(const AttnParams &p, TensorMapEncoder enc, cudaStream_t s) {
    constexpr int HST = sm90_tile_hs(HS);
    using Tile = Sm90FwdTile<HST, NWG, BLOCKS>;
    CUresult status = CUDA_SUCCESS;
    const QkvMaps m = qkv_tensor_maps(enc, p, Tile::BM, Tile::BN, &status);
    if (status != CUDA_SUCCESS) return status;
    flash_launch<Sm90FwdSmem<T, HST, NWG, BLOCKS>, SM90_SMEM_LIMIT>(flash_fwd_sm90_kernel<T, HST, NWG, EXTRAS, HS, BLOCKS>,
                                                                    dim3(cdiv(p.T_q, Tile::BM), p.NH, p.B),
                                                                    Tile::NTHREADS, s, p, m.q, m.k, m.v);
    return CUDA_SUCCESS;
}

// Whether this binary holds the sm_90a code of the sm90 kernels for the current device (a build
// without -gencode ...sm_90a runs the sm80 family on Hopper).
bool flash_sm90_ok() {
    cudaFuncAttributes a;
    if (cudaFuncGetAttributes(&a, flash_fwd_sm90_kernel<__nv_bfloat16, 64, 2, false>) != cudaSuccess) return false;
    return a.binaryVersion == 90;
}

// Every head size with two warpgroups, plain and with the features; HS 32 and 64 (HS 64's tiles)
// also with three (plain only) and with two blocks per SM (plain and with the features):
// attn_select_kernel.
#define INSTANTIATE_FWD_SM90_HS(T, HS)                                                                          \
    template CUresult flash_fwd_sm90_launch<T, HS, 2, false>(const AttnParams &, TensorMapEncoder, cudaStream_t); \
    template CUresult flash_fwd_sm90_launch<T, HS, 2, true>(const AttnParams &, TensorMapEncoder, cudaStream_t);
#define INSTANTIATE_FWD_SM90_HS64(T, HS)                                                                         \
    INSTANTIATE_FWD_SM90_HS(T, HS)                                                                               \
    template CUresult flash_fwd_sm90_launch<T, HS, 3, false>(const AttnParams &, TensorMapEncoder, cudaStream_t); \
    template CUresult flash_fwd_sm90_launch<T, HS, 2, false, 2>(const AttnParams &, TensorMapEncoder, cudaStream_t); \
    template CUresult flash_fwd_sm90_launch<T, HS, 2, true, 2>(const AttnParams &, TensorMapEncoder, cudaStream_t);
#define INSTANTIATE_FWD_SM90(T)                                                                                  \
    INSTANTIATE_FWD_SM90_HS64(T, 32)                                                                             \
    INSTANTIATE_FWD_SM90_HS64(T, 64)                                                                             \
    INSTANTIATE_FWD_SM90_HS(T, 96)                                                                               \
    INSTANTIATE_FWD_SM90_HS(T, 128)                                                                              \
    INSTANTIATE_FWD_SM90_HS(T, 256)
INSTANTIATE_FWD_SM90(__nv_bfloat16)
INSTANTIATE_FWD_SM90(__half)
