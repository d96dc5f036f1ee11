// flash_bwd_sm90: the FlashAttention-2 backward main kernel on Hopper's warpgroup MMA (wgmma,
// sm_90a); flash_bwd_sm80.cu's preprocess (D, zeroed dQ accumulator) and dQ conversion run around
// it. One block per (key tile of BN keys, KV head, batch row), two warpgroups of 64 keys each.
// For every query tile of every query head sharing the KV head, each warpgroup computes the
// transposed products, keys as rows, so that P^T and dS^T land in registers in the layout of
// the next products' A operand:
//   S^T = K Q^T and dP^T = V dO^T   (64 keys x BM queries, both operands in shared memory;
//                                     dP^T runs while P^T = exp(S^T - LSE) is computed)
//   dV += P^T dO, dK += dS^T Q      (A from registers, dO and Q read MN-major)
//   dQ += dS K                      (dS^T through shared memory, both operands MN-major; the
//                                     two warpgroups split the BM x HS result into 64 x 64
//                                     blocks and stage theirs in shared memory)
// Each pair issues S^T and dP^T first; this pair's bookkeeping runs while the tensor cores work.
// A third warpgroup, the copy warpgroup, gives most of its registers to the two MMA warpgroups
// (setmaxnreg). One warp of it, the loader, fills two stages of Q, dO, LSE, D and the rows' key
// ranges ahead of the MMA warpgroups (K and V with each run's first pair), each stage as soon as
// both MMA warpgroups have released it (its `empty` mbarrier); another, the writer, adds each
// staged dQ block into the fp32 accumulator with one bulk reduction. The MMA warpgroups meet once
// per pair, when dS^T is complete for the dQ product (dS^T is double-buffered, so the next pair's
// stores need no second meeting). Soft-capping, ALiBi and dropout
// live in the EXTRAS instances only (flash_mask.cuh's ScoreRule; the dropout mask is every
// implementation's). The deterministic mode runs the instance without dQ (DQ false: no dQ
// product, no writer; an EXTRAS one, whose features cost nothing when off) and
// flash_bwd_dq_sm80.cu's dQ kernel after it, as the sm80 family does. Both are compile-time
// choices: a run-time branch around the dQ product serialises the plain instance's wgmma.
// Stream-K (SPLIT, the plain instance with dQ in accumulate mode, when every query sees every
// key): when the units (key tile, KV head, batch row) do not fill whole waves of the
// multiprocessors, one block per multiprocessor runs all but the last full wave's units in waves,
// one whole unit each (consecutive units run together, as without SPLIT, so they share their
// queries in L2), then an equal share of the rest's pair iterations in order. A block works in
// runs, one unit each: after each run it adds its partial dK and dV with atomics (a unit's pairs
// may be shared by two blocks), then loads the next unit's K and V. Pipeline stage and mbarrier
// phase count the block's pairs, not the unit's.
#include "attention/flash_common.cuh"
#include "attention/flash_mask.cuh"
#include "attention/flash_tiles.cuh"
#include "attention/tma.cuh"
#include "attention/wgmma.cuh"

// HS is the tiles' head width (a multiple of 64), HS_OUT <= HS the tensors' head size: the
// columns past it read as zeros (sm90_tile_hs), so their dK, dV and dQ come out 0 and dK and dV
// are not stored (dQ's accumulator holds HS columns, attn_dq_acc_floats).
template <typename T, int HS, bool EXTRAS, bool DQ, bool SPLIT, int HS_OUT = HS>
__global__ void __launch_bounds__(Sm90BwdTile<HS>::NTHREADS, 1)
    flash_bwd_sm90_kernel(const AttnParams p, const float *dsum, float *dq_accum,
                          const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                          const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_do) {
#ifdef FLASH_SM90_DEVICE
    using Tile = Sm90BwdTile<HS>;
    constexpr int BM = Tile::BM, BN = Tile::BN, NT = Tile::NMMA;  // NT: the MMA threads
    constexpr int NQ = BM / 8;  // n8 column tiles (queries) of S^T and dP^T
    extern __shared__ unsigned char smem_raw[];
    auto &sm = smem_storage<Sm90BwdSmem<T, HS>>(smem_raw);
    T *sK = sm.k, *sV = sm.v, *sQ = sm.q[0], *sdO = sm.dout[0], *sdS = sm.ds[0];
    float *sdQ = sm.dq[0], *sLse = sm.lse[0], *sD = sm.d[0];
    int2 *sRng = sm.rng[0];
    int *sPartial = sm.partial;
    const uint32_t full0 = smem_u32(sm.full), empty0 = smem_u32(sm.empty);  // per stage, 8 bytes apart

    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;

    // A stage is full once the loader's lane 0 has issued its copies and every lane has stored
    // its share of the rows (FULL_ARRIVALS) and the copies have landed; empty once every MMA thread
    // has arrived after its last read of it.
    constexpr int FULL_ARRIVALS = 1 + 32;
    if (tid == 0) {
        for (int st = 0; st < 2; st++) mbar_init(full0 + st * 8, FULL_ARRIVALS), mbar_init(empty0 + st * 8, NT);
        mbar_init_fence();
    }
    __syncthreads();

    // The run: unit (key tile n_block, KV head kvh, batch row b) and its pairs [it_begin, it_end);
    // n_iters: the block's pairs over all its runs. Without SPLIT the block's one unit, whole.
    // With SPLIT (P pairs per unit, the same for every unit of a uniform mask; C blocks): units
    // blockIdx.x + w C for w < dp_waves, whole, then the block's share [g_next, g_end) of the
    // pair iterations of the units from dp_waves C on, unit u holding [u P, (u + 1) P).
    int n_block = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z, it_begin = 0, it_end = 0, n_iters = 0;
    int n0 = 0, n_valid = 0;
    BwdPairs pairs;
    const int NKB = cdiv(p.T_k, BN);
    int64_t g_next = 0, g_end = 0;
    int P = 0, dp_waves = 0, dp_w = 0;
    auto start_run = [&]() {
        n0 = n_block * BN, n_valid = min(BN, p.T_k - n0);
        pairs = bwd_pairs<EXTRAS>(p, b, kvh, n0, n_valid, BM);
        if constexpr (!SPLIT) it_end = pairs.total;
    };
    auto next_run = [&]() {  // SPLIT: the block's next run; false once its share is done
        int64_t u;
        if (dp_w < dp_waves) {
            u = blockIdx.x + (int64_t)dp_w++ * gridDim.x;
            it_begin = 0, it_end = P;
        } else {
            if (g_next >= g_end) return false;
            u = g_next / P;
            it_begin = (int)(g_next - u * P);
            it_end = g_end - g_next < P - it_begin ? it_begin + (int)(g_end - g_next) : P;
            g_next += it_end - it_begin;
        }
        n_block = (int)(u % NKB), kvh = (int)(u / NKB % p.NKV), b = (int)(u / ((int64_t)NKB * p.NKV));
        start_run();
        return true;
    };
    if constexpr (SPLIT) {
        P = bwd_pairs<false>(p, 0, 0, 0, min(BN, p.T_k), BM).total;
        const int64_t units = (int64_t)NKB * p.NKV * p.B, C = gridDim.x;
        dp_waves = units >= C ? (int)(units / C - 1) : 0;
        const int64_t sk0 = dp_waves * C * P, W = units * P - sk0;  // the shared iterations
        g_next = sk0 + W * blockIdx.x / C, g_end = sk0 + W * (blockIdx.x + 1) / C;
        n_iters = (int)(dp_waves * P + g_end - g_next);
        next_run();
    } else {
        start_run();
        n_iters = pairs.total;
    }

    // The loader: the block's pairs in the MMA warpgroups' order into stage gi & 1 (gi the block's
    // pairs so far). Lane 0 has the copy engine load Q and dO (K and V with a run's first pair,
    // once the MMA warpgroups are done with the last run's: the previous pair's stage released);
    // the lanes load LSE and D (zeros from m_valid on) and, for a partial tile, the visible key
    // ranges of its rows. Rows past T_k or T_q read as zeros (flash_bwd_sm80.cu: their dS and P
    // dO come out 0).
    auto load_pairs = [&]() {
        int gi = 0;
        do {
            int hi = SPLIT ? it_begin / pairs.n_mb : 0, mb = SPLIT ? it_begin % pairs.n_mb : 0;
            for (int it = it_begin; it < it_end; it++, gi++) {
                const int stage = gi & 1, h = kvh * pairs.G + hi, m0 = pairs.tile_m0(mb, BM);
                if (++mb == pairs.n_mb) mb = 0, hi++;
                const bool kv = it == it_begin;
                if (gi >= 2) mbar_wait(empty0 + stage * 8, ((gi >> 1) - 1) & 1);
                if (kv && gi >= 1) mbar_wait(empty0 + (stage ^ 1) * 8, ((gi - 1) >> 1) & 1);
                const uint32_t full = full0 + stage * 8;
                if (lane == 0) {
                    mbar_arrive_expect_tx(full, (2 * BM + (kv ? 2 * BN : 0)) * HS * 2);
                    if (kv) {
                        tma_load_sw128<BN, HS>(sK, &tm_k, n0, kvh, b, full);
                        tma_load_sw128<BN, HS>(sV, &tm_v, n0, kvh, b, full);
                    }
                    tma_load_sw128<BM, HS>(sQ + stage * BM * HS, &tm_q, m0, h, b, full);
                    tma_load_sw128<BM, HS>(sdO + stage * BM * HS, &tm_do, m0, h, b, full);
                }
                const int m_valid = min(BM, p.T_q - m0);
                const float *lse = p.lse + attn_lse_offset(&p, b, h) + m0;
                const float *d = dsum + ((int64_t)b * p.NH + h) * p.T_q + m0;
                for (int r = lane; r < BM; r += 32) {
                    const bool ok = r < m_valid;
                    sLse[stage * BM + r] = ok ? lse[r] : 0.f;
                    sD[stage * BM + r] = ok ? d[r] : 0.f;
                }
                const RowRange first = row_range(p, b, m0), last = row_range(p, b, m0 + m_valid - 1);
                const bool partial = tile_class(first, last, n0, n0 + BN) != TILE_FULL;
                if (partial)
                    for (int r = lane; r < BM; r += 32) {
                        const RowRange rr = row_range(p, b, min(m0 + r, p.T_q - 1));
                        sRng[stage * BM + r] = make_int2(rr.lo, rr.hi);
                    }
                if (lane == 0) sPartial[stage] = partial;
                mbar_arrive(full);
            }
        } while (SPLIT && next_run());
    };

    // Named barriers: 1 the MMA warpgroups; per MMA warpgroup w, DQ_FULL + w (its dQ block is
    // staged) and DQ_EMPTY + w (the writer has read it: the next may be staged), each the
    // warpgroup + one warp.
    constexpr int BAR_MMA = 1, DQ_FULL = 2, DQ_EMPTY = 4, NDQ = 128 + 32;
    if (wg == 2) {  // the copy warpgroup: warp 1 the loader, warp 0 the writer
        setmaxnreg_dec<Tile::REGS_COPY>();
        if (warp == 1) {
            load_pairs();
            return;
        }
        if (warp != 0 || !DQ) return;
        // the writer: pairs in the MMA warpgroups' order, each block as it is staged
        int gi = 0;  // the block's pairs so far
        do {
            int hi = SPLIT ? it_begin / pairs.n_mb : 0, mb = SPLIT ? it_begin % pairs.n_mb : 0;
            for (int it = it_begin; it < it_end; it++, gi++) {
                const int h = kvh * pairs.G + hi, m0 = pairs.tile_m0(mb, BM);
                if (++mb == pairs.n_mb) mb = 0, hi++;
#pragma unroll
                for (int w = 0; w < 2; w++) {
                    // HS 64: query halves (row blocks m0/64 + w); HS 128: column halves.
                    const int rb = (m0 >> 6) + (BM == 128 ? w : 0), cb = BM == 128 ? 0 : w;
                    named_barrier(DQ_FULL + w, NDQ);
                    if (lane == 0) {
                        if (rb * 64 < p.T_q) {  // rows past T_q land in the padding; a block wholly past is skipped
                            bulk_reduce_add_f32(dq_accum + dq_acc_block(p, b, h, rb, cb), smem_u32(sdQ + w * 4096), 4096 * 4);
                            bulk_commit();
                        }
                        bulk_wait_read();
                    }
                    __syncwarp();
                    if (gi + 1 < n_iters) named_barrier_arrive(DQ_EMPTY + w, NDQ);
                }
            }
        } while (SPLIT && next_run());
        if (lane == 0) bulk_wait();
        return;
    }
    setmaxnreg_inc<Tile::REGS_MMA>();

    float dk[HS / 2], dv[HS / 2];  // this warpgroup's (64 keys, HS), zeroed at each run's start
    const float scale_log2 = p.scale * LOG2E_F;
    const float keep_scale = EXTRAS && p.dropout_p > 0.f ? attn_dropout_scale(p.dropout_p) : 1.f;
    const uint32_t keep_thresh = EXTRAS ? attn_dropout_threshold(p.dropout_p) : 0u;  // 0: every byte keeps
    const uint64_t keep_offset = EXTRAS && p.dropout_p > 0.f ? attn_dropout_offset(&p) : 0;  // read once
    // p_step's P^T in the feature instance comes out times keep_scale (its log2 added to the
    // exponent), so that ds_step_extras' `pre` path multiplies no element by it (D by its inverse)
    const float log2_keep = EXTRAS ? log2f(keep_scale) : 0.f;
    const float keep_inv = EXTRAS ? (float)(256u - keep_thresh) * (1.f / 256.f) : 1.f;
    const int krow = wg * 64 + warp * 16 + g;  // tile-relative key of d[4j + 0..1]; +8 for 2..3
    const uint32_t k_base = smem_u32(sK), v_base = smem_u32(sV), ds_base = smem_u32(sdS);
    // dQ split between the warpgroups: HS 64 (BM 128) by query halves, HS 128 (BM 64) by column
    // halves; each is a 64 x 64 x BN product (column block dq_a of dS^T, dq_b of K).
    const int dq_a = BM == 128 ? wg : 0, dq_b = BM == 128 ? 0 : wg;
    float2 *sdQ_frag = reinterpret_cast<float2 *>(sdQ + wg * 4096) + warp * 512 + lane;  // flash_mask.cuh's order
    // Descriptors of the fixed operands (the k-steps add constant byte offsets): this warpgroup's
    // K and V rows (K-major), and dQ's column blocks of dS^T and K (MN-major).
    const uint64_t krows_desc = sw128_desc(k_base + wg * 64 * 128, 16, 1024);
    const uint64_t vrows_desc = sw128_desc(v_base + wg * 64 * 128, 16, 1024);
    const uint64_t dqa_desc = sw128_desc(ds_base + dq_a * BN * 128, BN * 128, 1024);
    const uint64_t dqb_desc = sw128_desc(k_base + dq_b * BN * 128, BN * 128, 1024);
    // This thread's dS^T stores: row krow + 8r, column 8j + 2t, at the byte address
    // ds_row[r] + (((j & 7) ^ g) << 4) + (j >> 3) * BN * 128 (sw128_offset with the row fixed).
    // The pair's dS^T buffer (gi & 1): ds_buf(gi) more, in these addresses and in dqa_desc.
    uint32_t ds_row[2];
#pragma unroll
    for (int r = 0; r < 2; r++) ds_row[r] = ds_base + (krow + 8 * r) * 128 + 4 * t;
    auto ds_buf = [](int gi) { return (uint32_t)((gi & 1) * BN * BM * sizeof(T)); };

    // dK and dV of the run's keys (fp32 in accumulate mode, attention.h) += this warpgroup's: with
    // SPLIT by atomics (two blocks may share the unit), else by the block that owns its rows.
    auto add_dk_dv = [&]() {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int row = krow + 8 * r;
            if (row >= n_valid) continue;
            float *dkr = tensor_at(static_cast<float *>(p.dk), p.dk_st, b, n0 + row, kvh) + 2 * t;
            float *dvr = tensor_at(static_cast<float *>(p.dv), p.dv_st, b, n0 + row, kvh) + 2 * t;
#pragma unroll
            for (int j = 0; j < HS_OUT / 8; j++) {
                const float2 k2 = make_float2(dk[4 * j + 2 * r] * p.scale, dk[4 * j + 2 * r + 1] * p.scale);
                const float2 v2 = make_float2(dv[4 * j + 2 * r], dv[4 * j + 2 * r + 1]);
                if constexpr (SPLIT) {
                    atomic_add_pair(dkr + 8 * j, k2.x, k2.y);
                    atomic_add_pair(dvr + 8 * j, v2.x, v2.y);
                } else {
                    add_pair(dkr + 8 * j, k2.x, k2.y);
                    add_pair(dvr + 8 * j, v2.x, v2.y);
                }
            }
        }
    };

    int gi = 0;  // the block's pairs so far: stage gi & 1, its mbarrier's phase (gi >> 1) & 1
    do {
#pragma unroll
        for (int i = 0; i < HS / 2; i++) dk[i] = dv[i] = 0.f;
        for (int it = it_begin; it < it_end; it++, gi++) {
            const int stage = gi & 1;
            mbar_wait(full0 + stage * 8, (gi >> 1) & 1);  // this stage (and K, V) landed

            const uint32_t q_base = smem_u32(sQ + stage * BM * HS), o_base = smem_u32(sdO + stage * BM * HS);
            const uint64_t q_kdesc = sw128_desc(q_base, 16, 1024), o_kdesc = sw128_desc(o_base, 16, 1024);
            float st[NQ * 4], dpt[NQ * 4];
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < HS / 16; ks++)
                Wgmma<T, BM, 0, 0>::ss(st, desc_add(krows_desc, (ks >> 2) * BN * 128 + (ks & 3) * 32),
                                       desc_add(q_kdesc, (ks >> 2) * BM * 128 + (ks & 3) * 32), ks > 0);
            wgmma_commit();
#pragma unroll
            for (int ks = 0; ks < HS / 16; ks++)
                Wgmma<T, BM, 0, 0>::ss(dpt, desc_add(vrows_desc, (ks >> 2) * BN * 128 + (ks & 3) * 32),
                                       desc_add(o_kdesc, (ks >> 2) * BM * 128 + (ks & 3) * 32), ks > 0);
            wgmma_commit();

            const bool partial = sPartial[stage];
            const float *cLse = sLse + stage * BM, *cD = sD + stage * BM;
            const int2 *cRng = sRng + stage * BM;
            const uint64_t q_mndesc = sw128_desc(q_base, BM * 128, 1024), o_mndesc = sw128_desc(o_base, BM * 128, 1024);

            // P^T = exp(scale S^T - LSE) (0 where masked) while dP^T is still running; the per-element
            // test only in the Masked<true> instance, for the tiles that need it (it costs the bulk
            // instructions).
            wgmma_wait<1>();
            wgmma_fence_regs(st);
            auto p_step = [&](auto masked) {
#pragma unroll
                for (int j = 0; j < NQ; j++) {
                    const int q = 8 * j + 2 * t;
                    const float2 lse = *reinterpret_cast<const float2 *>(cLse + q);
                    const float nl[2] = {fmaf(-lse.x, LOG2E_F, log2_keep), fmaf(-lse.y, LOG2E_F, log2_keep)};
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const float x = exp2_ftz(fmaf(st[4 * j + e], scale_log2, nl[e & 1]));
                        if constexpr (decltype(masked)::value) {
                            const int2 rg = cRng[q + (e & 1)];
                            const int key = n0 + krow + 8 * (e >> 1);
                            st[4 * j + e] = key < rg.x || key >= rg.y ? 0.f : x;
                        } else {
                            st[4 * j + e] = x;
                        }
                    }
                }
            };
            // The feature instance with no score rule (dropout alone) computes P^T here too, as the
            // plain one does, and takes only the keep bits after dP^T (ds_step_extras' `pre`).
            const bool p_first = !EXTRAS || !score_rule_applies(p);
            if (p_first) step_by_class(partial, p_step);
            wgmma_wait<0>();
            wgmma_fence_regs(dpt);
            // dS^T = P^T * (dP^T - D), kept in registers (for dK) and in shared memory (for dQ), and
            // P^T after dropout in registers (for dV): emit stores row pair r of column tile j.
            uint32_t pa[BM / 16][4], sa[BM / 16][4];
            auto emit = [&](int j, int r, uint32_t pk, uint32_t ds) {
                const uint32_t addr = ds_row[r] + ds_buf(gi) + ((((unsigned)j & 7) ^ (unsigned)g) << 4) + (j >> 3) * BN * 128;
                asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(ds) : "memory");
                sa[j >> 1][(j & 1) * 2 + r] = ds;
                pa[j >> 1][(j & 1) * 2 + r] = pk;
            };
            // The feature instance, once dP^T has landed: per column tile j the capped and biased
            // scores (flash_mask.cuh's ScoreRule), P^T, the dropout keep bits and dS^T = P^T *
            // cap' * (dP^T dropped - D), so that no score, probability or bit outlives its j (P^T
            // computed under dP^T's product, as above, kept 32 more registers live at HS 64 and
            // serialised the wgmma). Dropout: one Philox block per 16 elements, 32 queries at a time
            // (flash_mask.cuh's fragment bytes; their words outlive j by up to three tiles). With
            // `pre`, st already holds P^T times keep_scale (p_step, no score rule): only the keep
            // bits are applied, and dS^T = P^T keep_scale * (dP^T kept - D / keep_scale).
            auto ds_step_extras = [&](auto masked, auto pre) {
                constexpr bool PRE = decltype(pre)::value;
                const int h = pairs.head(it), m0 = pairs.m0(it, BM);
                const ScoreRule rule = score_rule(p, b, h);
                const int shift = (int)attn_query_shift(&p);
                static_assert(NQ % 4 == 0, "dropout draws 32 queries at a time");
                uint32_t drop[2][2] = {{0u, 0u}, {0u, 0u}};  // bytes 0 keep when there is no dropout
                // HS 64 steps the lane's block along the query tile; HS 128 computes it at each
                // draw, which measured 1.02-1.05x against the stepping there (docs/PERFORMANCE.md)
                constexpr bool STEP = HS == 64;
                const uint64_t row_step = attn_dropout_row_step(&p);  // 32 queries on: twice this
                const int key0 = n0 + krow - g;  // the warp's first key
                const uint64_t blk = STEP && p.dropout_p > 0.f ? dropout_lane_block_bwd(p, b, h, 0, key0, g, t) +
                                                                     (uint64_t)(m0 >> 4) * row_step : 0;
#pragma unroll
                for (int j = 0; j < NQ; j++) {
                    const int q = 8 * j + 2 * t;
                    const float2 dd = *reinterpret_cast<const float2 *>(cD + q);
                    float nl[2] = {0.f, 0.f};  // -LSE in the log2 domain, for the exponentials (not with `pre`)
                    if constexpr (!PRE) {
                        const float2 lse = *reinterpret_cast<const float2 *>(cLse + q);
                        nl[0] = -lse.x * LOG2E_F, nl[1] = -lse.y * LOG2E_F;
                    }
                    const float dsub[2] = {PRE ? dd.x * keep_inv : dd.x, PRE ? dd.y * keep_inv : dd.y};  // D, or D / keep_scale
                    if (p.dropout_p > 0.f && j % 4 == 0)
                        dropout_bytes_bwd(p, keep_offset,
                                          STEP ? blk + (uint64_t)(j / 2) * row_step
                                               : dropout_lane_block_bwd(p, b, h, m0 + 8 * j, key0, g, t),
                                          g, drop);
                    float pk[4], ds[4];
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int key = n0 + krow + 8 * (e >> 1), i = m0 + q + (e & 1);
                        float dcap = 1.f, x;
                        if constexpr (PRE) {
                            x = st[4 * j + e];
                        } else {
                            x = exp2_ftz(score_log2(rule, st[4 * j + e], i + shift, key, &dcap) + nl[e & 1]);
                            if constexpr (decltype(masked)::value) {
                                const int2 rg = cRng[q + (e & 1)];
                                if (key < rg.x || key >= rg.y) x = 0.f;
                            }
                        }
                        // rows past T_q and keys past T_k contribute 0 whatever their bit
                        const bool keep = dropout_byte_keeps(drop[(j >> 1) & 1][e & 1], 2 * (j & 1) + (e >> 1), keep_thresh);
                        if constexpr (PRE) {
                            pk[e] = keep ? x : 0.f;
                            ds[e] = x * ((keep ? dpt[4 * j + e] : 0.f) - dsub[e & 1]);
                        } else {
                            pk[e] = keep ? x * keep_scale : 0.f;
                            ds[e] = x * dcap * ((keep ? dpt[4 * j + e] * keep_scale : 0.f) - dsub[e & 1]);
                        }
                    }
#pragma unroll
                    for (int r = 0; r < 2; r++)
                        emit(j, r, ElemTraits<T>::pack(pk[2 * r], pk[2 * r + 1]), ElemTraits<T>::pack(ds[2 * r], ds[2 * r + 1]));
                }
            };
            if constexpr (EXTRAS) {
                if (p_first) ds_step_extras(Masked<false>(), std::true_type());
                else step_by_class(partial, [&](auto masked) { ds_step_extras(masked, std::false_type()); });
            } else {
#pragma unroll
                for (int j = 0; j < NQ; j++) {
                    const float2 dd = *reinterpret_cast<const float2 *>(cD + 8 * j + 2 * t);
#pragma unroll
                    for (int r = 0; r < 2; r++)
                        emit(j, r, ElemTraits<T>::pack(st[4 * j + 2 * r], st[4 * j + 2 * r + 1]),
                             ElemTraits<T>::pack(st[4 * j + 2 * r] * (dpt[4 * j + 2 * r] - dd.x),
                                                 st[4 * j + 2 * r + 1] * (dpt[4 * j + 2 * r + 1] - dd.y)));
                }
            }
            fence_proxy_async();
            named_barrier(BAR_MMA, NT);  // dS^T complete: both warpgroups' keys

            // dQ first, then dV and dK: staging dQ for the writer warpgroup overlaps the dV/dK products.
            float dq[32];
            wgmma_fence();
            if constexpr (DQ) {
#pragma unroll
                for (int ks = 0; ks < BN / 16; ks++)
                    Wgmma<T, 64, 1, 1>::ss(dq, desc_add(dqa_desc, ds_buf(gi) + ks * 16 * 128), desc_add(dqb_desc, ks * 16 * 128), ks > 0);
                wgmma_commit();
            }
#pragma unroll
            for (int kk = 0; kk < BM / 16; kk++) Wgmma<T, HS, 0, 1>::rs(dv, pa[kk], desc_add(o_mndesc, kk * 16 * 128), 1);
#pragma unroll
            for (int kk = 0; kk < BM / 16; kk++) Wgmma<T, HS, 0, 1>::rs(dk, sa[kk], desc_add(q_mndesc, kk * 16 * 128), 1);
            wgmma_commit();
            if constexpr (DQ) {
                wgmma_wait<1>();
                wgmma_fence_regs(dq);
                if (gi > 0) named_barrier(DQ_EMPTY + wg, NDQ);
#pragma unroll
                for (int j = 0; j < 8; j++)
#pragma unroll
                    for (int r = 0; r < 2; r++) sdQ_frag[(j * 2 + r) * 32] = make_float2(dq[4 * j + 2 * r], dq[4 * j + 2 * r + 1]);
                fence_proxy_async();
                named_barrier_arrive(DQ_FULL + wg, NDQ);
            }
            wgmma_wait<0>();  // dV and dK read this stage's Q and dO, and pa / sa until here
            wgmma_fence_regs(dk);
            wgmma_fence_regs(dv);
            wgmma_fence_regs(pa);
            wgmma_fence_regs(sa);
            mbar_arrive(empty0 + stage * 8);
        }
        if constexpr (SPLIT) add_dk_dv();
    } while (SPLIT && next_run());
    if constexpr (SPLIT) return;

    if (p.accumulate) {
        add_dk_dv();
        return;
    }
    named_barrier(BAR_MMA, NT);  // every warpgroup is done with K and V (also when no query tile was visible)

    // dK = scale * dS^T Q and dV, staged through sK and sV, then stored with 16-byte writes.
#pragma unroll
    for (int j = 0; j < HS_OUT / 8; j++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int off = sw128_offset<BN>(krow + 8 * r, 8 * j + 2 * t);
            *reinterpret_cast<uint32_t *>(sK + off) = ElemTraits<T>::pack(dk[4 * j + 2 * r] * p.scale, dk[4 * j + 2 * r + 1] * p.scale);
            *reinterpret_cast<uint32_t *>(sV + off) = ElemTraits<T>::pack(dv[4 * j + 2 * r], dv[4 * j + 2 * r + 1]);
        }
    named_barrier(BAR_MMA, NT);
    T *dkg = tensor_at(static_cast<T *>(p.dk), p.dk_st, b, n0, kvh);
    T *dvg = tensor_at(static_cast<T *>(p.dv), p.dv_st, b, n0, kvh);
    tile_store_sw128<BN, BN, HS_OUT, NT>(dkg, p.dk_st.row, sK, 0, n_valid, tid);
    tile_store_sw128<BN, BN, HS_OUT, NT>(dvg, p.dv_st.row, sV, 0, n_valid, tid);
#endif
}

// Whether every query row sees every key (no documents, no block mask, and the monotone key ranges
// of the first and last rows both whole: a causal or windowed chunk pair may be so by position).
static bool bwd_mask_uniform(const AttnParams &p) {
    if (p.cu_seqlens || p.sparse_k_offsets || p.T_q <= 0 || p.T_k <= 0) return false;
    const AttnKeyRange first = attn_key_range(&p, 0, 0), last = attn_key_range(&p, 0, p.T_q - 1);
    return first.lo == 0 && first.hi == p.T_k && last.lo == 0 && last.hi == p.T_k;
}

// Stream-K when the units (key tiles, KV heads, batch rows) leave the last wave part-empty (kernel
// comment): accumulate mode only (the dK and dV atomics), never deterministic.
bool flash_bwd_sm90_stream_k(const AttnParams &p, bool extras, bool dq_accum, int sms) {
    const int64_t units = (int64_t)cdiv(p.T_k, Sm90BwdTile<64>::BN) * p.NKV * p.B;  // BN: 128 at every HS
    return !extras && dq_accum && p.accumulate && !p.deterministic && units % sms != 0 && bwd_mask_uniform(p);
}

template <typename T, int HS, bool EXTRAS>
CUresult flash_bwd_sm90_launch(const AttnParams &p, const float *dsum, float *dq_accum, int sms, TensorMapEncoder enc,
                               cudaStream_t s) {
    constexpr int HST = sm90_tile_hs(HS);
    using Tile = Sm90BwdTile<HST>;
    using Smem = Sm90BwdSmem<T, HST>;
    CUresult status = CUDA_SUCCESS;
    const QkvMaps m = qkv_tensor_maps(enc, p, Tile::BM, Tile::BN, &status);
    const CUtensorMap tm_do = sw128_tensor_map(enc, p.dout, p.do_st, p.B, p.T_q, p.NH, p.HS, Tile::BM, &status);
    if (status != CUDA_SUCCESS) return status;
    static_assert(Tile::BN == Sm90BwdTile<64>::BN, "flash_bwd_sm90_stream_k counts units of 128 keys");
    if (flash_bwd_sm90_stream_k(p, EXTRAS, dq_accum, sms)) {
        const int64_t units = (int64_t)cdiv(p.T_k, Tile::BN) * p.NKV * p.B;
        const int64_t iters = units * (p.NH / p.NKV) * cdiv(p.T_q, Tile::BM);  // bwd_pairs' total per unit
        flash_launch<Smem, SM90_SMEM_LIMIT>(flash_bwd_sm90_kernel<T, HST, false, true, true, HS>,
                                            dim3((unsigned)(iters < sms ? iters : sms)), Tile::NTHREADS, s, p, dsum,
                                            dq_accum, m.q, m.k, m.v, tm_do);
        return CUDA_SUCCESS;
    }
    const auto kernel = dq_accum ? flash_bwd_sm90_kernel<T, HST, EXTRAS, true, false, HS>
                                 : flash_bwd_sm90_kernel<T, HST, true, false, false, HS>;
    flash_launch<Smem, SM90_SMEM_LIMIT>(kernel, dim3(cdiv(p.T_k, Tile::BN), p.NKV, p.B), Tile::NTHREADS, s, p, dsum,
                                        dq_accum, m.q, m.k, m.v, tm_do);
    return CUDA_SUCCESS;
}

// Head sizes 32, 64, 96 and 128 (32 in HS 64's tiles, 96 in HS 128's); HS 256 would hold dK and
// dV in 256 registers per thread, so its backward runs the sm80 family (attn_select_kernel).
#define INSTANTIATE_BWD_SM90(T, HS)                                                                            \
    template CUresult flash_bwd_sm90_launch<T, HS, false>(const AttnParams &, const float *, float *, int,     \
                                                          TensorMapEncoder, cudaStream_t);                     \
    template CUresult flash_bwd_sm90_launch<T, HS, true>(const AttnParams &, const float *, float *, int,      \
                                                         TensorMapEncoder, cudaStream_t);
#define INSTANTIATE_BWD_SM90_T(T) \
    INSTANTIATE_BWD_SM90(T, 32) INSTANTIATE_BWD_SM90(T, 64) INSTANTIATE_BWD_SM90(T, 96) INSTANTIATE_BWD_SM90(T, 128)
INSTANTIATE_BWD_SM90_T(__nv_bfloat16)
INSTANTIATE_BWD_SM90_T(__half)
