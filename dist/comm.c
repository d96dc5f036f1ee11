// comm: shard arithmetic, the timeout, the single-process communicator and the choice of
// implementation for a launch.
#include "dist/comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/config.h"
#include "dist/bootstrap_tcp.h"

enum { SHARD_ALIGN = 64 };
#define DEFAULT_TIMEOUT_S 300.0

void comm_range_parts(size_t offset, size_t count, const size_t *counts, int world,
                      size_t *parts) {
    size_t seg = 0;
    for (int r = 0; r < world; r++) {
        const size_t lo = seg > offset ? seg : offset;
        const size_t hi = seg + counts[r] < offset + count ? seg + counts[r] : offset + count;
        parts[r] = lo < hi ? hi - lo : 0;
        seg += counts[r];
    }
}

void comm_shard(size_t n, int world, int rank, size_t *offset, size_t *count, size_t *counts) {
    size_t per = (n + (size_t)world - 1) / (size_t)world;
    per = (per + SHARD_ALIGN - 1) / SHARD_ALIGN * SHARD_ALIGN;
    for (int r = 0; r < world; r++) {
        const size_t lo = (size_t)r * per < n ? (size_t)r * per : n;
        const size_t len = n - lo < per ? n - lo : per;
        if (counts) counts[r] = len;
        if (r == rank) *offset = lo, *count = len;
    }
}

double comm_timeout(double configured) {
    return config_env_override("FLASHGPT_DIST_TIMEOUT", configured, 1e-9, 1e9, "seconds > 0");
}

void comm_fail_timeout(const Comm *c, const char *what) {
    fprintf(stderr,
            "error: rank %d of %d: %s did not complete within %.0f s: another rank died or "
            "hangs (its own log names the cause); raise dist.timeout (or FLASHGPT_DIST_TIMEOUT) if a rank is "
            "only slow (a large checkpoint write)\n",
            c->rank, c->world, what, c->timeout_s);
    fflush(stderr);
    if (c->abort) c->abort((Comm *)c);
    exit(EXIT_RUNTIME);
}

int comm_all_ok(Comm *c, int ok) {
    double v = ok ? 1.0 : 0.0;  // a sum of ranks' 0 or 1 is exact in double
    c->allreduce_host_f64(c, &v, 1);
    return v == (double)c->world;
}

// ---- single process: every collective is the identity ----

static void single_allreduce(Comm *c, void *buf, size_t count, DType t) {}
static void single_segments(Comm *c, void *buf, const size_t *counts, DType t) {}
static void single_range(Comm *c, void *buf, size_t offset, size_t count, const size_t *counts,
                         DType t) {}
static void single_broadcast(Comm *c, void *buf, size_t bytes, int root) {}
static void single_nothing(Comm *c) {}
static void single_allreduce_host(Comm *c, double *buf, size_t count) {}
static void single_destroy(Comm *c) { free(c); }
static int single_sendrecv(Comm *c, const void *send, size_t send_bytes, int dst, void *recv,
                           size_t recv_bytes, int src) {
    CHECK(!send || !recv || send_bytes == recv_bytes);
    if (send && recv) memmove(recv, send, recv_bytes);  // host memory: the CPU backend's
    return 0;
}
static void single_sendrecv_wait(Comm *c, int handle) {}
static Comm *single_split(Comm *c, int color, int key, char *err, size_t errlen) {
    Comm *s = comm_single_create();
    s->timeout_s = c->timeout_s;
    return s;
}

Comm *comm_single_create(void) {
    Comm *c = xcalloc(1, sizeof *c);
    *c = (Comm){.name = "single",
                .rank = 0,
                .world = 1,
                .timeout_s = DEFAULT_TIMEOUT_S,
                .allreduce_sum = single_allreduce,
                .reduce_scatter_sum = single_segments,
                .reduce_scatter_start = single_range,
                .allgather = single_segments,
                .broadcast = single_broadcast,
                .barrier = single_nothing,
                .allreduce_host_f64 = single_allreduce_host,
                .wait = single_nothing,
                .sendrecv_start = single_sendrecv,
                .sendrecv_wait = single_sendrecv_wait,
                .split = single_split,
                .destroy = single_destroy};
    return c;
}

// ---- the implementation for a launch ----

static Comm *open_host(const LaunchInfo *li, double timeout_s, char *err, size_t errlen) {
#ifdef FLASHGPT_MPI
    if (li->kind == LAUNCH_MPIRUN) return comm_mpi_create(li, timeout_s, err, errlen);
    set_error(err, errlen,
              "%d ranks launched by %s on the CPU backend: the CPU backend's "
              "collectives use MPI: launch with mpirun -np %d",
              li->world, launch_kind_name(li->kind), li->world);
#else
    set_error(err, errlen,
              "%d ranks on the CPU backend need MPI, and this build has none (mpicc was "
              "not found when it was built): install libopenmpi-dev and rebuild",
              li->world);
#endif
    return NULL;
}

// Rank 0 alone says it (every rank would say the same): its port is open to any host that can
// reach MASTER_ADDR, and without a token the first to send a rank's hello takes that rank.
int comm_tcp_token_warning(const LaunchInfo *li, char *msg, size_t len) {
    if (li->rank != 0 || li->job_token[0] || tcp_addr_is_loopback(li->master_addr)) return 0;
    snprintf(msg, len,
             "rank 0 of %d: the TCP bootstrap on port %d of %s has no job token (%s gives no "
             "job id): any process that reaches the port first can take a rank's place; set "
             "FLASHGPT_JOB_TOKEN to the same secret on every rank",
             li->world, li->master_port + 1, li->master_addr, launch_kind_name(li->kind));
    return 1;
}

int comm_tcp_bootstrap(const LaunchInfo *li, void *buf, size_t len, double timeout_s, char *err,
                       size_t errlen) {
    if (!li->master_addr[0] || !li->master_port)
        return set_error(err, errlen,
                         "%d ranks launched by %s: NCCL's bootstrap needs MASTER_ADDR and "
                         "MASTER_PORT (rank 0's host and a free port; port + 1 is used "
                         "too) when MPI does not carry it",
                         li->world, launch_kind_name(li->kind));
    char warning[512];
    if (comm_tcp_token_warning(li, warning, sizeof warning)) warnf("%s", warning);
    const TcpBootstrap b = {.addr = li->master_addr,
                            .port = li->master_port + 1,
                            .rank = li->rank,
                            .world = li->world,
                            .token = li->job_token,
                            .timeout_s = timeout_s,
                            .log = stderr};
    return tcp_broadcast(&b, buf, len, err, errlen);
}

#ifdef FLASHGPT_NCCL
enum { NCCL_ID_BYTES = 128 };  // sizeof(ncclUniqueId), fixed by NCCL's ABI

// NCCL's unique id from rank 0 to every rank: through MPI when this is an MPI build launched by
// mpirun (the MPI comm stays open beside NCCL: *boot), else over TCP.
static int share_nccl_id(const LaunchInfo *li, unsigned char *id, double timeout_s, Comm **boot,
                         char *err, size_t errlen) {
    *boot = NULL;
#ifdef FLASHGPT_MPI
    if (li->kind == LAUNCH_MPIRUN) {
        *boot = comm_mpi_create(li, timeout_s, err, errlen);
        if (!*boot) return -1;
        (*boot)->broadcast(*boot, id, NCCL_ID_BYTES, 0);
        return 0;
    }
#endif
    return comm_tcp_bootstrap(li, id, NCCL_ID_BYTES, timeout_s, err, errlen);
}
#endif

static Comm *open_device(const LaunchInfo *li, void *cuda_stream, double timeout_s, char *err,
                         size_t errlen) {
#ifdef FLASHGPT_NCCL
    unsigned char id[NCCL_ID_BYTES];
    memset(id, 0, sizeof id);
    if (li->rank == 0 && comm_nccl_unique_id(id, err, errlen) != 0) return NULL;
    Comm *boot;
    if (share_nccl_id(li, id, timeout_s, &boot, err, errlen) != 0) return NULL;
    Comm *c = comm_nccl_create(li, id, cuda_stream, boot, timeout_s, err, errlen);
    if (!c) comm_close(boot);
    return c;
#else
    set_error(err, errlen, "%d ranks on the GPU need NCCL, and this build has no CUDA", li->world);
    return NULL;
#endif
}

Comm *comm_open(const LaunchInfo *li, Device mem, void *cuda_stream, double timeout_s,
                char *err, size_t errlen) {
    if (li->world == 1) return comm_single_create();
    return mem == DEVICE_CPU ? open_host(li, timeout_s, err, errlen)
                            : open_device(li, cuda_stream, timeout_s, err, errlen);
}

void comm_close(Comm *c) {
    if (c) c->destroy(c);
}
