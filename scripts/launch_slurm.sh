#!/usr/bin/env bash
# Multi-host data-parallel training under Slurm: one task per GPU, launched by srun. Each task
# reads SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID (rank, world size, GPU on its host); NCCL's
# unique id travels over TCP from rank 0 at MASTER_ADDR:MASTER_PORT+1 (this script exports both).
# log.dir must be on a filesystem every host sees: each rank writes its optimizer shard there.
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
exec srun --kill-on-bad-exit=1 --cpu-bind=cores ./train_gpt train -c "$config" --device cuda \
    --set dist.timeout=600 "$@"
