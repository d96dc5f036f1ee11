"""Data parallelism on the CPU backend with Open MPI (mpirun -np 2): launch detection errors,
2 ranks x batch B against 1 process x batch 2B (loss curve and final weights), gradient buckets
reduced during backward against one reduction after it (bitwise), ZeRO-1 optimizer
shards in checkpoints, exact resume on 2 ranks, resume on another world size, and faults (a
killed or hung rank ends the job with a non-zero exit within a bounded time)."""
import json
import os
import shutil
import signal
import subprocess
import time

import numpy as np
import pytest

from launch import BIN, MPIRUN, ROOT, env, needs_mpi, rank_pids
from oracle_st import read_safetensors

V, T, B = 64, 16, 4
CFG = {
    "model": {"n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": V, "max_seq_len": T},
    "train": {"batch_size": B, "seq_len": T, "steps": 20, "seed": 11},
    "optim": {"lr": 2e-2, "min_lr": 2e-3, "warmup_steps": 3, "grad_clip": 1.0},
    "precision": {"dtype": "fp32"},
    "log": {"every": 5, "eval_every": 10, "eval_tokens": 1024, "sample_every": 0,
            "checkpoint_every": 10, "keep_checkpoints": 5},
}


def write_shard(path, tokens):
    """llm.c's shard format: 256 int32 header (magic, version 1, count), then uint16 tokens."""
    header = np.zeros(256, dtype=np.int32)
    header[:3] = [20240520, 1, len(tokens)]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype=np.uint16).tobytes())


def make_shards(d):
    """A small token stream with structure to learn (a noisy ramp): train and val shards in d."""
    rng = np.random.default_rng(5)
    n = 40000
    ramp = (np.arange(n) * 7) % V
    noise = rng.integers(0, V, n)
    tokens = np.where(rng.random(n) < 0.2, noise, ramp)
    write_shard(d / "train.bin", tokens[:32000])
    write_shard(d / "val.bin", tokens[32000:])
    return str(d / "train.bin"), str(d / "val.bin")


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return make_shards(tmp_path_factory.mktemp("shards"))


def config(tmp_path, shards, name, **sections):
    cfg = json.loads(json.dumps(CFG))
    cfg["data"] = {"train": shards[0], "val": shards[1]}
    for sec, kv in sections.items():
        cfg.setdefault(sec, {}).update(kv)
    cfg["log"]["dir"] = str(tmp_path / name)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(cfg))
    return str(path), cfg["log"]["dir"]


def train(path, ranks, *sets, timeout=300, extra_env=None):
    args = [BIN, "train", "-c", path, "--device", "cpu"]
    for s in sets:
        args += ["--set", s]
    if ranks > 1:
        args = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", str(ranks)] + args
    r = subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                       env=env(**(extra_env or {})))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r


def events(run_dir, kind):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [e for e in map(json.loads, f) if e["event"] == kind]


def losses(run_dir):
    return {e["step"]: e["loss"] for e in events(run_dir, "train")}


def weights(ckpt):
    tensors, _ = read_safetensors(os.path.join(ckpt, "model.safetensors"))
    return np.concatenate([tensors[k].ravel() for k in sorted(tensors)])


# Tolerances. Both runs compute the same global-batch gradient; only the order of the fp32
# sums differs (one matmul over 2B rows against two over B, then the reduce-scatter's sum), a
# relative difference of a few units of 2^-24 ~ 6e-8 per gradient element. The loss of a step
# depends on the weights only, so its difference stays at that level: measured at most 1.5e-7
# relative over 20 steps, bound 1e-5 (the same 20 steps with a bug, a rank reading the other's
# windows or an unaveraged gradient, differ by 1e-2 or more). The gradient norm is a sum of
# squares of the same gradients: the same bound. The weights move further apart: AdamW divides
# by sqrt(v), so parameters whose gradient nearly cancels turn a rounding difference into a
# visible one. The reference for "only rounding" is the same 1-process run with 2 OpenMP threads
# instead of 1 (another summation order, nothing else): measured relative L2 distance 1.0e-6
# after step 1 and 9.8e-5 after step 20, against 1.4e-6 and 1.3e-4 for 2 ranks x B. The bound is
# 1e-3, about 10x the reordering effect, while training itself moves the weights by 0.16 (L2,
# relative) between steps 10 and 20.
LOSS_RTOL = 1e-5
WEIGHT_RTOL = 1e-3


def rel_l2(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


# ---------------------------------------------------------------------------------------------
# launch detection, through the binary: bad or unservable launches exit 2 with a message


@pytest.mark.parametrize("variables,needle", [
    ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK"),
    ({"RANK": "0"}, "WORLD_SIZE"),
    ({"SLURM_PROCID": "3", "SLURM_NTASKS": "2"}, "SLURM_PROCID=3 is not below SLURM_NTASKS=2"),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "mpirun"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "MASTER_PORT": "70000"}, "MASTER_PORT"),
])
def test_launch_errors_name_the_variable(tmp_path, shards, variables, needle):
    path, run_dir = config(tmp_path, shards, "bad")
    r = subprocess.run([BIN, "train", "-c", path, "--device", "cpu"], capture_output=True,
                       text=True, timeout=60, env=env(**variables), cwd=ROOT)
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr, r.stderr
    assert not os.path.exists(run_dir)


def test_single_launch_vars_mean_one_process(tmp_path, shards):
    path, run_dir = config(tmp_path, shards, "one")
    r = subprocess.run([BIN, "train", "-c", path, "--device", "cpu", "--set", "train.steps=2"],
                       capture_output=True, text=True, timeout=60, cwd=ROOT,
                       env=env(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0"))
    assert r.returncode == 0, r.stderr
    assert "data parallel" not in r.stdout


# ---------------------------------------------------------------------------------------------
# 2 ranks x B == 1 process x 2B


@needs_mpi
@pytest.mark.parametrize("shuffle", [False, True])
def test_two_ranks_match_one_process_with_double_batch(tmp_path, shards, shuffle):
    one, one_dir = config(tmp_path, shards, "one", data={"shuffle": shuffle},
                          train={"batch_size": 2 * B})
    two, two_dir = config(tmp_path, shards, "two", data={"shuffle": shuffle})
    train(one, 1)
    r = train(two, 2)
    assert "data parallel: 2 ranks" in r.stdout
    assert r.stdout.count("step     20/20") == 1  # rank 0 alone prints
    l1, l2 = losses(one_dir), losses(two_dir)
    assert sorted(l1) == sorted(l2) == list(range(1, 21))
    for s in l1:
        assert abs(l2[s] - l1[s]) <= LOSS_RTOL * abs(l1[s]), (s, l1[s], l2[s])
    n1 = [e["grad_norm"] for e in events(one_dir, "train")]
    n2 = [e["grad_norm"] for e in events(two_dir, "train")]
    assert np.allclose(n2, n1, rtol=LOSS_RTOL, atol=0), (n1, n2)
    assert l1[20] < l1[1] - 0.5  # it learns: the comparison is not between two flat curves
    v1 = [e["val_loss"] for e in events(one_dir, "eval")]
    v2 = [e["val_loss"] for e in events(two_dir, "eval")]
    assert len(v1) == len(v2) == 2
    assert np.allclose(v1, v2, rtol=LOSS_RTOL, atol=0)
    w1 = weights(os.path.join(one_dir, "ckpt_00000020"))
    w2 = weights(os.path.join(two_dir, "ckpt_00000020"))
    assert rel_l2(w2, w1) <= WEIGHT_RTOL
    seen = [events(d, "train")[-1]["tokens_seen"] for d in (one_dir, two_dir)]
    assert seen[0] == seen[1] == 20 * 2 * B * T


@needs_mpi
def test_grad_accum_reduces_once_and_matches(tmp_path, shards):
    # 2 ranks x B x accum 2 == 1 process x 2B x accum 2: the ranks meet once per step.
    one, one_dir = config(tmp_path, shards, "one",
                          train={"batch_size": 2 * B, "grad_accum": 2, "steps": 10})
    two, two_dir = config(tmp_path, shards, "two", train={"grad_accum": 2, "steps": 10})
    train(one, 1)
    train(two, 2)
    l1, l2 = losses(one_dir), losses(two_dir)
    for s in l1:
        assert abs(l2[s] - l1[s]) <= LOSS_RTOL * abs(l1[s]), (s, l1[s], l2[s])


# ---------------------------------------------------------------------------------------------
# gradient buckets reduced during backward


@needs_mpi
def test_bucketed_reduction_is_bitwise_the_single_one(tmp_path, shards):
    # dist.bucket_mb = 0 reduce-scatters all gradients after backward; 0.001 MiB (262 floats)
    # makes every block its own bucket, 0.02 MiB (5242 floats) groups small blocks and puts the
    # shard boundary inside a bucket, and the default (25) is one bucket for this model. With 2
    # ranks every element is the same single addition either way: equal bit for bit. 0.001 comes
    # through FLASHGPT_BUCKET_MB, which overrides the config's 0.
    runs = {}
    for mb in ("0", "0.001", "0.02", None):
        dist = {"bucket_mb": 0 if mb == "0.001" else float(mb)} if mb else {}
        path, run_dir = config(tmp_path, shards, f"mb{mb}", data={"shuffle": True},
                               train={"grad_accum": 2, "steps": 10}, dist=dist)
        train(path, 2, extra_env={"FLASHGPT_BUCKET_MB": mb} if mb == "0.001" else None)
        runs[mb] = (losses(run_dir), weights(os.path.join(run_dir, "ckpt_00000010")))
    ref_losses, ref_weights = runs["0"]
    for mb, (l, w) in runs.items():
        assert l == ref_losses, (mb, l, ref_losses)
        assert np.array_equal(w, ref_weights), mb


@needs_mpi
def test_bad_bucket_size_is_a_usage_error(tmp_path, shards):
    path, _ = config(tmp_path, shards, "bad", train={"steps": 2})
    args = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", "2", BIN, "train", "-c", path,
            "--device", "cpu"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env=env(FLASHGPT_BUCKET_MB="lots"))
    assert r.returncode != 0 and "FLASHGPT_BUCKET_MB='lots'" in r.stderr, r.stderr[-2000:]


def test_bad_dist_settings_are_usage_errors(tmp_path, shards):
    # The config's dist section is validated like every other: the message names the key.
    for key, value in (("bucket_mb", -1), ("timeout", 0)):
        path, _ = config(tmp_path, shards, f"bad_{key}", dist={key: value})
        r = subprocess.run([BIN, "train", "-c", path, "--device", "cpu"], capture_output=True,
                           text=True, timeout=60, cwd=ROOT, env=env())
        assert r.returncode == 2 and f"dist.{key}" in r.stderr, r.stderr[-2000:]


@needs_mpi
def test_bench_runs_data_parallel(tmp_path, shards):
    # `train_gpt bench` under mpirun: every rank trains, rank 0 alone prints the global rate.
    path, _ = config(tmp_path, shards, "bench")
    args = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", "2", BIN, "bench", "-c", path,
            "--device", "cpu", "--steps", "2"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=ROOT, env=env())
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [line for line in r.stdout.splitlines() if line.startswith("bench:")]
    assert len(lines) == 1 and f"batch {B} x seq {T} x accum 1 x ranks 2 (mpi)" in lines[0], r.stdout


@needs_mpi
def test_bench_breakdown_times_every_phase(tmp_path, shards):
    # --breakdown: rank 0 prints one more line, every phase of a data-parallel step timed (the
    # reduction, optimizer and all-gather take time on 2 ranks), and the phases add up to the total.
    path, _ = config(tmp_path, shards, "phases")
    args = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", "2", BIN, "bench", "-c", path,
            "--device", "cpu", "--steps", "2", "--breakdown"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=ROOT, env=env())
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [line for line in r.stdout.splitlines() if line.startswith("bench: phases")]
    assert len(lines) == 1, r.stdout
    parts = dict(p.strip().rsplit(" ", 1) for p in lines[0].split(":", 2)[2].split("|"))
    names = ["forward+backward", "reduction after backward", "norm", "optimizer", "all-gather"]
    assert list(parts) == names + ["total"], lines[0]
    ms = {k: float(v) for k, v in parts.items()}
    assert all(ms[k] > 0 for k in ["forward+backward", "reduction after backward", "optimizer"]), ms
    assert abs(sum(ms[k] for k in names) - ms["total"]) < 0.02 * len(names), ms


# ---------------------------------------------------------------------------------------------
# ZeRO-1 shards, resume


@needs_mpi
def test_checkpoint_holds_one_optimizer_shard_per_rank(tmp_path, shards):
    path, run_dir = config(tmp_path, shards, "two", train={"steps": 10})
    train(path, 2)
    ck = os.path.join(run_dir, "ckpt_00000010")
    n = weights(ck).size
    st = json.load(open(os.path.join(ck, "state.json")))
    assert st["world_size"] == 2
    parts = [read_safetensors(os.path.join(ck, f"optimizer_rank{r}.safetensors")) for r in range(2)]
    sizes = [p[0]["m"].size for p in parts]
    assert sum(sizes) == n and min(sizes) > 0  # the shards tile the flat vector
    assert [int(p[1]["offset"]) for p in parts] == [0, sizes[0]]
    assert all(int(p[1]["total"]) == n and int(p[1]["t"]) == 10 for p in parts)
    assert not [f for f in os.listdir(run_dir) if f.startswith(".tmp")]


@needs_mpi
def test_missing_rank_shard_is_reported(tmp_path, shards):
    path, run_dir = config(tmp_path, shards, "two", train={"steps": 10})
    train(path, 2)
    os.remove(os.path.join(run_dir, "ckpt_00000010", "optimizer_rank1.safetensors"))
    for ranks in (1, 2):
        args = [BIN, "train", "-c", path, "--device", "cpu", "--set", "train.steps=12"]
        if ranks > 1:
            args = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", "2"] + args
        r = subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=ROOT, env=env())
        assert r.returncode != 0 and "optimizer_rank1.safetensors" in r.stderr, r.stderr[-2000:]


@needs_mpi
def test_two_rank_resume_is_exact(tmp_path, shards):
    path, run_dir = config(tmp_path, shards, "two", data={"shuffle": True})
    train(path, 2)
    full = losses(run_dir)
    w_full = weights(os.path.join(run_dir, "ckpt_00000020"))
    shutil.rmtree(os.path.join(run_dir, "ckpt_00000020"))
    os.remove(os.path.join(run_dir, "metrics.jsonl"))
    r = train(path, 2)
    assert "resuming from" in r.stdout
    resumed = losses(run_dir)
    assert sorted(resumed) == list(range(11, 21))
    for s in resumed:
        assert resumed[s] == full[s], (s, resumed[s], full[s])
    assert np.array_equal(weights(os.path.join(run_dir, "ckpt_00000020")), w_full)


@needs_mpi
def test_resume_on_another_world_size(tmp_path, shards):
    # A 2-rank checkpoint resumed by 1 process (shards re-assembled) continues the 2-rank run's
    # curve within the same tolerance as 1 x 2B against 2 x B; so does the opposite direction.
    two, two_dir = config(tmp_path, shards, "two")
    train(two, 2)
    ref = losses(two_dir)
    one, one_dir = config(tmp_path, shards, "one", train={"batch_size": 2 * B})
    shutil.copytree(os.path.join(two_dir, "ckpt_00000010"), os.path.join(one_dir, "ckpt_00000010"))
    r = train(one, 1)
    assert "written by 2 ranks, this run has 1" in r.stderr
    got = losses(one_dir)
    assert sorted(got) == list(range(11, 21))
    for s in got:
        assert abs(got[s] - ref[s]) <= LOSS_RTOL * abs(ref[s]), (s, got[s], ref[s])
    back, back_dir = config(tmp_path, shards, "back")
    shutil.copytree(os.path.join(one_dir, "ckpt_00000020"), os.path.join(back_dir, "ckpt_00000020"))
    train(back, 2, "train.steps=25")
    assert sorted(losses(back_dir)) == list(range(21, 26))


# ---------------------------------------------------------------------------------------------
# faults: a killed or a hung rank ends the job, non-zero, within a bounded time


def start_long_run(tmp_path, shards, timeout_s, through_env, dist=None):
    """A long 2-rank run with a rank timeout of timeout_s, set through FLASHGPT_DIST_TIMEOUT
    (through_env) or the config's dist.timeout; dist: more of the config's dist section."""
    path, run_dir = config(tmp_path, shards, "fault", train={"steps": 1000000},
                           log={"checkpoint_every": 0, "eval_every": 0, "every": 100},
                           dist=({} if through_env else {"timeout": timeout_s}) | (dist or {}))
    tag = str(os.getpid()) + str(time.monotonic_ns())
    args = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", "2", "-x", "FLASHGPT_TEST_JOB",
            BIN, "train", "-c", path, "--device", "cpu"]
    variables = {"FLASHGPT_TEST_JOB": tag}
    if through_env:
        variables["FLASHGPT_DIST_TIMEOUT"] = str(timeout_s)
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                         env=env(**variables))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # wait until both ranks train
        metrics = os.path.join(run_dir, "metrics.jsonl")
        if os.path.exists(metrics) and len(events(run_dir, "train")) > 5:
            break
        time.sleep(0.2)
    pids = rank_pids(tag)
    assert sorted(pids) == [0, 1], pids
    return p, pids


def wait_exit(p, bound):
    t0 = time.monotonic()
    try:
        out, err = p.communicate(timeout=bound)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        pytest.fail(f"the job did not end within {bound} s:\n{err[-2000:]}")
    return p.returncode, err, time.monotonic() - t0


# With dist.context_parallel = 2 the two ranks are one group: the other rank's next ring exchange
# ("ring send/receive") or collective, whichever it reaches first, fails the same way.
FAULT_DIST = [{}, {"context_parallel": 2}]
FAULT_IDS = ["dp", "cp"]


@needs_mpi
@pytest.mark.parametrize("dist", FAULT_DIST, ids=FAULT_IDS)
def test_killed_rank_ends_the_job(tmp_path, shards, dist):
    p, pids = start_long_run(tmp_path, shards, timeout_s=10, through_env=True, dist=dist)
    os.kill(pids[1], signal.SIGKILL)
    rc, err, _ = wait_exit(p, 60)
    assert rc != 0
    assert "rank 1" in err or "signal 9" in err, err[-2000:]


@needs_mpi
@pytest.mark.parametrize("dist", FAULT_DIST, ids=FAULT_IDS)
def test_hung_rank_ends_the_job_after_the_timeout(tmp_path, shards, dist):
    # A stopped rank never enters the next collective: rank 0 waits dist.timeout seconds, says
    # what timed out, and MPI_Abort ends the job (the stopped rank included).
    p, pids = start_long_run(tmp_path, shards, timeout_s=3, through_env=False, dist=dist)
    os.kill(pids[1], signal.SIGSTOP)
    try:
        rc, err, waited = wait_exit(p, 60)
    finally:
        try:
            os.kill(pids[1], signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert rc != 0
    assert "rank 0 of 2" in err and "did not complete within 3 s" in err, err[-2000:]
    assert waited >= 2.5
