// comm: the collectives data parallelism needs, behind one interface with three
// implementations: single process (world 1, nothing to do), MPI (host buffers, the CPU backend;
// built when mpicc is found) and NCCL (device buffers on the CUDA backend's stream; built with
// CUDA). A rank that died or hangs never makes the others wait forever: every wait is bounded by
// the comm's timeout (dist.timeout seconds, default 300, or FLASHGPT_DIST_TIMEOUT), after which
// the process prints which operation timed out and exits with EXIT_RUNTIME (MPI: MPI_Abort ends
// the job).
#pragma once
#include <stddef.h>

#include "common/dtype.h"
#include "dist/launch.h"

enum { COMM_HOST_MAX = 16 };  // doubles per allreduce_host_f64 call
enum { COMM_P2P_MAX = 8 };    // point-to-point exchanges in flight (sendrecv_start)

typedef struct Comm Comm;
struct Comm {
    const char *name;  // "single", "mpi" or "nccl"
    int rank, world;
    double timeout_s;
    void *ctx;  // implementation state

    // buf (count) becomes the element-wise sum over ranks, in place.
    void (*allreduce_sum)(Comm *c, void *buf, size_t count, DType t);
    // buf (n = sum of counts) holds each rank's full vector; afterwards rank r's segment
    // [offset_r, offset_r + counts[r]) holds the sum over ranks (the rest is undefined).
    void (*reduce_scatter_sum)(Comm *c, void *buf, const size_t *counts, DType t);
    // Starts reduce_scatter_sum over the elements [offset, offset + count) of buf alone (the
    // same flat vector and segments counts as above), without waiting: once wait() returns,
    // the part of rank r's segment inside that range holds the sum over ranks. Data
    // parallelism starts one range per gradient bucket while backward still writes the rest of
    // buf (below offset); every rank starts the same ranges in the same order. MPI: a
    // non-blocking reduce-scatter of the range; NCCL: the reduction of each segment's part to
    // its owner, on a side stream that first waits for the work queued so far on the comm's
    // stream, and that wait() joins back into it. The summation order depends on the ranges
    // and the library's algorithms, never on timing (2 ranks: one addition per element, the
    // same as reduce_scatter_sum's). The range of buf stays unchanged until wait().
    void (*reduce_scatter_start)(Comm *c, void *buf, size_t offset, size_t count,
                                 const size_t *counts, DType t);
    // In place: rank r's segment of buf (counts as above) is copied into every rank's buf.
    void (*allgather)(Comm *c, void *buf, const size_t *counts, DType t);
    // bytes of buf from rank `root` to every rank.
    void (*broadcast)(Comm *c, void *buf, size_t bytes, int root);
    void (*barrier)(Comm *c);
    // buf (count <= COMM_HOST_MAX) of HOST doubles becomes the sum over ranks, for every
    // implementation (NCCL goes through a device scratch): global losses, norms, agreements.
    void (*allreduce_host_f64)(Comm *c, double *buf, size_t count);
    // Waits until every queued collective has finished (NCCL queues them on its stream; host
    // implementations finish each call before returning, except reduce_scatter_start's),
    // bounded by the timeout.
    void (*wait)(Comm *c);
    // Point-to-point: starts sending send_bytes of send to rank dst and receiving recv_bytes from
    // rank src into recv (ranks of this comm, buffers in the comm's memory, untouched until the
    // exchange is waited for; src sends as many as are received); a NULL send or recv leaves
    // that half out, not both. Several may be
    // in flight; between two ranks they arrive in the order they were started, and every rank
    // starts its exchanges in the same order as its peers (the pairing needs nothing else).
    // Returns the exchange's handle for sendrecv_wait. Context parallelism's ring. NCCL: one
    // group (the send and the receive together) on a side stream that first waits for the work
    // queued so far on the comm's stream.
    int (*sendrecv_start)(Comm *c, const void *send, size_t send_bytes, int dst, void *recv,
                          size_t recv_bytes, int src);
    // Exchange `handle` alone is done for the work queued after this call: host implementations
    // finish it (bounded by the timeout); NCCL makes the comm's stream wait for it (an event
    // recorded behind it on the side stream) without blocking the host; a watch thread ends the
    // rank when an exchange stays unfinished past the timeout. At most COMM_P2P_MAX exchanges are in flight unwaited
    // (NCCL: an older handle then waits for later exchanges too). wait() finishes every one.
    void (*sendrecv_wait)(Comm *c, int handle);
    // A new comm over the ranks of this one that pass the same color, ranked by key (ties by
    // rank), with this comm's timeout: the context-parallel groups. Every rank must call it; it
    // is not bounded by the timeout (MPI has no non-blocking split). Close it before this comm.
    // Returns NULL with err set when it fails. NULL (the member) = none: the single comm.
    Comm *(*split)(Comm *c, int color, int key, char *err, size_t errlen);
    void (*destroy)(Comm *c);
    // Ends every rank of the job after a fatal error (MPI_Abort); NULL: exit this process only.
    void (*abort)(Comm *c);
};

// 1 on every rank when every rank passed ok != 0, else 0: how ranks agree that all of them
// wrote their part of a checkpoint (a collective call).
int comm_all_ok(Comm *c, int ok);

// Rank r's contiguous shard [*offset, *offset + *count) of a flat vector of n elements: shards
// are ceil(n / world) rounded up to a multiple of 64 elements (aligned vector loads), so the
// last ones may be shorter or empty. counts (world) may be NULL; else it receives every count.
void comm_shard(size_t n, int world, int rank, size_t *offset, size_t *count, size_t *counts);

// The parts (world) of the range [offset, offset + count) of a flat vector inside each rank's
// segment (segments of counts, in rank order): they tile the range, some may be 0.
void comm_range_parts(size_t offset, size_t count, const size_t *counts, int world,
                      size_t *parts);

// The communicator for this launch. World size 1 gives the single-process comm. Otherwise
// DEVICE_CPU needs an MPI build launched by mpirun; DEVICE_CUDA needs CUDA (NCCL, on
// cuda_stream, a cudaStream_t, with device li->local_rank already current), and gets NCCL's
// unique id through MPI when built with it and launched by mpirun, else over TCP from rank 0
// (dist/bootstrap_tcp.h). Returns NULL with err set when this launch cannot be served.
// timeout_s: how long any rank waits for the others (comm_timeout).
Comm *comm_open(const LaunchInfo *li, Device mem, void *cuda_stream, double timeout_s,
                char *err, size_t errlen);
void comm_close(Comm *c);  // NULL is fine

// The timeout in seconds: FLASHGPT_DIST_TIMEOUT when set (> 0; anything else exits 2 with a
// message), else `configured` (the config's dist.timeout).
double comm_timeout(double configured);
// Prints "rank R of W: <what> did not complete within S s ..." on stderr, then c->abort (when
// set) or exit(EXIT_RUNTIME).
void comm_fail_timeout(const Comm *c, const char *what) __attribute__((noreturn));

// Rank 0's buf (len bytes) into every rank's buf over TCP (dist/bootstrap_tcp.h): rank 0 at
// li's MASTER_ADDR, port MASTER_PORT + 1, every hello proving li's job token; refused
// connections are reported on stderr, and so is comm_tcp_token_warning's warning. Returns 0, or
// -1 with err set (MASTER_ADDR or MASTER_PORT unset, a rank missing, rank 0 unreachable or
// refusing).
int comm_tcp_bootstrap(const LaunchInfo *li, void *buf, size_t len, double timeout_s, char *err,
                       size_t errlen);
// 1 with a warning naming FLASHGPT_JOB_TOKEN in msg (len bytes) when li is rank 0 and no job
// token guards a port that other hosts can reach (MASTER_ADDR not a loopback address); else 0.
int comm_tcp_token_warning(const LaunchInfo *li, char *msg, size_t len);

Comm *comm_single_create(void);
#ifdef FLASHGPT_MPI
// Initialises MPI (once per process) and wraps MPI_COMM_WORLD; the world must match li's.
Comm *comm_mpi_create(const LaunchInfo *li, double timeout_s, char *err, size_t errlen);
#endif
#ifdef FLASHGPT_NCCL
// A new NCCL unique id (128 bytes) on rank 0.
int comm_nccl_unique_id(void *id, char *err, size_t errlen);
// NCCL over li's world on cuda_stream, the unique id already shared by every rank. boot (may be
// NULL) is the MPI comm that carried the id; the NCCL comm closes it when it is closed.
Comm *comm_nccl_create(const LaunchInfo *li, const void *unique_id, void *cuda_stream, Comm *boot,
                       double timeout_s, char *err, size_t errlen);
#endif
