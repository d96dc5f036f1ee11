// wgmma: the Hopper (sm_90a) building blocks of the sm90 flash kernels: warpgroup MMA
// (wgmma.mma_async, m64nNk16, fp32 accumulate) with operands in shared memory described by
// matrix descriptors, or A in registers; the 128-byte-swizzled tile layout those descriptors
// read; and the fences that order them. Internal to attention/*.cu.
//
// A warpgroup is 4 consecutive warps (128 threads). For m64nNk16 warp w of the group owns rows
// 16w..16w+15 of the 64-row result, with the mma.m16n8k16 C layout repeated over the N/8
// column tiles: d[4j + e] is row 16w + g + 8*(e >> 1), column 8j + 2t + (e & 1) (lane = 4g + t).
// An A operand in registers has the mma.m16n8k16 A layout on the same rows, so the fp32 results
// of two adjacent n8 tiles convert to one k16 slice of A (c_to_a in flash_common.cuh).
//
// Shared-memory layout (SW128): a tile of ROWS x COLS 16-bit elements (COLS a multiple of 64) is
// stored as COLS/64 column blocks of [ROWS][64]; each 128-byte row has its eight 16-byte chunks
// XOR-ed with row % 8, the tile starting on a 1024-byte boundary. That is the canonical
// 128-byte-swizzle layout of the PTX ISA's matrix descriptors in both orientations:
//   K-major (the reduction dimension runs along the row: Q and K in S = Q K^T): a k16 slice is
//     32 bytes of every row; 8-row groups are 1024 bytes apart (SBO); the slice at k sits in
//     column block k / 64 at byte 2 * (k % 64) of the row.
//   MN-major (the reduction dimension runs down the rows: V in O = P V): a k16 slice is 16
//     consecutive rows (two 8-row groups, SBO = 1024 bytes); 64-column blocks are LBO apart.
#pragma once
#include <stdint.h>

#include "attention/flash_common.cuh"

// The sm90 kernels' bodies exist only in the sm_90a build (wgmma is not in plain sm_90 or later
// architectures); elsewhere they compile empty and the host never selects them (flash_sm90_ok).
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FLASH_SM90_DEVICE 1
#endif

// ---- the SW128 tile layout ---------------------------------------------------------------

// Element offset of (row, col) in an SW128 tile of ROWS rows.
template <int ROWS> __device__ __forceinline__ int sw128_offset(int row, int col) {
    const unsigned r = (unsigned)row, c = (unsigned)col;
    return (int)((c >> 6) * ROWS * 64 + r * 64 + ((((c >> 3) & 7) ^ (r & 7)) << 3) + (c & 7));
}

// The first 1024-byte boundary at or after p (where an SW128 tile starts).
__device__ __forceinline__ unsigned char *smem_align1024(unsigned char *p) { return smem_align<1024>(p); }

// Stores rows [row0, row0 + NROWS) of an SW128 tile of ROWS rows to global memory (row r of the
// tile to dst + (r - row0) * row_stride), skipping rows at or beyond row0 + n_valid.
template <int ROWS, int NROWS, int COLS, int NTHREADS, typename T>
__device__ __forceinline__ void tile_store_sw128(T *dst, int64_t row_stride, const T *smem, int row0,
                                                 int n_valid, int tid) {
    constexpr int CH = COLS / 8, TOTAL = NROWS * CH;
    static_assert(TOTAL % NTHREADS == 0, "SW128 tile store shape");
#pragma unroll
    for (int it = 0; it < TOTAL / NTHREADS; it++) {
        const int c = it * NTHREADS + tid, r = c / CH, col = (c % CH) * 8;
        if (r < n_valid)
            *reinterpret_cast<uint4 *>(dst + (int64_t)r * row_stride + col) =
                *reinterpret_cast<const uint4 *>(smem + sw128_offset<ROWS>(row0 + r, col));
    }
}

// ---- descriptors and fences ---------------------------------------------------------------

// Matrix descriptor of an SW128 operand starting at shared address `addr` (bytes; the tile
// itself 1024-byte aligned): start, leading and stride byte offsets in 16-byte units, layout
// type 1 (128-byte swizzle) in bits 62-63.
__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | (uint64_t)((lbo_bytes >> 4) & 0x3FFF) << 16 |
           (uint64_t)((sbo_bytes >> 4) & 0x3FFF) << 32 | (uint64_t)1 << 62;
}

// The descriptor of the operand `bytes` further on (a multiple of 16): the start address is the
// low 14-bit field in 16-byte units, and shared addresses stay below 256 KB, so no carry leaves it.
__device__ __forceinline__ uint64_t desc_add(uint64_t desc, uint32_t bytes) { return desc + (bytes >> 4); }

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Orders the generic-proxy writes of this thread to shared memory (stores, cp.async after its
// wait) before later wgmma reads of them (the async proxy); a barrier must follow.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Keeps the compiler from moving reads or writes of accumulator registers across a wgmma
// wait or fence (the asm statements of the MMAs do not tell it when the hardware touches them).
template <int N> __device__ __forceinline__ void wgmma_fence_regs(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}
// The same for A fragments in registers: an RS wgmma reads them after it is issued, so they
// must stay live (not be reused for other values) until the wait that covers it.
template <int M> __device__ __forceinline__ void wgmma_fence_regs(uint32_t (&a)[M][4]) {
#pragma unroll
    for (int i = 0; i < M; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) asm volatile("" : "+r"(a[i][e])::"memory");
}
// Named barrier over the NTHREADS threads that use id (1..15; 0 is __syncthreads).
__device__ __forceinline__ void named_barrier(int id, int nthreads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(nthreads) : "memory");
}
// Arrives at named barrier id without waiting (its waiters bar.sync with the same nthreads).
__device__ __forceinline__ void named_barrier_arrive(int id, int nthreads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(nthreads) : "memory");
}
// Gives this warpgroup's registers back to the block's pool (dec) or takes them from it (inc),
// down or up to N per thread; every warp of the warpgroup executes the same one.
template <int N> __device__ __forceinline__ void setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N> __device__ __forceinline__ void setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

// ---- mbarriers (stage hand-off without block-wide barriers) --------------------------------

__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes this thread's mbar_init results visible to the copy engine (before a barrier that
// publishes them to the other threads).
__device__ __forceinline__ void mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Arrives once and expects `bytes` more from bulk copies that complete on this barrier.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// Waits until the phase with parity `parity` of the barrier has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    } while (!done);
}

// ---- warpgroup MMA ------------------------------------------------------------------------

#define WG_D8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), \
                 "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define WG_D32 WG_D8(0), WG_D8(8), WG_D8(16), WG_D8(24)
#define WG_D64 WG_D32, WG_D8(32), WG_D8(40), WG_D8(48), WG_D8(56)
#define WG_D128 WG_D64, WG_D8(64), WG_D8(72), WG_D8(80), WG_D8(88), WG_D8(96), WG_D8(104), WG_D8(112), WG_D8(120)
#define WG_R32 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22," \
               "%23,%24,%25,%26,%27,%28,%29,%30,%31}"
#define WG_R64 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22," \
               "%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,"   \
               "%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}"

#define WG_R128 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26," \
                "%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50," \
                "%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74," \
                "%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98," \
                "%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118," \
                "%119,%120,%121,%122,%123,%124,%125,%126,%127}"

// d (64 x N, fp32) = A B (+ d when accumulate), both operands in shared memory. TA / TB: 0 for
// a K-major operand, 1 for an MN-major one. Issued asynchronously: commit, then wait before d
// is read or the operands overwritten.
template <typename T, int N, int TA, int TB> struct Wgmma;

// One shape m64nNk16 of one element type (TY: its PTX name): NR accumulator registers, listed
// as RLIST in the instruction and DLIST as operands; the operands after them are numbered from
// NR on, given as strings I0..I6 (NR, NR + 1, ...) because the instruction text needs them.
#define WGMMA_SHAPE(TYPE, TY, N, NR, RLIST, DLIST, I0, I1, I2, I3, I4, I5, I6)                         \
    template <int TA, int TB> struct Wgmma<TYPE, N, TA, TB> {                                         \
        static __device__ __forceinline__ void ss(float (&d)[NR], uint64_t a, uint64_t b, int acc) {   \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" I2 ", 0;\n"                             \
                         "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " " RLIST        \
                         ", %" I0 ", %" I1 ", p, 1, 1, %" I3 ", %" I4 ";\n}\n"                        \
                         : DLIST : "l"(a), "l"(b), "r"(acc), "n"(TA), "n"(TB));                       \
        }                                                                                              \
        static __device__ __forceinline__ void rs(float (&d)[NR], const uint32_t (&a)[4], uint64_t b,  \
                                                  int acc) {                                           \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" I5 ", 0;\n"                             \
                         "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " " RLIST        \
                         ", {%" I0 ",%" I1 ",%" I2 ",%" I3 "}, %" I4 ", p, 1, 1, %" I6 ";\n}\n"      \
                         : DLIST : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc),      \
                           "n"(TB));                                                                   \
        }                                                                                              \
    };
#define WGMMA_SPECIALISE(TYPE, TY)                                                                     \
    WGMMA_SHAPE(TYPE, TY, 64, 32, WG_R32, WG_D32, "32", "33", "34", "35", "36", "37", "38")            \
    WGMMA_SHAPE(TYPE, TY, 128, 64, WG_R64, WG_D64, "64", "65", "66", "67", "68", "69", "70")           \
    WGMMA_SHAPE(TYPE, TY, 256, 128, WG_R128, WG_D128, "128", "129", "130", "131", "132", "133", "134")

#ifdef FLASH_SM90_DEVICE
WGMMA_SPECIALISE(__nv_bfloat16, "bf16")
WGMMA_SPECIALISE(__half, "f16")
#else
// Host passes and other architectures see stubs: the kernels that call them are never launched
// there (flash_sm90_ok), and their bodies are compiled out anyway.
template <typename T, int N, int TA, int TB> struct Wgmma {
    template <int M> static __device__ __forceinline__ void ss(float (&)[M], uint64_t, uint64_t, int) {}
    template <int M>
    static __device__ __forceinline__ void rs(float (&)[M], const uint32_t (&)[4], uint64_t, int) {}
};
#endif
#undef WGMMA_SPECIALISE
#undef WGMMA_SHAPE
