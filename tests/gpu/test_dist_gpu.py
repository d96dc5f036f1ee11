"""Data parallelism on 2 GPUs with NCCL (run on 2 x H200 by `make test-gpu-dist`): the CPU
suite's comparisons (tests/test_dist.py) repeated on the CUDA backend, for torchrun and mpirun
launches: 2 GPUs x batch B against 1 GPU x batch 2B, gradient buckets reduced on NCCL's side
stream during backward against one reduce-scatter after it (bitwise), gradient accumulation,
exact resume on 2 GPUs and resume on 1, and faults: a killed or stopped rank ends the job, non-zero,
within a bounded time, with a message naming the rank."""
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import test_dist as td  # noqa: E402  (the CPU suite's helpers: shards, configs, readers)

BIN, ROOT = td.BIN, td.ROOT
MPIRUN = shutil.which("mpirun")
TORCHRUN = shutil.which("torchrun")
LAUNCHERS = ["torchrun", "mpirun"]
# Open MPI 4 insists on an ssh/rsh agent even for ranks on this host; a container without ssh
# launches them through the "isolated" component instead.
MPI_LOCAL = [] if shutil.which("ssh") or shutil.which("rsh") else ["--mca", "plm", "^rsh"]
STEPS = 8
# Small buckets: several per backward for this model, and a shard boundary inside one, so the
# side-stream reductions really overlap the backward still running.
SMALL_BUCKETS = {"FLASHGPT_BUCKET_MB": "0.02"}


def gpu_count():
    r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return r.stdout.count("GPU ") if r.returncode == 0 else 0


@pytest.fixture(scope="module", autouse=True)
def two_gpus():
    # This suite exists for a 2-GPU machine: fewer GPUs is a failure, not a skip.
    assert gpu_count() >= 2, "test_dist_gpu.py needs 2 GPUs"
    assert MPIRUN and TORCHRUN, "mpirun and torchrun must be installed"


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return td.make_shards(tmp_path_factory.mktemp("shards"))


def gpu_config(tmp_path, shards, name, dtype="fp32", **sections):
    # head size 64 (the flash kernels' size); fp32 runs attention materialised, exactly.
    sections.setdefault("model", {}).update({"n_embd": 128, "n_head": 2})
    sections.setdefault("precision", {}).update({"dtype": dtype})
    sections.setdefault("train", {}).setdefault("steps", STEPS)
    for key in ("checkpoint_every", "eval_every"):
        sections.setdefault("log", {}).setdefault(key, STEPS // 2)
    if dtype != "fp32":
        sections.setdefault("attention", {}).update({"deterministic": True})
    return td.config(tmp_path, shards, name, **sections)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(path, how, *sets):
    args = [BIN, "train", "-c", path, "--device", "cuda"]
    for s in sets:
        args += ["--set", s]
    if how == "mpirun":
        return [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", "2"] + MPI_LOCAL + args
    if how == "torchrun":
        return [TORCHRUN, "--nproc_per_node=2", "--no-python", f"--master_port={free_port()}"] + args
    return args


def train(path, how, *sets, extra_env=None, timeout=600):
    r = subprocess.run(command(path, how, *sets), capture_output=True, text=True, timeout=timeout,
                       cwd=ROOT, env=td.env(**(extra_env or {})))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r


# Tolerance for 2 GPUs x B against 1 GPU x 2B in fp32. The GPU sums in other orders for other
# batch shapes (cuBLASLt's kernels, the bias and LayerNorm reductions), about 1e-6 relative per
# step, and this small model at lr 2e-2 amplifies any difference about 2x per step (measured on
# the H200: 4e-7 at step 3, 3.7e-6 at step 6, 2.4e-5 at step 9, 4e-3 by step 20). The GPU runs
# are therefore 8 steps long, with a bound of 1e-4, while a rank reading the wrong windows or
# an unaveraged gradient changes the loss by 1e-2 or more from step 2 on.
GPU_LOSS_RTOL = 1e-4


def report(name, **values):
    """Measured differences, for the record (tolerances are set against them)."""
    print(f"measured {name}: " + ", ".join(f"{k}={v:.3g}" for k, v in values.items()))


# ---------------------------------------------------------------------------------------------
# 2 GPUs x B == 1 GPU x 2B


@pytest.mark.parametrize("how", LAUNCHERS)
def test_two_gpus_match_one_gpu_with_double_batch(tmp_path, shards, how):
    # fp32 (no TF32) on the GPU: the same rounding-only argument as the CPU suite's tolerances.
    one, one_dir = gpu_config(tmp_path, shards, "one", data={"shuffle": True},
                              train={"batch_size": 2 * td.B})
    two, two_dir = gpu_config(tmp_path, shards, "two", data={"shuffle": True})
    train(one, "single")
    r = train(two, how, extra_env=SMALL_BUCKETS)
    assert f"data parallel: 2 ranks ({how}, nccl collectives)" in r.stdout, r.stdout[:2000]
    assert r.stdout.count(f"step      {STEPS}/{STEPS}") == 1, r.stdout[-2000:]
    l1, l2 = td.losses(one_dir), td.losses(two_dir)
    assert sorted(l1) == sorted(l2) == list(range(1, STEPS + 1))
    worst = max(abs(l2[s] - l1[s]) / abs(l1[s]) for s in l1)
    n1 = [e["grad_norm"] for e in td.events(one_dir, "train")]
    n2 = [e["grad_norm"] for e in td.events(two_dir, "train")]
    ck = f"ckpt_{STEPS:08d}"
    w1 = td.weights(os.path.join(one_dir, ck))
    w2 = td.weights(os.path.join(two_dir, ck))
    norm_worst = max(abs(a - b) / abs(b) for a, b in zip(n2, n1))
    report(f"fp32 {how}", loss_rel=worst, grad_norm_rel=norm_worst,
           weights_rel_l2=td.rel_l2(w2, w1))
    assert worst <= GPU_LOSS_RTOL, (l1, l2)
    # The gradient norm reacts more than the loss to the same weights' rounding (1.2e-5 at
    # step 6 where the loss differed by 4e-6): a bound 10x the loss's.
    assert norm_worst <= 10 * GPU_LOSS_RTOL, (n1, n2)
    assert min(l1.values()) < l1[1] - 0.2  # it learns (measured: 4.18 to 3.86 in 8 steps)
    v1 = [e["val_loss"] for e in td.events(one_dir, "eval")]
    v2 = [e["val_loss"] for e in td.events(two_dir, "eval")]
    assert len(v1) == len(v2) == 2 and np.allclose(v1, v2, rtol=GPU_LOSS_RTOL, atol=0)
    assert td.rel_l2(w2, w1) <= td.WEIGHT_RTOL


def test_bf16_two_gpus_track_one_gpu(tmp_path, shards):
    # bf16: each rank's gradients are rounded to bf16 before NCCL sums them (and the sum is
    # rounded again), where one GPU rounds the sum over 2B once: differences of 2^-8 relative
    # per gradient element, which AdamW's normalisation carries into the weights, and which
    # this model at lr 2e-2 amplifies about 2x per step (the fp32 test above). Measured on the
    # H200: at most 2.2% over the 8 steps; the bound is 5%. This test shows that the bf16
    # reductions run and train alike; the tight comparison is the fp32 one above.
    one, one_dir = gpu_config(tmp_path, shards, "one", "bf16", train={"batch_size": 2 * td.B})
    two, two_dir = gpu_config(tmp_path, shards, "two", "bf16")
    train(one, "single")
    train(two, "mpirun", extra_env=SMALL_BUCKETS)
    l1, l2 = td.losses(one_dir), td.losses(two_dir)
    worst = max(abs(l2[s] - l1[s]) / abs(l1[s]) for s in l1)
    report("bf16 mpirun", loss_rel=worst)
    print("per step:", " ".join(f"{abs(l2[s] - l1[s]) / abs(l1[s]):.1e}" for s in sorted(l1)))
    assert worst <= 5e-2 and min(l1.values()) < l1[1] - 0.5


def test_grad_accum_reduces_once_and_matches(tmp_path, shards):
    one, one_dir = gpu_config(tmp_path, shards, "one",
                              train={"batch_size": 2 * td.B, "grad_accum": 2})
    two, two_dir = gpu_config(tmp_path, shards, "two", train={"grad_accum": 2})
    train(one, "single")
    train(two, "torchrun", extra_env=SMALL_BUCKETS)
    l1, l2 = td.losses(one_dir), td.losses(two_dir)
    for s in l1:
        assert abs(l2[s] - l1[s]) <= GPU_LOSS_RTOL * abs(l1[s]), (s, l1[s], l2[s])


# ---------------------------------------------------------------------------------------------
# buckets on NCCL's side stream


def test_bucketed_reduction_is_bitwise_the_single_one(tmp_path, shards):
    # bf16 with the deterministic attention backward: every run computes the same local
    # gradients bit for bit, and with 2 ranks each element is one bf16 addition whichever way
    # the reduction is cut, so buckets of every size give the same run.
    runs = {}
    for mb in ("0", "0.001", "0.02", None):
        path, run_dir = gpu_config(tmp_path, shards, f"mb{mb}", "bf16", data={"shuffle": True},
                                   train={"grad_accum": 2})
        train(path, "mpirun", extra_env={"FLASHGPT_BUCKET_MB": mb} if mb else None)
        runs[mb] = (td.losses(run_dir), td.weights(os.path.join(run_dir, f"ckpt_{STEPS:08d}")))
    ref_losses, ref_weights = runs["0"]
    for mb, (l, w) in runs.items():
        assert l == ref_losses, (mb, l, ref_losses)
        assert np.array_equal(w, ref_weights), mb


# ---------------------------------------------------------------------------------------------
# resume


def test_two_gpu_resume_is_exact(tmp_path, shards):
    path, run_dir = gpu_config(tmp_path, shards, "two", "bf16", data={"shuffle": True})
    train(path, "torchrun")
    full = td.losses(run_dir)
    last = os.path.join(run_dir, f"ckpt_{STEPS:08d}")
    w_full = td.weights(last)
    shutil.rmtree(last)
    os.remove(os.path.join(run_dir, "metrics.jsonl"))
    r = train(path, "torchrun")
    assert "resuming from" in r.stdout
    resumed = td.losses(run_dir)
    assert sorted(resumed) == list(range(STEPS // 2 + 1, STEPS + 1))
    for s in resumed:
        assert resumed[s] == full[s], (s, resumed[s], full[s])
    assert np.array_equal(td.weights(last), w_full)
    for rank in (0, 1):
        assert os.path.exists(os.path.join(last, f"optimizer_rank{rank}.safetensors"))


def test_two_gpu_checkpoint_resumes_on_one_gpu(tmp_path, shards):
    two, two_dir = gpu_config(tmp_path, shards, "two")
    train(two, "mpirun")
    ref = td.losses(two_dir)
    one, one_dir = gpu_config(tmp_path, shards, "one", train={"batch_size": 2 * td.B})
    mid = f"ckpt_{STEPS // 2:08d}"
    shutil.copytree(os.path.join(two_dir, mid), os.path.join(one_dir, mid))
    r = train(one, "single")
    assert "written by 2 ranks, this run has 1" in r.stderr
    got = td.losses(one_dir)
    assert sorted(got) == list(range(STEPS // 2 + 1, STEPS + 1))
    for s in got:
        assert abs(got[s] - ref[s]) <= GPU_LOSS_RTOL * abs(ref[s]), (s, got[s], ref[s])


# ---------------------------------------------------------------------------------------------
# faults


def start_long_run(tmp_path, shards, how, timeout_s):
    path, run_dir = gpu_config(tmp_path, shards, "fault", "bf16", train={"steps": 1000000},
                               log={"checkpoint_every": 0, "eval_every": 0, "every": 100})
    tag = str(os.getpid()) + str(time.monotonic_ns())
    e = td.env(FLASHGPT_DIST_TIMEOUT=str(timeout_s), FLASHGPT_TEST_JOB=tag)
    if how == "plain":
        # Two processes started by hand with torchrun's variables and no supervising launcher:
        # only flashgpt's own watchdog can end the survivor.
        port = free_port()
        procs = [subprocess.Popen(command(path, "plain"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, cwd=ROOT,
                                  env=dict(e, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r),
                                           MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)))
                 for r in range(2)]
    else:
        procs = [subprocess.Popen(command(path, how), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, cwd=ROOT, env=e)]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # wait until both ranks train
        if os.path.exists(os.path.join(run_dir, "metrics.jsonl")) and len(td.events(run_dir, "train")) > 5:
            break
        time.sleep(0.2)
    pids = td.rank_pids(tag, "OMPI_COMM_WORLD_RANK" if how == "mpirun" else "RANK")
    assert sorted(pids) == [0, 1], pids
    return procs, pids


def end_all(procs, bound):
    """Waits for every process (at most bound seconds in all); returns [(rc, stderr)], elapsed."""
    t0, out = time.monotonic(), []
    for p in procs:
        try:
            _, err = p.communicate(timeout=max(1.0, bound - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"the job did not end within {bound} s")
        out.append((p.returncode, err))
    return out, time.monotonic() - t0


@pytest.mark.parametrize("how", ["plain", "torchrun", "mpirun"])
def test_killed_rank_ends_the_job(tmp_path, shards, how):
    procs, pids = start_long_run(tmp_path, shards, how, timeout_s=10)
    os.kill(pids[1], signal.SIGKILL)
    results, waited = end_all(procs, 90)
    print(f"measured kill under {how}: the job ended {waited:.1f} s after the kill")
    rc, err = results[0]
    assert rc != 0, err[-2000:]
    if how == "plain":
        # The survivor's watchdog (the collective's deadline or NCCL's error) names it.
        assert "rank 0 of 2" in err, err[-2000:]


def test_hung_rank_ends_the_job_after_the_timeout(tmp_path, shards):
    # A stopped rank never enters the next collective: rank 0's wait times out after
    # FLASHGPT_DIST_TIMEOUT, says so, aborts the NCCL communicator and MPI ends the job.
    procs, pids = start_long_run(tmp_path, shards, "mpirun", timeout_s=5)
    os.kill(pids[1], signal.SIGSTOP)
    try:
        results, waited = end_all(procs, 90)
    finally:
        try:
            os.kill(pids[1], signal.SIGKILL)
        except ProcessLookupError:
            pass
    rc, err = results[0]
    print(f"measured hang under mpirun: the job ended {waited:.1f} s after the stop")
    assert rc != 0
    assert "rank 0 of 2" in err and "did not complete within 5 s" in err, err[-2000:]
    assert waited >= 4.5
