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

// The value of environment variable `name` into dst (cap bytes); -1 with err set when it does
// not fit (cut short, it would name another host or another secret).
static int copy_value(char *dst, size_t cap, const char *name, const char *value, char *err,
                      size_t errlen) {
    if (strlen(value) >= cap)
        return set_error(err, errlen, "environment variable %s is longer than %zu bytes", name,
                         cap - 1);
    snprintf(dst, cap, "%s", value);
    return 0;
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

// The name Open MPI gives this job, the same on every rank (5: PMIX_NAMESPACE, 4: its jobid), or
// NULL; *var (may be NULL) names the variable it came from.
static const char *mpirun_job_id(const char **var) {
    static const char *const VARS[] = {"PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid"};
    for (size_t i = 0; i < sizeof VARS / sizeof VARS[0]; i++) {
        const char *v = getenv(VARS[i]);
        if (v && *v) {
            if (var) *var = VARS[i];
            return v;
        }
    }
    return NULL;
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
        const char *job = mpirun_job_id(NULL);
        li->master_port = job ? port_of(job) : 29500;
    }
}

// The launcher's id of this job into out (cap bytes); the variable(s) it came from, or NULL.
// Each launcher's own id only: a torchrun inside a Slurm allocation may run its hosts' agents
// from different srun steps, so SLURM_STEP_ID would differ between its ranks.
static const char *launcher_job_id(LaunchKind kind, char *out, size_t cap) {
    const char *v = NULL, *var = NULL;
    switch (kind) {
    case LAUNCH_TORCHRUN:
        v = getenv("TORCHELASTIC_RUN_ID");
        // torchrun's default --rdzv-id: every job has it, so it tells none apart.
        if (!v || !*v || strcmp(v, "none") == 0) return NULL;
        snprintf(out, cap, "%s", v);
        return "TORCHELASTIC_RUN_ID";
    case LAUNCH_SLURM: {
        v = getenv("SLURM_JOB_ID");
        if (!v || !*v) return NULL;
        const char *step = getenv("SLURM_STEP_ID");
        snprintf(out, cap, "%s.%s", v, step ? step : "");
        return "SLURM_JOB_ID.SLURM_STEP_ID";
    }
    case LAUNCH_MPIRUN:
        v = mpirun_job_id(&var);
        if (!v) return NULL;
        snprintf(out, cap, "%s", v);
        return var;
    default:
        return NULL;
    }
}

// The job token (launch.h): FLASHGPT_JOB_TOKEN wins over the launcher's id.
static int read_job_token(LaunchInfo *li, char *err, size_t errlen) {
    const char *mine = getenv("FLASHGPT_JOB_TOKEN");
    if (mine && *mine) {
        li->job_token_source = "FLASHGPT_JOB_TOKEN";
        return copy_value(li->job_token, sizeof li->job_token, "FLASHGPT_JOB_TOKEN", mine, err,
                          errlen);
    }
    li->job_token_source = launcher_job_id(li->kind, li->job_token, sizeof li->job_token);
    return 0;
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
    if (addr && copy_value(li->master_addr, sizeof li->master_addr, "MASTER_ADDR", addr, err,
                           errlen) != 0)
        return -1;
    // The TCP bootstrap listens on MASTER_PORT + 1, so the port must leave room for it.
    if (env_int("MASTER_PORT", 1, 65534, &li->master_port, err, errlen) < 0) return -1;
    if (li->kind == LAUNCH_MPIRUN) mpirun_one_host_defaults(li);
    return read_job_token(li, err, errlen);
}
