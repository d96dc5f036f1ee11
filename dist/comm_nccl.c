// comm_nccl: the communicator over NCCL for device buffers (the CUDA backend), on the backend's
// stream; split gives the context-parallel groups, sendrecv_start their ring exchanges (on a
// side stream; sendrecv_wait is a stream dependency, never a host wait). The NCCL
// communicator is non-blocking (config.blocking = 0): no NCCL call can block the
// host, and every wait polls ncclCommGetAsyncError beside the deadline, so a peer that died (a
// remote or system error) or hangs (the deadline) makes this rank exit non-zero (the whole job,
// under mpirun) instead of spinning in a kernel forever. Gradient buckets (reduce_scatter_start)
// are reduced on a side stream, overlapping the backward still running on the comm's stream.
#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/check.h"
#include "common/timer.h"
#include "dist/comm.h"

#define POLL_SLEEP_NS 20000L
#define WATCH_PERIOD_NS 10000000L  // how often the watch thread looks at the exchanges in flight

// The ring's exchanges never block the host (sendrecv_wait is a stream dependency), so a peer
// that dies mid-ring would leave the comm's stream waiting for an event while the host blocks in
// a plain stream synchronisation (a download) that no deadline bounds. The watch thread bounds
// them instead: each event slot of exchanged[] keeps the start time of the oldest exchange it
// stands for that has not been seen finished, and one older than the timeout (or an NCCL error)
// ends this rank as every other wait does. Started with the first exchange.
typedef struct {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int running, stop;
    int device;                    // the CUDA device of the comm's stream
    double since[COMM_P2P_MAX];    // 0: the slot has nothing in flight
} Watch;

typedef struct {
    ncclComm_t nccl;
    cudaStream_t stream;
    cudaEvent_t done;  // recorded by wait() behind the queued collectives
    // reduce_scatter_start's reductions run on side, each behind the event ready recorded on
    // stream when it was started; wait() makes stream wait for side_done behind them.
    cudaStream_t side;
    cudaEvent_t ready, side_done;
    int side_busy;     // reductions or exchanges were started on side since the last wait()
    // sendrecv_start's exchange with handle h is followed on side by exchanged[h %
    // COMM_P2P_MAX]; sendrecv_wait makes stream wait for that event.
    cudaEvent_t exchanged[COMM_P2P_MAX];
    int next_handle;
    Watch watch;       // bounds the exchanges in flight (sendrecv_start)
    double *scratch;   // (COMM_HOST_MAX) device, for host all-reduces and the barrier
    // (COMM_HOST_MAX) pinned host memory: the copies of a host all-reduce stay asynchronous, so
    // a peer that never joins is seen by nccl_wait's deadline instead of blocking a copy from
    // pageable memory (which waits for the stream) forever.
    double *pinned;
    Comm *boot;        // the MPI comm that carried the unique id, or NULL
} NcclCtx;

static ncclDataType_t nccl_type(DType t) {
    switch (t) {
    case DTYPE_BF16:
        return ncclBfloat16;
    case DTYPE_F16:
        return ncclFloat16;
    case DTYPE_F64:
        return ncclFloat64;
    default:
        return ncclFloat32;
    }
}

// Ends this rank after a failed or timed-out collective: MPI_Abort ends the whole job when MPI
// carried the bootstrap; otherwise the process leaves at once with _exit. Neither
// ncclCommAbort nor exit()'s CUDA teardown runs: both can wait for an NCCL kernel that spins
// on a dead peer, which is the hang this exit exists to end (the driver frees the GPU).
static void nccl_abort(Comm *c) {
    NcclCtx *x = c->ctx;
    fflush(stdout);
    fflush(stderr);
    if (x->boot && x->boot->abort) x->boot->abort(x->boot);
    _exit(EXIT_RUNTIME);
}

static void fail_async(Comm *c, ncclResult_t r, const char *what) {
    NcclCtx *x = c->ctx;
    fprintf(stderr,
            "error: rank %d of %d: NCCL %s failed: %s (%s): a peer rank died or its "
            "network failed\n",
            c->rank, c->world, what, ncclGetErrorString(r), ncclGetLastError(x->nccl));
    fflush(stderr);
    nccl_abort(c);
}

// Polls communicator nccl (c's own, or one c is making) until its last call has been queued
// (non-blocking NCCL returns ncclInProgress until then), bounded by c's timeout.
static void wait_comm(Comm *c, ncclComm_t nccl, ncclResult_t r, const char *what) {
    const double deadline = now_seconds() + c->timeout_s;
    while (r == ncclInProgress) {
        if (now_seconds() > deadline) comm_fail_timeout(c, what);
        nanosleep(&(struct timespec){0, POLL_SLEEP_NS}, NULL);
        ncclCommGetAsyncError(nccl, &r);
    }
    if (r != ncclSuccess) fail_async(c, r, what);
}

static void wait_queued(Comm *c, ncclResult_t r, const char *what) {
    wait_comm(c, ((NcclCtx *)c->ctx)->nccl, r, what);
}

static int equal_counts(const Comm *c, const size_t *counts) {
    for (int r = 1; r < c->world; r++)
        if (counts[r] != counts[0]) return 0;
    return 1;
}

static size_t offset_of(const size_t *counts, int r) {
    size_t off = 0;
    for (int i = 0; i < r; i++)
        off += counts[i];
    return off;
}

static void nccl_allreduce(Comm *c, void *buf, size_t count, DType t) {
    NcclCtx *x = c->ctx;
    wait_queued(c, ncclAllReduce(buf, buf, count, nccl_type(t), ncclSum, x->nccl, x->stream),
                "all-reduce");
}

// One group of in-place reductions over consecutive parts of buf (parts[r] elements each, from
// buf on), part r to rank r, queued on `stream`.
static void grouped_reduce(Comm *c, void *buf, const size_t *parts, DType t, cudaStream_t stream,
                           const char *what) {
    NcclCtx *x = c->ctx;
    const size_t es = dtype_size(t);
    char *part = buf;
    ncclGroupStart();
    for (int r = 0; r < c->world; r++) {
        if (parts[r]) ncclReduce(part, part, parts[r], nccl_type(t), ncclSum, r, x->nccl, stream);
        part += parts[r] * es;
    }
    wait_queued(c, ncclGroupEnd(), what);
}

// Reduce-scatter and all-gather over equal segments (counts[r] all alike): NCCL's in-place
// collective between buf and this rank's segment. Returns 0, queueing nothing, when the
// segments differ (the last shard shorter), for the caller's grouped form.
static int equal_segments(Comm *c, void *buf, const size_t *counts, DType t, int gather) {
    if (!equal_counts(c, counts)) return 0;
    NcclCtx *x = c->ctx;
    char *own = (char *)buf + (size_t)c->rank * counts[0] * dtype_size(t);
    const ncclResult_t r =
        gather ? ncclAllGather(own, buf, counts[0], nccl_type(t), x->nccl, x->stream)
               : ncclReduceScatter(buf, own, counts[0], nccl_type(t), ncclSum, x->nccl, x->stream);
    wait_queued(c, r, gather ? "all-gather" : "reduce-scatter");
    return 1;
}

// Equal segments through equal_segments; unequal ones as a group of reductions, one to each
// segment's owner.
static void nccl_reduce_scatter(Comm *c, void *buf, const size_t *counts, DType t) {
    if (!equal_segments(c, buf, counts, t, 0))
        grouped_reduce(c, buf, counts, t, ((NcclCtx *)c->ctx)->stream, "reduce-scatter");
}

static void cuda_ok(const Comm *c, cudaError_t e, const char *what) {
    if (e != cudaSuccess)
        fatal(EXIT_RUNTIME, "rank %d: %s: %s", c->rank, what, cudaGetErrorString(e));
}

// What is queued on the side stream from now on runs after the work queued so far on the
// comm's stream; the next wait() waits for it.
static void side_after_stream(Comm *c) {
    NcclCtx *x = c->ctx;
    cuda_ok(c, cudaEventRecord(x->ready, x->stream), "cudaEventRecord");
    cuda_ok(c, cudaStreamWaitEvent(x->side, x->ready, 0), "cudaStreamWaitEvent");
    x->side_busy = 1;
}

// The range's part in each segment is reduced to that segment's owner on the side stream, once
// the work queued so far on the comm's stream (the backward that wrote the range) is done.
static void nccl_reduce_scatter_start(Comm *c, void *buf, size_t offset, size_t count,
                                      const size_t *counts, DType t) {
    NcclCtx *x = c->ctx;
    size_t *parts = xmalloc((size_t)c->world * sizeof(size_t));  // (world)
    comm_range_parts(offset, count, counts, c->world, parts);
    side_after_stream(c);
    grouped_reduce(c, (char *)buf + offset * dtype_size(t), parts, t, x->side,
                   "gradient bucket reduce-scatter");
    free(parts);
}

static void *watch_main(void *arg) {
    Comm *c = arg;
    NcclCtx *x = c->ctx;
    Watch *w = &x->watch;
    cudaSetDevice(w->device);
    pthread_mutex_lock(&w->mu);
    while (!w->stop) {
        const double now = now_seconds();
        for (int i = 0; i < COMM_P2P_MAX; i++) {
            if (w->since[i] == 0) continue;
            const cudaError_t e = cudaEventQuery(x->exchanged[i]);
            if (e == cudaSuccess) w->since[i] = 0;
            else if (e != cudaErrorNotReady) cuda_ok(c, e, "watching a ring send/receive");
            else if (now > w->since[i] + c->timeout_s)
                comm_fail_timeout(c, "a ring send/receive (NCCL)");
        }
        ncclResult_t r;
        ncclCommGetAsyncError(x->nccl, &r);
        if (r != ncclSuccess && r != ncclInProgress) fail_async(c, r, "ring send/receive");
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += WATCH_PERIOD_NS;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&w->cv, &w->mu, &until);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

// Records exchange `handle`'s event behind it on the side stream and puts it under watch.
static void watch_exchange(Comm *c, int handle) {
    NcclCtx *x = c->ctx;
    Watch *w = &x->watch;
    const int slot = handle % COMM_P2P_MAX;
    if (!w->running) {
        cuda_ok(c, cudaGetDevice(&w->device), "cudaGetDevice");
        if (pthread_create(&w->thread, NULL, watch_main, c) != 0)
            fatal(EXIT_RUNTIME, "rank %d: cannot start the thread that watches the ring's "
                                "exchanges", c->rank);
        w->running = 1;
    }
    pthread_mutex_lock(&w->mu);
    cuda_ok(c, cudaEventRecord(x->exchanged[slot], x->side), "cudaEventRecord");
    if (w->since[slot] == 0) w->since[slot] = now_seconds();
    pthread_mutex_unlock(&w->mu);
}

static void watch_stop(NcclCtx *x) {
    Watch *w = &x->watch;
    if (w->running) {
        pthread_mutex_lock(&w->mu);
        w->stop = 1;
        pthread_cond_signal(&w->cv);
        pthread_mutex_unlock(&w->mu);
        pthread_join(w->thread, NULL);
    }
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
}

// Context parallelism's exchange, on the side stream behind the work queued so far (the
// kernels that wrote send, and those still reading the buffer recv replaces). The send and
// the receive form one group, so NCCL progresses both together: a ring in which every rank
// sends to one peer and receives from another cannot deadlock. Exchanges run one after the
// other on side, in the order started, which is the same on every rank.
static int nccl_sendrecv_start(Comm *c, const void *send, size_t send_bytes, int dst, void *recv,
                               size_t recv_bytes, int src) {
    NcclCtx *x = c->ctx;
    const int handle = x->next_handle++;
    side_after_stream(c);
    ncclGroupStart();
    if (send) ncclSend(send, send_bytes, ncclUint8, dst, x->nccl, x->side);
    if (recv) ncclRecv(recv, recv_bytes, ncclUint8, src, x->nccl, x->side);
    wait_queued(c, ncclGroupEnd(), "ring send/receive");
    watch_exchange(c, handle);
    return handle;
}

// A stream dependency, not a host wait: the work queued on the comm's stream from now on runs
// once the exchange is done.
static void nccl_sendrecv_wait(Comm *c, int handle) {
    NcclCtx *x = c->ctx;
    cuda_ok(c, cudaStreamWaitEvent(x->stream, x->exchanged[handle % COMM_P2P_MAX], 0),
            "cudaStreamWaitEvent");
}

static Comm *nccl_wrap(ncclComm_t nccl, int rank, int world, cudaStream_t stream, Comm *boot,
                       double timeout_s);

// The group: ncclCommSplit (non-blocking like its parent, so its completion is polled against
// the deadline), on the same stream.
static Comm *nccl_split(Comm *c, int color, int key, char *err, size_t errlen) {
    NcclCtx *x = c->ctx;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t sub = NULL;
    ncclResult_t r = ncclCommSplit(x->nccl, color, key, &sub, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
        set_error(err, errlen, "rank %d: ncclCommSplit: %s", c->rank, ncclGetErrorString(r));
        return NULL;
    }
    wait_comm(c, sub, r, "the split into groups (NCCL)");
    int rank = 0, world = 0;
    ncclCommUserRank(sub, &rank);
    ncclCommCount(sub, &world);
    return nccl_wrap(sub, rank, world, x->stream, NULL, c->timeout_s);
}

// Equal segments through equal_segments; unequal ones as a group of broadcasts, each segment
// from its owner.
static void nccl_allgather(Comm *c, void *buf, const size_t *counts, DType t) {
    if (equal_segments(c, buf, counts, t, 1)) return;
    NcclCtx *x = c->ctx;
    ncclGroupStart();
    for (int r = 0; r < c->world; r++) {
        char *seg = (char *)buf + offset_of(counts, r) * dtype_size(t);
        ncclBroadcast(seg, seg, counts[r], nccl_type(t), r, x->nccl, x->stream);
    }
    wait_queued(c, ncclGroupEnd(), "all-gather");
}

static void nccl_broadcast(Comm *c, void *buf, size_t bytes, int root) {
    NcclCtx *x = c->ctx;
    wait_queued(c, ncclBroadcast(buf, buf, bytes, ncclUint8, root, x->nccl, x->stream),
                "broadcast");
}

// Waits for everything queued on the stream, watching NCCL's error state and the deadline.
static void nccl_wait(Comm *c) {
    NcclCtx *x = c->ctx;
    const double deadline = now_seconds() + c->timeout_s;
    if (x->side_busy) {
        cuda_ok(c, cudaEventRecord(x->side_done, x->side), "cudaEventRecord");
        cuda_ok(c, cudaStreamWaitEvent(x->stream, x->side_done, 0), "cudaStreamWaitEvent");
        x->side_busy = 0;
    }
    cuda_ok(c, cudaEventRecord(x->done, x->stream), "cudaEventRecord");
    for (;;) {
        const cudaError_t e = cudaEventQuery(x->done);
        if (e == cudaSuccess) return;
        if (e != cudaErrorNotReady) cuda_ok(c, e, "waiting for a collective");
        ncclResult_t r;
        ncclCommGetAsyncError(x->nccl, &r);
        if (r != ncclSuccess && r != ncclInProgress) fail_async(c, r, "collective");
        if (now_seconds() > deadline) comm_fail_timeout(c, "a collective (NCCL)");
        nanosleep(&(struct timespec){0, POLL_SLEEP_NS}, NULL);
    }
}

static void nccl_barrier(Comm *c) {
    NcclCtx *x = c->ctx;
    nccl_allreduce(c, x->scratch, 1, DTYPE_F64);
    nccl_wait(c);
}

static void nccl_allreduce_host(Comm *c, double *buf, size_t count) {
    NcclCtx *x = c->ctx;
    CHECK(count <= COMM_HOST_MAX);
    const size_t bytes = count * sizeof(double);
    memcpy(x->pinned, buf, bytes);
    cuda_ok(c, cudaMemcpyAsync(x->scratch, x->pinned, bytes, cudaMemcpyHostToDevice, x->stream),
            "cudaMemcpyAsync");
    nccl_allreduce(c, x->scratch, count, DTYPE_F64);
    cuda_ok(c, cudaMemcpyAsync(x->pinned, x->scratch, bytes, cudaMemcpyDeviceToHost, x->stream),
            "cudaMemcpyAsync");
    nccl_wait(c);
    memcpy(buf, x->pinned, bytes);
}

static void nccl_destroy(Comm *c) {
    NcclCtx *x = c->ctx;
    nccl_wait(c);
    watch_stop(x);
    wait_queued(c, ncclCommFinalize(x->nccl), "finalize");
    ncclCommDestroy(x->nccl);
    cudaEventDestroy(x->done);
    cudaEventDestroy(x->ready);
    cudaEventDestroy(x->side_done);
    for (int i = 0; i < COMM_P2P_MAX; i++) cudaEventDestroy(x->exchanged[i]);
    cudaStreamDestroy(x->side);
    cudaFree(x->scratch);
    cudaFreeHost(x->pinned);
    comm_close(x->boot);
    free(x);
    free(c);
}

int comm_nccl_unique_id(void *id, char *err, size_t errlen) {
    ncclUniqueId u;
    const ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess)
        return set_error(err, errlen,
                         "ncclGetUniqueId: %s (no usable network interface? set "
                         "NCCL_SOCKET_IFNAME)",
                         ncclGetErrorString(r));
    CHECK(sizeof u == 128);
    memcpy(id, &u, sizeof u);
    return 0;
}

// The Comm over an initialised NCCL communicator: its events, side stream and scratch.
static Comm *nccl_wrap(ncclComm_t nccl, int rank, int world, cudaStream_t stream, Comm *boot,
                       double timeout_s) {
    NcclCtx *x = xcalloc(1, sizeof *x);
    x->nccl = nccl;
    x->stream = stream;
    x->boot = boot;
    pthread_mutex_init(&x->watch.mu, NULL);
    pthread_cond_init(&x->watch.cv, NULL);
    Comm *c = xcalloc(1, sizeof *c);
    *c = (Comm){.name = "nccl",
                .rank = rank,
                .world = world,
                .timeout_s = timeout_s,
                .ctx = x,
                .allreduce_sum = nccl_allreduce,
                .reduce_scatter_sum = nccl_reduce_scatter,
                .reduce_scatter_start = nccl_reduce_scatter_start,
                .allgather = nccl_allgather,
                .broadcast = nccl_broadcast,
                .barrier = nccl_barrier,
                .allreduce_host_f64 = nccl_allreduce_host,
                .wait = nccl_wait,
                .sendrecv_start = nccl_sendrecv_start,
                .sendrecv_wait = nccl_sendrecv_wait,
                .split = nccl_split,
                .destroy = nccl_destroy,
                .abort = nccl_abort};
    int events_ok = 1;
    for (int i = 0; i < COMM_P2P_MAX; i++)
        events_ok &=
            cudaEventCreateWithFlags(&x->exchanged[i], cudaEventDisableTiming) == cudaSuccess;
    if (!events_ok || cudaEventCreateWithFlags(&x->done, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(&x->ready, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(&x->side_done, cudaEventDisableTiming) != cudaSuccess ||
        cudaStreamCreateWithFlags(&x->side, cudaStreamNonBlocking) != cudaSuccess ||
        cudaMalloc((void **)&x->scratch, COMM_HOST_MAX * sizeof(double)) != cudaSuccess ||
        cudaMallocHost((void **)&x->pinned, COMM_HOST_MAX * sizeof(double)) != cudaSuccess)
        fatal(EXIT_RUNTIME, "rank %d: cannot create the NCCL communicator's CUDA events, side "
                            "stream and scratch buffers",
              rank);
    return c;
}

Comm *comm_nccl_create(const LaunchInfo *li, const void *unique_id, void *cuda_stream, Comm *boot,
                       double timeout_s, char *err, size_t errlen) {
    // NVLink SHARP (NVLS multicast) stays off unless the user sets the variable (the launch
    // scripts set it to 0 as well).
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    ncclUniqueId u;
    memcpy(&u, unique_id, sizeof u);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t nccl = NULL;
    ncclResult_t r = ncclCommInitRankConfig(&nccl, li->world, u, li->rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
        set_error(err, errlen, "rank %d: ncclCommInitRankConfig: %s", li->rank,
                  ncclGetErrorString(r));
        return NULL;
    }
    Comm *c = nccl_wrap(nccl, li->rank, li->world, (cudaStream_t)cuda_stream, boot, timeout_s);
    wait_queued(c, r, "NCCL initialisation (every rank must reach it)");
    return c;
}
