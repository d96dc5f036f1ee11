// flash_common: the device building blocks of the sm80+ flash kernels: element-type traits,
// tensor-core MMA (m16n8k16, fp32 accumulate), ldmatrix, cp.async and the swizzled shared-memory
// tile layout. Internal to attention/*.cu.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 with 16-bit operands), lane = 4*g + t:
//   A (16x16, row-major): a0 = A[g][2t..2t+1], a1 = A[g+8][2t..], a2 = A[g][2t+8..], a3 = A[g+8][2t+8..]
//   B (16x8, "col"):      b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g]
//   C (16x8, fp32):       c0,c1 = C[g][2t..2t+1], c2,c3 = C[g+8][2t..2t+1]
// Two C tiles side by side (columns 0-7 and 8-15) hold exactly an A fragment of their 16x16
// union, which is how the probabilities P go from one MMA to the next without shared memory.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#define LOG2E_F 1.4426950408889634f
#define LN2_F 0.6931471805599453f

// ---- element types ------------------------------------------------------------------------

// The packed pair of two elements, rounded to nearest from fp32 in one conversion.
__device__ __forceinline__ __nv_bfloat162 elem_pair(float lo, float hi, __nv_bfloat16) {
    return __floats2bfloat162_rn(lo, hi);
}
__device__ __forceinline__ __half2 elem_pair(float lo, float hi, __half) { return __floats2half2_rn(lo, hi); }
// The conversions of every element type (bf16, fp16, and fp32 for the naive and merge kernels,
// where they are the identity; pack exists for the 16-bit types only).
template <typename T> struct ElemTraits {
    static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
        const auto v = elem_pair(lo, hi, T());
        return *reinterpret_cast<const uint32_t *>(&v);
    }
    static __device__ __forceinline__ float to_float(T x) { return static_cast<float>(x); }  // exact
    static __device__ __forceinline__ T from_float(float x) { return T(x); }  // round to nearest
};

// c += a * b for one 16x8x16 tile (TY: the PTX name of the element type).
template <typename T>
__device__ __forceinline__ void mma_16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1);
#define MMA_16816_SPECIALISE(TYPE, TY)                                                                    \
    template <>                                                                                           \
    __device__ __forceinline__ void mma_16816<TYPE>(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) { \
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." TY "." TY ".f32 {%0,%1,%2,%3}, "            \
                     "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"                                           \
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                     \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));                     \
    }
MMA_16816_SPECIALISE(__nv_bfloat16, "bf16")
MMA_16816_SPECIALISE(__half, "f16")
#undef MMA_16816_SPECIALISE

// 2^x in one MUFU instruction, denormal results flushed to 0 (exp2f keeps them at the cost of
// extra range-scaling instructions around every exponential).
__device__ __forceinline__ float exp2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// ---- shared memory ------------------------------------------------------------------------

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

// The first A-byte boundary (A a power of two) at or after p.
template <unsigned A> __device__ __forceinline__ unsigned char *smem_align(unsigned char *p) {
    return p + ((A - (smem_u32(p) & (A - 1))) & (A - 1));
}
// Every kernel keeps its shared memory in one struct S (the members in layout order, each tile
// aligned as its accesses need); the dynamic allocation is smem_bytes<S>(), aligned here.
template <typename S> __device__ __forceinline__ S &smem_storage(unsigned char *raw) {
    return *reinterpret_cast<S *>(smem_align<alignof(S)>(raw));
}

// Four 8x8 16-bit matrices; lanes 8m..8m+7 give the row addresses of matrix m.
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// acc[mt][2n] and acc[mt][2n + 1] += a[mt] B_n for every n < N / 2 and the MT m16 tiles: B_n
// holds the two n8 tiles of one ldmatrix.x4 (.trans when TRANS) at shared address baddr(n), so
// each B fragment read from shared memory feeds 2 MT MMAs.
template <typename T, bool TRANS, int MT, int N, typename Addr>
__device__ __forceinline__ void mma_pairs(float (&acc)[MT][N][4], const uint32_t (&a)[MT][4], Addr baddr) {
#pragma unroll
    for (int np = 0; np < N / 2; np++) {
        uint32_t bf[4];
        if (TRANS) ldmatrix_x4_trans(bf, baddr(np));
        else ldmatrix_x4(bf, baddr(np));
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            mma_16816<T>(acc[mt][2 * np], a[mt], bf[0], bf[1]);
            mma_16816<T>(acc[mt][2 * np + 1], a[mt], bf[2], bf[3]);
        }
    }
}

// 16-byte asynchronous global->shared copy; src_bytes = 0 writes zeros (ragged tile rows).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void *src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes));
}
// 4-byte variant (per-row fp32 values such as LSE); src_bytes = 0 writes a zero.
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void *src, int src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// A tile of ROWS x COLS 16-bit elements in shared memory, rows contiguous, 16-byte chunks
// XOR-swizzled so that the 8 row addresses of one ldmatrix hit 8 different bank groups
// (an unswizzled row of 128 or 256 bytes puts all 8 in the same banks: an 8-way conflict).
// The XOR flips the low bits of the chunk index within aligned groups of PERIOD chunks (the
// largest power of two up to 8 dividing CHUNKS, so a chunk never leaves its row), by
// row / ROWS_PER_PERIOD: over 8 consecutive rows the row starts (CHUNKS * row mod 8 bank
// groups) and the XOR together give 8 different bank groups. A row of 12 chunks (COLS 96)
// starts at bank group 0 or 4 and swizzles like a row of 4 (COLS 32).
template <int COLS> struct SwizzledTile {
    static constexpr int CHUNKS = COLS / 8;                       // 16-byte chunks per row
    static constexpr int PERIOD = CHUNKS % 8 == 0 ? 8 : CHUNKS % 4 == 0 ? 4 : CHUNKS % 2 == 0 ? 2 : 1;
    static constexpr int ROWS_PER_PERIOD = 8 / PERIOD;
    static_assert(COLS % 8 == 0 && PERIOD >= 2, "tile rows must hold an even number of 16-byte chunks");
    // element offset of (row, col), col a multiple of 8 for 16-byte accesses
    static_assert((PERIOD & (PERIOD - 1)) == 0 && (ROWS_PER_PERIOD & (ROWS_PER_PERIOD - 1)) == 0,
                  "swizzle period must be a power of two");
    // unsigned shifts and masks: a signed `/` and `%` cost extra instructions on every access
    static __device__ __forceinline__ int offset(int row, int col) {
        const unsigned r = (unsigned)row, c = (unsigned)col;
        const unsigned chunk = (c >> 3) ^ ((r / ROWS_PER_PERIOD) & (PERIOD - 1));
        return (int)(r * COLS + (chunk << 3) + (c & 7));
    }
};

// Copies rows [0, ROWS) of a strided global tile (row r at src + r*row_stride) into a swizzled
// shared tile with cp.async; rows at or beyond n_valid are zero-filled so ragged tiles never feed
// garbage (possibly NaN) into the MMAs. Each thread copies the same 16-byte column of rows
// r0, r0 + RPI, ...: RPI is a multiple of the swizzle's 8-row period, so one swizzled address
// and one global pointer serve every pass (address math here once cost the backward spills).
// Where the threads do not cover whole swizzle periods per pass (COLS 96: 12 chunks a row, which
// do not divide the threads; COLS 256 over 128 threads: 4 rows a pass), the tile is copied chunk
// by chunk instead, each thread's position recomputed per pass.
template <int ROWS, int COLS, int NTHREADS, typename T>
__device__ __forceinline__ void tile_load_async(T *smem, const T *src, int64_t row_stride,
                                                int n_valid, int tid) {
    constexpr int CH = COLS / 8, RPI = NTHREADS / CH;  // 16-byte chunks per row, rows per pass
    if constexpr (NTHREADS % CH != 0 || RPI % 8 != 0) {
        static_assert(ROWS * CH % NTHREADS == 0, "tile copy must divide evenly over the threads");
#pragma unroll
        for (int it = 0; it < ROWS * CH / NTHREADS; it++) {
            const int c = it * NTHREADS + tid, r = c / CH, col = (c % CH) * 8;
            const bool ok = r < n_valid;
            cp_async_16(smem_u32(smem + SwizzledTile<COLS>::offset(r, col)), ok ? src + r * row_stride + col : src,
                        ok ? 16 : 0);
        }
    } else {
        static_assert(ROWS % RPI == 0, "tile copy must divide evenly over the threads");
        const int r0 = tid / CH, col = (tid % CH) * 8;
        const uint32_t dst = smem_u32(smem + SwizzledTile<COLS>::offset(r0, col));
        const T *g = src + (int64_t)r0 * row_stride + col;
#pragma unroll
        for (int it = 0; it < ROWS / RPI; it++) {
            const bool ok = r0 + it * RPI < n_valid;
            cp_async_16(dst + it * RPI * COLS * 2, ok ? g + it * RPI * row_stride : src, ok ? 16 : 0);
        }
    }
}

// Stores rows [0, n_valid) of a swizzled shared tile to global memory with 16-byte stores.
template <int ROWS, int COLS, int NTHREADS, typename T>
__device__ __forceinline__ void tile_store(T *dst, int64_t row_stride, const T *smem, int n_valid,
                                           int tid) {
    constexpr int CH = COLS / 8;
    constexpr int TOTAL = ROWS * CH;
    static_assert(TOTAL % NTHREADS == 0, "tile copy must divide evenly over the threads");
#pragma unroll
    for (int it = 0; it < TOTAL / NTHREADS; it++) {
        int c = it * NTHREADS + tid;
        int r = c / CH, col = (c % CH) * 8;
        if (r < n_valid)
            *reinterpret_cast<uint4 *>(dst + (int64_t)r * row_stride + col) =
                *reinterpret_cast<const uint4 *>(smem + SwizzledTile<COLS>::offset(r, col));
    }
}

// Row address (for ldmatrix lane `lane`) of the A operand 16x16 block at (row0, col0) of a
// row-major swizzled tile: matrices (rows 0-7, cols 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15).
template <int COLS, typename T>
__device__ __forceinline__ uint32_t frag_addr_a(const T *tile, int row0, int col0, int lane) {
    return smem_u32(tile + SwizzledTile<COLS>::offset(row0 + (lane & 15), col0 + ((lane >> 4) << 3)));
}
// Row address for the B operand of two adjacent n8 tiles from a tile stored [n][k] (so B is
// "col-major", no transpose): matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15)
// give b0,b1 of n-tile 0 then b0,b1 of n-tile 1.
template <int COLS, typename T>
__device__ __forceinline__ uint32_t frag_addr_b_nk(const T *tile, int n0, int k0, int lane) {
    return smem_u32(tile + SwizzledTile<COLS>::offset(n0 + (lane & 7) + ((lane >> 4) << 3),
                                                       k0 + (((lane >> 3) & 1) << 3)));
}
// Row address for the B operand of two adjacent n8 tiles from a tile stored [k][n] (B row-major,
// loaded with ldmatrix.trans): matrices (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15).
template <int COLS, typename T>
__device__ __forceinline__ uint32_t frag_addr_b_kn(const T *tile, int k0, int n0, int lane) {
    return smem_u32(tile + SwizzledTile<COLS>::offset(k0 + (lane & 7) + (((lane >> 3) & 1) << 3),
                                                       n0 + ((lane >> 4) << 3)));
}
// Row address for the A operand 16x16 block at (m0, k0) of a tile stored [k][m] (A col-major,
// loaded with ldmatrix.trans): matrices (k 0-7, m 0-7), (k 0-7, m 8-15), (k 8-15, m 0-7), (k 8-15, m 8-15).
template <int COLS, typename T>
__device__ __forceinline__ uint32_t frag_addr_a_km(const T *tile, int m0, int k0, int lane) {
    return smem_u32(tile + SwizzledTile<COLS>::offset(k0 + (lane & 7) + ((lane >> 4) << 3),
                                                       m0 + (((lane >> 3) & 1) << 3)));
}

// acc[0..1] += (x, y) in global fp32 memory (8-byte aligned): one vector atomic on sm90, two
// scalar ones before it. The result is unused, so both compile to reductions (RED).
__device__ __forceinline__ void atomic_add_pair(float *acc, float x, float y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    atomicAdd(reinterpret_cast<float2 *>(acc), make_float2(x, y));
#else
    atomicAdd(acc, x);
    atomicAdd(acc + 1, y);
#endif
}

// acc[0..1] += (x, y) in global fp32 memory (8-byte aligned) that this thread alone updates:
// the accumulate mode's read-add-write of gradients a block owns (attention.h).
__device__ __forceinline__ void add_pair(float *acc, float x, float y) {
    float2 v = *reinterpret_cast<const float2 *>(acc);
    v.x += x;
    v.y += y;
    *reinterpret_cast<float2 *>(acc) = v;
}

// Converts the fp32 C fragments of two adjacent n8 tiles into the A fragment of their 16x16 union.
template <typename T>
__device__ __forceinline__ void c_to_a(uint32_t a[4], const float c0[4], const float c1[4]) {
    a[0] = ElemTraits<T>::pack(c0[0], c0[1]);
    a[1] = ElemTraits<T>::pack(c0[2], c0[3]);
    a[2] = ElemTraits<T>::pack(c1[0], c1[1]);
    a[3] = ElemTraits<T>::pack(c1[2], c1[3]);
}

// ---- host side ----------------------------------------------------------------------------

#include "common/cuda_check.cuh"

// Dynamic shared memory of storage S: the struct and, when it asks for more than the 16 bytes
// the runtime guarantees, the slack smem_storage aligns it within.
template <typename S> constexpr size_t smem_bytes() { return sizeof(S) + (alignof(S) > 16 ? alignof(S) : 0); }

// Launches kernel over grid with its shared storage S, which must fit LIMIT, the per-block
// shared memory of the architecture the kernel is built for (flash_tiles.cuh). A failure (of
// the shared-memory attribute, then the kernel is not launched, or of the launch) stays CUDA's
// last error, which attn_gpu_run turns into attention.h's status and message.
template <typename S, size_t LIMIT, typename... KArgs, typename... Args>
void flash_launch(void (*kernel)(KArgs...), dim3 grid, int threads, cudaStream_t s, Args &&...args) {
    static_assert(smem_bytes<S>() <= LIMIT, "shared storage exceeds the per-block limit");
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_bytes<S>()) !=
        cudaSuccess)
        return;
    kernel<<<grid, threads, smem_bytes<S>(), s>>>(static_cast<Args &&>(args)...);
}

