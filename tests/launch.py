"""How the end-to-end tests launch ./train_gpt: the binary under test (TRAIN_GPT, which make
test-asan points at its sanitizer build), mpirun for two ranks, a clean environment, and the
process ids of the ranks of a job (to signal or kill one of them)."""
import os
import shutil

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("TRAIN_GPT", os.path.join(ROOT, "train_gpt"))
MPIRUN = shutil.which("mpirun")
# FLASHGPT_NO_MPI=1: the binary under test was built without MPI (make test-asan).
needs_mpi = pytest.mark.skipif(MPIRUN is None or os.environ.get("FLASHGPT_NO_MPI") == "1",
                               reason="needs mpirun (openmpi-bin) and a train_gpt built with MPI")

# Variables of every launcher: cleared so the test's own environment cannot leak into a run.
LAUNCH_VARS = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID",
               "SLURM_NTASKS", "SLURM_LOCALID"]


def env(**extra):
    e = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS and not k.startswith("OMPI_")}
    e.update({"OMP_NUM_THREADS": "1", "OMPI_ALLOW_RUN_AS_ROOT": "1",
              "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
    e.update(extra)
    return e


def command(args, ranks=1, tag=None):
    """train_gpt with args, under mpirun when ranks > 1 (with FLASHGPT_TEST_JOB exported, for
    rank_pids, when tag is given)."""
    cmd = [BIN] + args
    if ranks > 1:
        forward = ["-x", "FLASHGPT_TEST_JOB"] if tag else []
        cmd = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", str(ranks)] + forward + cmd
    return cmd


def rank_pids(tag, rank_var="OMPI_COMM_WORLD_RANK"):
    """{rank: pid} of the train_gpt ranks whose environment carries FLASHGPT_TEST_JOB=tag (the
    rank read from rank_var: the launcher's variable)."""
    pids = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/environ", "rb") as f:
                envs = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        except OSError:
            continue
        if envs.get(b"FLASHGPT_TEST_JOB") == tag.encode() and rank_var.encode() in envs:
            try:
                with open(f"/proc/{p}/comm") as f:
                    if f.read().strip() != "train_gpt":  # not the launcher itself
                        continue
            except OSError:
                continue
            pids[int(envs[rank_var.encode()])] = int(p)
    return pids
