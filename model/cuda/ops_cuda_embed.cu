// ops_cuda_embed: the embedding backward, deterministic. Rows of dout are scattered into the
// token table (and the position table) without atomics: the row indices are sorted by table
// row with CUB's stable radix sort over the bits a row index of the table needs (positions
// i % T come out of a fill in that order, no sort),
// then one block per distinct table row adds that row's contributions in ascending token order
// in fp32 and rounds once into the gradient. The result is bitwise the same on every run. A
// table row that many tokens share (a frequent token) is summed by one block serially; that is
// the price of the fixed order, and why the block first finds its run's end, so that the loads
// of the run are issued several at a time ahead of the adds.
#include <cub/device/device_radix_sort.cuh>

#include "model/cuda/cuda_common.cuh"

#define EMB_THREADS 256

// keys[i] = table row of token i; vals[i] = i.
__global__ void embed_keys_kernel(int *keys, int *vals, const int *ids, int N) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    keys[i] = ids[i];
    vals[i] = i;
}

// What the stable sort gives for keys i % T of N = B T tokens, directly: sorted entry s is
// position s / B of batch row s % B, token (s % B) T + s / B.
__global__ void embed_pos_keys_kernel(int *keys, int *rows, int N, int T) {
    const int s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s >= N) return;
    const int B = N / T;
    keys[s] = s / B;
    rows[s] = (s % B) * T + s / B;
}

// keys (N) sorted, rows (N) the token index of each sorted key, ascending within equal keys.
// Block x = i handles the run of equal keys starting at i (other blocks exit at once); block y
// picks the channel tile.
template <typename T>
__global__ void embed_scatter_kernel(T *table, const T *dout, const int *keys, const int *rows,
                                     int N, int C) {
    const int i = blockIdx.x, key = keys[i];
    if (i > 0 && keys[i - 1] == key) return;
    const int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) return;
    int end = i + 1;
    while (end < N && keys[end] == key) end++;
    float acc = 0.0f;
#pragma unroll 8
    for (int j = i; j < end; j++) acc += to_f32(dout[(size_t)rows[j] * C + c]);
    T *t = table + (size_t)key * C + c;
    *t = from_f32<T>(to_f32(*t) + acc);
}

// table (R, C) += scatter of dout (N, C) by ids (N), or by position i % T when ids is NULL.
static void embed_scatter(Backend *be, void *table, const void *dout, const int *ids, int N, int T,
                          int C, int R) {
    CudaCtx *ctx = cuda_ctx(be);
    // Keys are table rows in [0, R): the sort passes over their low end_bit bits alone (7 for
    // the quickstart's 128 padded rows, 16 for GPT-2's 50,304, against 31 for any int), so it
    // runs fewer digit passes.
    int end_bit = 1;
    while (end_bit < 31 && (1 << end_bit) < R) end_bit++;
    const size_t ib = align256((size_t)N * sizeof(int));
    size_t sort_bytes = 0;
    if (ids)
        CUDA_CHECK(cub::DeviceRadixSort::SortPairs(NULL, sort_bytes, (const int *)NULL, (int *)NULL,
                                                   (const int *)NULL, (int *)NULL, N, 0, end_bit,
                                                   ctx->stream));
    // The sorted keys and rows first; the sort's inputs and its temporary storage after them.
    char *s = (char *)cuda_scratch(ctx, ids ? 4 * ib + sort_bytes : 2 * ib);
    int *keys = (int *)s, *rows = (int *)(s + ib);                         // (N)
    int *keys_in = (int *)(s + 2 * ib), *rows_in = (int *)(s + 3 * ib);    // (N), ids only
    void *sort_tmp = s + 4 * ib;

    if (ids) {
        embed_keys_kernel<<<cdiv(N, EMB_THREADS), EMB_THREADS, 0, ctx->stream>>>(keys_in, rows_in,
                                                                                 ids, N);
        CUDA_CHECK_LAUNCH();
        CUDA_CHECK(cub::DeviceRadixSort::SortPairs(sort_tmp, sort_bytes, keys_in, keys, rows_in,
                                                   rows, N, 0, end_bit, ctx->stream));
    } else {
        embed_pos_keys_kernel<<<cdiv(N, EMB_THREADS), EMB_THREADS, 0, ctx->stream>>>(keys, rows, N, T);
        CUDA_CHECK_LAUNCH();
    }
    dispatch_dtype(be->dtype, [&](auto tag) {
        using E = decltype(tag);
        embed_scatter_kernel<E><<<dim3(N, cdiv(C, EMB_THREADS)), EMB_THREADS, 0, ctx->stream>>>(
            (E *)table, (const E *)dout, keys, rows, N, C);
    });
    CUDA_CHECK_LAUNCH();
}

void cuda_embed_backward(Backend *be, void *dwte, void *dwpe, const void *dout, const int *tokens,
                         const int *pos, int B, int T, int C, int V, int P) {
    const int N = B * T;
    embed_scatter(be, dwte, dout, tokens, N, T, C, V);
    if (dwpe) embed_scatter(be, dwpe, dout, pos, N, T, C, P);
}
