// launch: the process group from torchrun's, Open MPI's or Slurm's environment variables.
#include "dist/launch.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"

typedef struct {
    LaunchKind kind;
    const char *rank, *world, *local_rank;  // variable names
} LaunchVars;

static const LaunchVars LAUNCHERS[] = {
    {LAUNCH_TORCHRUN, "RANK", "WORLD_SIZE", "LOCAL_RANK"},
    {LAUNCH_MPIRUN, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {LAUNCH_SLURM, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
};

// Integer value of environment variable `name` in [lo, hi] into *out; 0 when unset (*out
// untouched), 1 when read, -1 with err set when malformed.
static int env_int(const char *name, int lo, int hi, int *out, char *err, size_t errlen) {
    const char *v = getenv(name);
    if (!v) return 0;
    char *end;
    long x = strtol(v, &end, 10);
    if (*v == '\0' || *end != '\0' || x < lo || x > hi)
        return set_error(err, errlen,
                         "environment variable %s='%s': expected an integer in [%d, %d]", name, v,
                         lo, hi);
    *out = (int)x;
    return 1;
}

const char *launch_kind_name(LaunchKind k) {
    switch (k) {
    case LAUNCH_TORCHRUN:
        return "torchrun";
    case LAUNCH_MPIRUN:
        return "mpirun";
    case LAUNCH_SLURM:
        return "srun";
    default:
        return "single process";
    }
}

static int read_launcher(const LaunchVars *lv, LaunchInfo *li, char *err, size_t errlen) {
    int rank = 0, world = 1, local = 0;
    const int has_rank = env_int(lv->rank, 0, INT_MAX, &rank, err, errlen);
    if (has_rank < 0) return -1;
    const int has_world = env_int(lv->world, 1, INT_MAX, &world, err, errlen);
    if (has_world < 0) return -1;
    if (!has_rank && !has_world) return 0;
    if (!has_rank || !has_world)
        return set_error(err, errlen, "%s is set but %s is not: a %s launch sets both",
                         has_rank ? lv->rank : lv->world, has_rank ? lv->world : lv->rank,
                         launch_kind_name(lv->kind));
    if (rank >= world)
        return set_error(err, errlen, "%s=%d is not below %s=%d", lv->rank, rank, lv->world, world);
    const int has_local = env_int(lv->local_rank, 0, INT_MAX, &local, err, errlen);
    if (has_local < 0) return -1;
    if (!has_local) local = rank;  // one host: the global rank is the local one
    li->kind = lv->kind;
    li->rank = rank;
    li->world = world;
    li->local_rank = local;
    return 1;
}

// FNV-1a: a port every rank of one mpirun job derives alike from the job's name.
static int port_of(const char *job) {
    uint32_t h = 2166136261u;
    for (const char *p = job; *p; p++)
        h = (h ^ (uint8_t)*p) * 16777619u;
    return 20000 + (int)(h % 20000u) * 2;  // even, below 60000: the bootstrap takes port + 1
}

// mpirun on one host (every rank local) needs no MASTER_ADDR: rank 0 is 127.0.0.1, and the port
// comes from the job's identity (Open MPI 5's PMIX_NAMESPACE, 4's jobid), so concurrent jobs
// on one host do not meet. Only a build without MPI uses them (MPI carries NCCL's id otherwise).
static void mpirun_one_host_defaults(LaunchInfo *li) {
    int local_size = 0;
    char ignored[8];
    if (env_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1, INT_MAX, &local_size, ignored, sizeof ignored) <= 0 ||
        local_size != li->world)
        return;
    if (!li->master_addr[0]) snprintf(li->master_addr, sizeof li->master_addr, "127.0.0.1");
    if (!li->master_port) {
        const char *job = getenv("PMIX_NAMESPACE");
        if (!job) job = getenv("OMPI_MCA_ess_base_jobid");
        li->master_port = job ? port_of(job) : 29500;
    }
}

int launch_detect(LaunchInfo *li, char *err, size_t errlen) {
    memset(li, 0, sizeof *li);
    li->kind = LAUNCH_SINGLE;
    li->world = 1;
    for (size_t i = 0; i < sizeof LAUNCHERS / sizeof LAUNCHERS[0]; i++) {
        const int rc = read_launcher(&LAUNCHERS[i], li, err, errlen);
        if (rc < 0) return -1;
        if (rc > 0) break;
    }
    const char *addr = getenv("MASTER_ADDR");
    if (addr) {
        if (strlen(addr) >= sizeof li->master_addr)
            return set_error(err, errlen,
                             "environment variable MASTER_ADDR is longer than %zu bytes",
                             sizeof li->master_addr - 1);
        snprintf(li->master_addr, sizeof li->master_addr, "%s", addr);
    }
    // The TCP bootstrap listens on MASTER_PORT + 1, so the port must leave room for it.
    if (env_int("MASTER_PORT", 1, 65534, &li->master_port, err, errlen) < 0) return -1;
    if (li->kind == LAUNCH_MPIRUN) mpirun_one_host_defaults(li);
    return 0;
}
