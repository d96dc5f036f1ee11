// comm_mpi: the communicator over MPI_COMM_WORLD (or a group of it made by split) for host
// buffers (the CPU backend). Every collective is non-blocking and polled against the deadline,
// so a dead or hung peer ends the job through MPI_Abort after the timeout instead of blocking
// this rank forever. Gradient buckets (reduce_scatter_start) and point-to-point exchanges
// (sendrecv_start) stay in flight until wait() (an exchange alone: sendrecv_wait), advanced by
// every later start.
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/check.h"
#include "common/timer.h"
#include "dist/comm.h"

// Polls spin this many times before sleeping between tests: collectives that finish at once
// cost no sleep, waits on a slower rank cost a core little.
enum { SPIN_POLLS = 1000 };
#define POLL_SLEEP_NS 50000L

// A started reduce-scatter of one range (reduce_scatter_start), finished by mpi_wait.
typedef struct {
    MPI_Request req;
    int *parts;   // (world) the range's part in each rank's segment; MPI reads it until the end
    void *recv;   // this rank's part of the sum
    void *dst;    // where it belongs in the caller's buffer
    size_t bytes;
} Started;

// Messages larger than this go as several (MPI counts are ints); between two ranks they keep
// their order, so the pieces reassemble.
#define P2P_PIECE ((size_t)1 << 30)

typedef struct {
    MPI_Comm comm;  // MPI_COMM_WORLD, or a group of it this comm frees (split)
    int finalize;  // this comm initialised MPI and finalizes it
    void *tmp;     // reduce-scatter receive buffer
    size_t tmp_bytes;
    int *icounts, *displs;  // (world) counts and offsets of the last segment layout
    Started *started;       // (n_started) in the order they were started
    int n_started, cap_started;
    MPI_Request *p2p;       // (n_p2p) point-to-point sends and receives in flight
    int *p2p_handle;        // (n_p2p) the exchange (sendrecv_start's handle) of each
    int n_p2p, cap_p2p;
    int next_handle;        // the handle of the next exchange
} MpiCtx;

static MPI_Datatype mpi_type(DType t) {
    if (t == DTYPE_F32) return MPI_FLOAT;
    if (t == DTYPE_F64) return MPI_DOUBLE;
    fatal(EXIT_RUNTIME,
          "the MPI communicator carries fp32 and fp64 only (host buffers of the CPU "
          "backend), not 16-bit floats");
}

static int to_int(size_t n) {
    if (n > INT_MAX)
        fatal(EXIT_RUNTIME, "MPI collective of %zu elements: more than MPI's int count allows", n);
    return (int)n;
}

static Comm *wrap(MPI_Comm comm, int finalize, double timeout_s);

static void mpi_abort(Comm *c) {
    MPI_Abort(MPI_COMM_WORLD, EXIT_RUNTIME);
    exit(EXIT_RUNTIME);
}

// Waits for req, bounded by the comm's timeout.
static void wait_bounded(Comm *c, MPI_Request *req, const char *what) {
    const double deadline = now_seconds() + c->timeout_s;
    for (long polls = 0;; polls++) {
        int done = 0;
        MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (done) return;
        if (now_seconds() > deadline) comm_fail_timeout(c, what);
        if (polls >= SPIN_POLLS) nanosleep(&(struct timespec){0, POLL_SLEEP_NS}, NULL);
    }
}

// The int counts and displacements MPI wants for a segment layout.
static void set_layout(Comm *c, const size_t *counts) {
    MpiCtx *x = c->ctx;
    size_t off = 0;
    for (int r = 0; r < c->world; r++) {
        x->icounts[r] = to_int(counts[r]);
        x->displs[r] = to_int(off);
        off += counts[r];
    }
}

static void mpi_allreduce(Comm *c, void *buf, size_t count, DType t) {
    MpiCtx *x = c->ctx;
    MPI_Request req;
    MPI_Iallreduce(MPI_IN_PLACE, buf, to_int(count), mpi_type(t), MPI_SUM, x->comm, &req);
    wait_bounded(c, &req, "all-reduce");
}

static void mpi_reduce_scatter(Comm *c, void *buf, const size_t *counts, DType t) {
    MpiCtx *x = c->ctx;
    set_layout(c, counts);
    const size_t es = dtype_size(t), mine = counts[c->rank] * es;
    if (x->tmp_bytes < mine) x->tmp = xrealloc(x->tmp, x->tmp_bytes = mine);
    MPI_Request req;
    MPI_Ireduce_scatter(buf, x->tmp, x->icounts, mpi_type(t), MPI_SUM, x->comm, &req);
    wait_bounded(c, &req, "reduce-scatter");
    memcpy((char *)buf + (size_t)x->displs[c->rank] * es, x->tmp, mine);
}

// Lets MPI move the started reductions on: without a progress thread, a non-blocking
// collective advances only inside MPI calls.
static void progress_started(MpiCtx *x) {
    for (int i = 0; i < x->n_started; i++) {
        int done;
        MPI_Test(&x->started[i].req, &done, MPI_STATUS_IGNORE);
    }
}

static void mpi_reduce_scatter_start(Comm *c, void *buf, size_t offset, size_t count,
                                     const size_t *counts, DType t) {
    MpiCtx *x = c->ctx;
    if (x->n_started == x->cap_started) {
        x->cap_started = x->cap_started ? 2 * x->cap_started : 16;
        x->started = xrealloc(x->started, (size_t)x->cap_started * sizeof(Started));
    }
    size_t *parts = xmalloc((size_t)c->world * sizeof(size_t));  // (world)
    comm_range_parts(offset, count, counts, c->world, parts);
    const size_t es = dtype_size(t);
    size_t mine = 0;   // where this rank's part starts in the range
    for (int r = 0; r < c->rank; r++)
        mine += parts[r];
    Started *s = &x->started[x->n_started++];
    s->parts = xmalloc((size_t)c->world * sizeof(int));
    for (int r = 0; r < c->world; r++)
        s->parts[r] = to_int(parts[r]);
    s->bytes = parts[c->rank] * es;
    s->recv = xmalloc(s->bytes ? s->bytes : 1);
    s->dst = (char *)buf + (offset + mine) * es;
    free(parts);
    MPI_Ireduce_scatter((char *)buf + offset * es, s->recv, s->parts, mpi_type(t), MPI_SUM,
                        x->comm, &s->req);
    progress_started(x);
}

static void mpi_allgather(Comm *c, void *buf, const size_t *counts, DType t) {
    MpiCtx *x = c->ctx;
    set_layout(c, counts);
    MPI_Request req;
    MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, x->icounts, x->displs, mpi_type(t),
                    x->comm, &req);
    wait_bounded(c, &req, "all-gather");
}

static void mpi_broadcast(Comm *c, void *buf, size_t bytes, int root) {
    MpiCtx *x = c->ctx;
    MPI_Request req;
    MPI_Ibcast(buf, to_int(bytes), MPI_BYTE, root, x->comm, &req);
    wait_bounded(c, &req, "broadcast");
}

static void mpi_barrier(Comm *c) {
    MpiCtx *x = c->ctx;
    MPI_Request req;
    MPI_Ibarrier(x->comm, &req);
    wait_bounded(c, &req, "barrier");
}

static void mpi_allreduce_host(Comm *c, double *buf, size_t count) {
    mpi_allreduce(c, buf, count, DTYPE_F64);
}

static MPI_Request *p2p_slot(MpiCtx *x, int handle) {
    if (x->n_p2p == x->cap_p2p) {
        x->cap_p2p = x->cap_p2p ? 2 * x->cap_p2p : 16;
        x->p2p = xrealloc(x->p2p, (size_t)x->cap_p2p * sizeof(MPI_Request));
        x->p2p_handle = xrealloc(x->p2p_handle, (size_t)x->cap_p2p * sizeof(int));
    }
    x->p2p_handle[x->n_p2p] = handle;
    return &x->p2p[x->n_p2p++];
}

// Posts one direction of exchange `handle`: bytes of buf to or from rank peer, in pieces.
static void post_p2p(MpiCtx *x, int handle, const void *buf, size_t bytes, int peer, int is_recv) {
    size_t off = 0;
    do {
        const int n = to_int(bytes - off < P2P_PIECE ? bytes - off : P2P_PIECE);
        if (is_recv)
            MPI_Irecv((char *)buf + off, n, MPI_BYTE, peer, 0, x->comm, p2p_slot(x, handle));
        else
            MPI_Isend((const char *)buf + off, n, MPI_BYTE, peer, 0, x->comm,
                      p2p_slot(x, handle));
        off += (size_t)n;
    } while (off < bytes);
}

static int mpi_sendrecv_start(Comm *c, const void *send, size_t send_bytes, int dst, void *recv,
                              size_t recv_bytes, int src) {
    MpiCtx *x = c->ctx;
    const int handle = x->next_handle++;
    // The receive is posted first, so a rank exchanging with itself cannot stall.
    if (recv) post_p2p(x, handle, recv, recv_bytes, src, 1);
    if (send) post_p2p(x, handle, send, send_bytes, dst, 0);
    progress_started(x);
    return handle;
}

// MPI_Wait (bounded) on the requests of exchange `handle` alone; once none is left in flight,
// the list starts over.
static void mpi_sendrecv_wait(Comm *c, int handle) {
    MpiCtx *x = c->ctx;
    int left = 0;
    for (int i = 0; i < x->n_p2p; i++) {
        if (x->p2p_handle[i] == handle) wait_bounded(c, &x->p2p[i], "ring send/receive");
        left += x->p2p[i] != MPI_REQUEST_NULL;
    }
    if (!left) x->n_p2p = 0;
}

// Finishes the started reductions in their order and stores each rank's parts, then the
// point-to-point exchanges.
static void mpi_wait(Comm *c) {
    MpiCtx *x = c->ctx;
    for (int i = 0; i < x->n_started; i++) {
        Started *s = &x->started[i];
        wait_bounded(c, &s->req, "gradient bucket reduce-scatter");
        memcpy(s->dst, s->recv, s->bytes);
        free(s->recv);
        free(s->parts);
    }
    x->n_started = 0;
    for (int i = 0; i < x->n_p2p; i++) wait_bounded(c, &x->p2p[i], "ring send/receive");
    x->n_p2p = 0;
}

static void mpi_destroy(Comm *c) {
    MpiCtx *x = c->ctx;
    mpi_wait(c);   // before MPI_Finalize: nothing may be in flight once MPI is gone
    if (x->comm != MPI_COMM_WORLD) MPI_Comm_free(&x->comm);
    if (x->finalize) MPI_Finalize();
    free(x->p2p);
    free(x->p2p_handle);
    free(x->started);
    free(x->tmp);
    free(x->icounts);
    free(x->displs);
    free(x);
    free(c);
}

Comm *comm_mpi_create(const LaunchInfo *li, double timeout_s, char *err, size_t errlen) {
    int inited = 0, provided, rank, world;
    MPI_Initialized(&inited);
    if (!inited) MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (rank != li->rank || world != li->world) {
        if (!inited) MPI_Finalize();
        set_error(err, errlen,
                  "MPI sees rank %d of %d, the %s environment rank %d of %d: launch with "
                  "Open MPI's mpirun",
                  rank, world, launch_kind_name(li->kind), li->rank, li->world);
        return NULL;
    }
    return wrap(MPI_COMM_WORLD, !inited, timeout_s);
}

static Comm *mpi_split(Comm *c, int color, int key, char *err, size_t errlen) {
    MpiCtx *x = c->ctx;
    MPI_Comm sub;
    if (MPI_Comm_split(x->comm, color, key, &sub) != MPI_SUCCESS) {
        set_error(err, errlen, "MPI_Comm_split (color %d, key %d) failed", color, key);
        return NULL;
    }
    return wrap(sub, 0, c->timeout_s);
}

static Comm *wrap(MPI_Comm comm, int finalize, double timeout_s) {
    int rank, world;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &world);
    MpiCtx *x = xcalloc(1, sizeof *x);
    x->comm = comm;
    x->finalize = finalize;
    x->icounts = xcalloc((size_t)world, sizeof(int));
    x->displs = xcalloc((size_t)world, sizeof(int));
    Comm *c = xcalloc(1, sizeof *c);
    *c = (Comm){.name = "mpi",
                .rank = rank,
                .world = world,
                .timeout_s = timeout_s,
                .ctx = x,
                .allreduce_sum = mpi_allreduce,
                .reduce_scatter_sum = mpi_reduce_scatter,
                .reduce_scatter_start = mpi_reduce_scatter_start,
                .allgather = mpi_allgather,
                .broadcast = mpi_broadcast,
                .barrier = mpi_barrier,
                .allreduce_host_f64 = mpi_allreduce_host,
                .wait = mpi_wait,
                .sendrecv_start = mpi_sendrecv_start,
                .sendrecv_wait = mpi_sendrecv_wait,
                .split = mpi_split,
                .destroy = mpi_destroy,
                .abort = mpi_abort};
    return c;
}
