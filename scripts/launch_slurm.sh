#!/usr/bin/env bash
# Multi-host data-parallel training under Slurm: one task per GPU, launched by srun. Each task
# reads SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID (rank, world size, GPU on its host); NCCL's
# unique id travels over TCP from rank 0 at MASTER_ADDR:MASTER_PORT+1 (this script exports both).
# log.dir must be on a filesystem every host sees: each rank writes its optimizer shard there.
#
# Preemption and the time limit: the ranks stop cleanly on SIGTERM (they finish the step, write
# a checkpoint and exit 3; docs/preemption.md), and the job is requeued to resume from it.
# --signal=B:TERM@120 sends this script SIGTERM 120 s before the time limit; it forwards the
# signal to srun, which forwards it to every task. A preempting job gets SIGTERM from Slurm in
# every process (the tasks, srun, this script) and is requeued by Slurm itself when the partition
# preempts by requeueing (PreemptMode=REQUEUE, with a GraceTime long enough for a step and a
# checkpoint); the copies of one SIGTERM that reach a task within a second count as one stop.
# When the ranks exit 3, this script requeues the job (scontrol requeue): it runs again from the
# top, and `train` resumes from the newest complete checkpoint.
#
#   sbatch --nodes=2 scripts/launch_slurm.sh configs/gpt2_124m.json [--set key=value ...]
#   (or inside salloc: bash scripts/launch_slurm.sh CONFIG ...)
#
#SBATCH --job-name=flashgpt
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=8
#SBATCH --time=24:00:00
#SBATCH --requeue
#SBATCH --signal=B:TERM@120
#SBATCH --open-mode=append
set -euo pipefail
if [ $# -lt 1 ]; then
    echo "usage: sbatch [--nodes=N] $0 CONFIG.json [--set key=value ...]" >&2
    exit 2
fi
if [ -z "${SLURM_JOB_ID:-}" ]; then
    echo "error: not inside a Slurm allocation (run it with sbatch, or from salloc)" >&2
    exit 2
fi
cd "${SLURM_SUBMIT_DIR:-$(dirname "$0")/..}"
config=$1
shift

# Rank 0 runs on the first host of the allocation; a port derived from the job id keeps two jobs
# sharing a host apart (MASTER_PORT + 1 must be free as well).
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
MASTER_PORT=${MASTER_PORT:-$((20000 + SLURM_JOB_ID % 20000))}
export MASTER_ADDR MASTER_PORT
# NVLink SHARP (NVLS multicast) stays off; flashgpt's collectives do not need it.
export NCCL_NVLS_ENABLE=0
export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-8}

echo "launch_slurm: $SLURM_NTASKS ranks on $SLURM_JOB_NUM_NODES hosts," \
     "rank 0 at $MASTER_ADDR:$MASTER_PORT"
# --kill-on-bad-exit: when one task fails, Slurm ends the others at once. A rank that waits
# longer than dist.timeout for the others (a dead or hung host) exits non-zero: 600 s here, for
# checkpoint writes to a shared filesystem; a later --set (or FLASHGPT_DIST_TIMEOUT) wins.
srun --kill-on-bad-exit=1 --cpu-bind=cores ./train_gpt train -c "$config" --device cuda \
    --set dist.timeout=600 "$@" &
srun_pid=$!
trap 'echo "launch_slurm: SIGTERM: the ranks finish their step, checkpoint and stop"
      kill -TERM "$srun_pid" 2>/dev/null || true' TERM
# The trap interrupts `wait`; wait again until srun itself has ended.
while :; do
    rc=0
    wait "$srun_pid" || rc=$?
    kill -0 "$srun_pid" 2>/dev/null || break
done
if [ "$rc" -eq 3 ]; then   # EXIT_STOPPED: a complete checkpoint was written
    echo "launch_slurm: the ranks stopped with a checkpoint: requeueing job $SLURM_JOB_ID"
    scontrol requeue "$SLURM_JOB_ID" || echo "launch_slurm: scontrol requeue failed: resubmit to resume" >&2
fi
exit "$rc"
