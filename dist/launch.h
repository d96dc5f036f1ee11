// launch: who started this process. torchrun, mpirun (Open MPI) and Slurm's srun describe the
// process group in environment variables; none of them means a single process (world size 1).
#pragma once
#include <stddef.h>

typedef enum {
    LAUNCH_SINGLE = 0,
    LAUNCH_TORCHRUN = 1,
    LAUNCH_MPIRUN = 2,
    LAUNCH_SLURM = 3
} LaunchKind;

#define LAUNCH_ADDR_MAX 256
#define LAUNCH_TOKEN_MAX 256

typedef struct {
    LaunchKind kind;
    int rank, world, local_rank;        // local_rank: the GPU this process binds
    char master_addr[LAUNCH_ADDR_MAX];  // rank 0's host for the TCP bootstrap; "" when unset
    int master_port;                    // 0 when unset
    // The secret every rank of this launch shares, proved in the TCP bootstrap's hello;
    // "" when there is none. job_token_source names where it came from (NULL when "").
    char job_token[LAUNCH_TOKEN_MAX];
    const char *job_token_source;
} LaunchInfo;

// Reads the environment, first match wins:
//   torchrun: RANK, WORLD_SIZE, LOCAL_RANK (MASTER_ADDR, MASTER_PORT)
//   mpirun:   OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK
//   srun:     SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID
// MASTER_ADDR / MASTER_PORT are read for every kind (scripts/launch_slurm.sh sets them). mpirun
// with every rank on one host defaults them to 127.0.0.1 and a port derived from the job.
// The job token: FLASHGPT_JOB_TOKEN when set and not empty, else the id the launcher gives every
// rank of the job alike: torchrun's TORCHELASTIC_RUN_ID (not its placeholder "none"), Slurm's
// SLURM_JOB_ID.SLURM_STEP_ID, Open MPI's PMIX_NAMESPACE (5) or OMPI_MCA_ess_base_jobid (4).
// Returns 0, or -1 with err naming the variable when one is set but malformed or inconsistent
// (a rank outside [0, world), a missing partner variable).
int launch_detect(LaunchInfo *li, char *err, size_t errlen);
const char *launch_kind_name(LaunchKind k);
