// dist: launch detection from each launcher's variables and the job token, the rank timeout,
// shard and range arithmetic, the single-process communicator. The TCP bootstrap, which is how
// NCCL's unique id travels without MPI, has its own tests (test_bootstrap.c).
#include <stdlib.h>
#include <string.h>

#include "dist/comm.h"
#include "dist/launch.h"
#include "tests/testlib.h"

static const char *ALL_VARS[] = {
    "RANK",         "WORLD_SIZE",           "LOCAL_RANK",           "MASTER_ADDR",
    "MASTER_PORT",  "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
    "SLURM_PROCID", "SLURM_NTASKS",         "SLURM_LOCALID",        "OMPI_COMM_WORLD_LOCAL_SIZE",
    "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "FLASHGPT_JOB_TOKEN", "TORCHELASTIC_RUN_ID",
    "SLURM_JOB_ID", "SLURM_STEP_ID"};

static void clear_env(void) {
    for (size_t i = 0; i < sizeof ALL_VARS / sizeof ALL_VARS[0]; i++)
        unsetenv(ALL_VARS[i]);
}

static int detect(LaunchInfo *li, char *err) { return launch_detect(li, err, 256); }

static void test_launch(void) {
    LaunchInfo li;
    char err[256];
    clear_env();
    EXPECT(detect(&li, err) == 0 && li.kind == LAUNCH_SINGLE && li.world == 1 && li.rank == 0,
           "no variables: single process");
    setenv("RANK", "3", 1), setenv("WORLD_SIZE", "4", 1), setenv("LOCAL_RANK", "1", 1);
    setenv("MASTER_ADDR", "node7", 1), setenv("MASTER_PORT", "29500", 1);
    EXPECT(detect(&li, err) == 0 && li.kind == LAUNCH_TORCHRUN && li.rank == 3 && li.world == 4 &&
               li.local_rank == 1 && strcmp(li.master_addr, "node7") == 0 &&
               li.master_port == 29500,
           "torchrun: %s", err);
    clear_env();
    setenv("OMPI_COMM_WORLD_RANK", "1", 1), setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "0", 1);
    EXPECT(detect(&li, err) == 0 && li.kind == LAUNCH_MPIRUN && li.rank == 1 && li.world == 2 &&
               li.local_rank == 0 && li.master_port == 0,
           "mpirun: %s", err);
    // Every rank on this host: rank 0 is 127.0.0.1, and the port comes from the job's name
    // (the same on every rank, even, with room for port + 1), unless the user set them.
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1), setenv("PMIX_NAMESPACE", "prterun-vm-4242@1", 1);
    EXPECT(detect(&li, err) == 0 && strcmp(li.master_addr, "127.0.0.1") == 0 &&
               li.master_port >= 20000 && li.master_port < 60000 && li.master_port % 2 == 0,
           "mpirun on one host: %s:%d", li.master_addr, li.master_port);
    const int port = li.master_port;
    EXPECT(detect(&li, err) == 0 && li.master_port == port, "the port is a function of the job");
    setenv("PMIX_NAMESPACE", "prterun-vm-4243@1", 1);
    EXPECT(detect(&li, err) == 0 && li.master_port != port, "another job, another port");
    setenv("MASTER_ADDR", "node3", 1), setenv("MASTER_PORT", "31000", 1);
    EXPECT(detect(&li, err) == 0 && strcmp(li.master_addr, "node3") == 0 && li.master_port == 31000,
           "the user's MASTER_ADDR and MASTER_PORT win");
    unsetenv("MASTER_ADDR"), unsetenv("MASTER_PORT");
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "1", 1);
    EXPECT(detect(&li, err) == 0 && li.master_addr[0] == '\0' && li.master_port == 0,
           "ranks on several hosts: no guessed address");
    clear_env();
    setenv("SLURM_PROCID", "5", 1), setenv("SLURM_NTASKS", "8", 1);
    EXPECT(detect(&li, err) == 0 && li.kind == LAUNCH_SLURM && li.rank == 5 && li.world == 8 &&
               li.local_rank == 5,
           "srun without SLURM_LOCALID: local rank = rank: %s", err);
    setenv("SLURM_PROCID", "8", 1);
    EXPECT(detect(&li, err) != 0 && strstr(err, "SLURM_PROCID=8 is not below SLURM_NTASKS=8"),
           "rank outside the world: %s", err);
    clear_env();
    setenv("RANK", "0", 1);
    EXPECT(detect(&li, err) != 0 && strstr(err, "WORLD_SIZE"), "partner missing: %s", err);
    setenv("WORLD_SIZE", "two", 1);
    EXPECT(detect(&li, err) != 0 && strstr(err, "WORLD_SIZE='two'"), "malformed: %s", err);
    clear_env();
    setenv("MASTER_PORT", "65535", 1);
    EXPECT(detect(&li, err) != 0 && strstr(err, "MASTER_PORT"), "no room for port + 1: %s", err);
    clear_env();
}

// The job token: the launcher's own job id, the same on every rank of one job; FLASHGPT_JOB_TOKEN
// wins; none for torchrun's placeholder run id or without a launcher.
static void test_job_token(void) {
    LaunchInfo li;
    char err[256];
    clear_env();
    setenv("SLURM_JOB_ID", "77", 1);
    EXPECT(detect(&li, err) == 0 && li.job_token[0] == '\0' && !li.job_token_source,
           "one process: no token even inside an allocation");
    setenv("RANK", "1", 1), setenv("WORLD_SIZE", "2", 1), setenv("TORCHELASTIC_RUN_ID", "none", 1);
    EXPECT(detect(&li, err) == 0 && li.job_token[0] == '\0' && !li.job_token_source,
           "torchrun's default run id 'none' is no token, and Slurm's job id is not torchrun's");
    setenv("TORCHELASTIC_RUN_ID", "c0ffee-17", 1);
    EXPECT(detect(&li, err) == 0 && strcmp(li.job_token, "c0ffee-17") == 0 &&
               strcmp(li.job_token_source, "TORCHELASTIC_RUN_ID") == 0,
           "torchrun: TORCHELASTIC_RUN_ID: '%s'", li.job_token);
    setenv("FLASHGPT_JOB_TOKEN", "s3cret", 1);
    EXPECT(detect(&li, err) == 0 && strcmp(li.job_token, "s3cret") == 0 &&
               strcmp(li.job_token_source, "FLASHGPT_JOB_TOKEN") == 0,
           "FLASHGPT_JOB_TOKEN wins");
    char big[LAUNCH_TOKEN_MAX + 1];
    memset(big, 'k', LAUNCH_TOKEN_MAX), big[LAUNCH_TOKEN_MAX] = '\0';
    setenv("FLASHGPT_JOB_TOKEN", big, 1);
    EXPECT(detect(&li, err) != 0 && strstr(err, "FLASHGPT_JOB_TOKEN is longer"),
           "a token too long is an error, not cut: %s", err);
    clear_env();
    setenv("SLURM_PROCID", "0", 1), setenv("SLURM_NTASKS", "4", 1);
    setenv("SLURM_JOB_ID", "4242", 1), setenv("SLURM_STEP_ID", "3", 1);
    EXPECT(detect(&li, err) == 0 && strcmp(li.job_token, "4242.3") == 0,
           "srun: SLURM_JOB_ID.SLURM_STEP_ID: '%s'", li.job_token);
    clear_env();
    setenv("OMPI_COMM_WORLD_RANK", "0", 1), setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
    setenv("OMPI_MCA_ess_base_jobid", "1211105281", 1);
    EXPECT(detect(&li, err) == 0 && strcmp(li.job_token, "1211105281") == 0 &&
               strcmp(li.job_token_source, "OMPI_MCA_ess_base_jobid") == 0,
           "Open MPI 4: its job id: '%s'", li.job_token);
    setenv("PMIX_NAMESPACE", "prterun-vm-4242@1", 1);
    EXPECT(detect(&li, err) == 0 && strcmp(li.job_token, "prterun-vm-4242@1") == 0,
           "Open MPI 5: PMIX_NAMESPACE: '%s'", li.job_token);
    clear_env();
}

static void test_shard(void) {
    const size_t ns[] = {0, 1, 63, 64, 65, 1000, 124475904, 124475905};
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++)
        for (int world = 1; world <= 8; world++) {
            size_t counts[8], next = 0;
            int ok = 1;
            for (int r = 0; r < world; r++) {
                size_t off, cnt;
                comm_shard(ns[i], world, r, &off, &cnt, counts);
                ok &= off == next && cnt == counts[r] && (off % 64 == 0 || cnt == 0);
                next = off + cnt;
            }
            EXPECT(ok && next == ns[i], "shards of n=%zu over %d ranks tile the vector, aligned",
                   ns[i], world);
        }
}

// Every element of a range lies in exactly one rank's part, in rank order: the parts of a
// range are its intersections with the segments (checked element by element against the
// segment that holds it).
static void test_range_parts(void) {
    const size_t counts[4] = {128, 128, 128, 100};   // 484 elements, the last shard shorter
    const size_t ranges[][2] = {{0, 484}, {0, 1}, {127, 2}, {100, 300}, {383, 101}, {200, 0},
                                {256, 128}, {483, 1}};
    for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++) {
        const size_t off = ranges[i][0], cnt = ranges[i][1];
        size_t parts[4], expect[4] = {0, 0, 0, 0};
        comm_range_parts(off, cnt, counts, 4, parts);
        for (size_t e = off; e < off + cnt; e++)
            expect[e < 128 ? 0 : e < 256 ? 1 : e < 384 ? 2 : 3]++;
        EXPECT(memcmp(parts, expect, sizeof parts) == 0,
               "range [%zu, +%zu): parts %zu %zu %zu %zu, expected %zu %zu %zu %zu", off, cnt,
               parts[0], parts[1], parts[2], parts[3], expect[0], expect[1], expect[2],
               expect[3]);
    }
}

static void test_single_comm(void) {
    Comm *c = comm_single_create();
    double x[2] = {1.5, -2};
    c->allreduce_host_f64(c, x, 2);
    EXPECT(c->world == 1 && x[0] == 1.5 && x[1] == -2, "single: all-reduce is the identity");
    EXPECT(comm_all_ok(c, 1) == 1 && comm_all_ok(c, 0) == 0, "single: agreement");
    // A group of one, and a ring of one: the exchange with itself is a copy.
    char err[256];
    c->timeout_s = 7;
    Comm *g = c->split(c, 0, 0, err, sizeof err);
    EXPECT(g && g->world == 1 && g->rank == 0 && g->timeout_s == 7, "single: split %s", err);
    float send[3] = {1, 2, 3}, recv[3] = {0};
    g->sendrecv_wait(g, g->sendrecv_start(g, send, sizeof send, 0, recv, sizeof recv, 0));
    EXPECT(recv[0] == 1 && recv[1] == 2 && recv[2] == 3, "single: sendrecv to itself copies");
    comm_close(g);
    comm_close(c);
}

// dist.timeout is the default; FLASHGPT_DIST_TIMEOUT, when set, wins.
static void test_timeout(void) {
    unsetenv("FLASHGPT_DIST_TIMEOUT");
    EXPECT(comm_timeout(42.0) == 42.0, "the configured timeout without the variable");
    setenv("FLASHGPT_DIST_TIMEOUT", "7.5", 1);
    EXPECT(comm_timeout(42.0) == 7.5, "FLASHGPT_DIST_TIMEOUT overrides the config");
    unsetenv("FLASHGPT_DIST_TIMEOUT");
}

int main(void) {
    TEST_CASE("rank timeout: dist.timeout, overridden by FLASHGPT_DIST_TIMEOUT", test_timeout());
    TEST_CASE("launch detection: torchrun, mpirun, srun, none, bad variables", test_launch());
    TEST_CASE("job token: the launcher's job id, FLASHGPT_JOB_TOKEN wins", test_job_token());
    TEST_CASE("comm_shard tiles the flat vector in aligned shards", test_shard());
    TEST_CASE("comm_range_parts splits a range at the shard boundaries", test_range_parts());
    TEST_CASE("single-process communicator", test_single_comm());
    return TEST_SUMMARY();
}
