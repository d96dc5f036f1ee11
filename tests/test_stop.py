"""Graceful stops: SIGTERM or SIGINT makes `train` finish its step, write a checkpoint and exit
with code 3; running the same command again resumes, and the losses of the stopped-and-resumed
run equal an uninterrupted run's bitwise (one process, and two ranks under mpirun where only one
rank gets the signal: both stop after the same step with a complete checkpoint). Copies of the
signal within a second count as one; a second signal (a second or more after the first) ends the
process at once, by that signal, and every ckpt_* directory it leaves is complete and loads (old
ones are renamed to a trash name before they are deleted); leftovers are removed at the next start."""
import json
import os
import signal
import subprocess
import time
import uuid

import pytest

from launch import ROOT, command, env, needs_mpi, rank_pids

EXIT_STOPPED = 3


def config(tmp_path, name, steps=200, **sections):
    cfg = {"model": {"n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 16, "max_seq_len": 32},
           "data": {"synthetic": "markov"},
           "train": {"batch_size": 4, "seq_len": 32, "steps": steps, "seed": 3},
           "optim": {"lr": 1e-2, "min_lr": 1e-3, "warmup_steps": 5},
           "precision": {"dtype": "fp32"},
           "log": {"dir": str(tmp_path / name), "every": 50, "eval_every": 0, "eval_tokens": 256,
                   "sample_every": 0, "sample_tokens": 4, "checkpoint_every": 0, "keep_checkpoints": 3}}
    for sec, kv in sections.items():
        cfg[sec].update(kv)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(cfg))
    return str(path), cfg["log"]["dir"]


def events(run_dir, kind="train"):
    try:
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            return [e for e in map(json.loads, f) if e["event"] == kind]
    except (OSError, ValueError):   # not yet written, or a line being written
        return []


def losses(run_dir):
    return {e["step"]: e["loss"] for e in events(run_dir)}   # a resumed run's lines win


def run(path, ranks=1):
    r = subprocess.run(command(["train", "-c", path, "--device", "cpu"], ranks), capture_output=True,
                       text=True, cwd=ROOT, timeout=600, env=env())
    return r


def start(path, ranks=1):
    tag = uuid.uuid4().hex
    p = subprocess.Popen(command(["train", "-c", path, "--device", "cpu"], ranks, tag), cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env(FLASHGPT_TEST_JOB=tag))
    return p, tag


def wait_steps(p, run_dir, n, bound=120):
    deadline = time.monotonic() + bound
    while len(events(run_dir)) < n:
        assert p.poll() is None, p.communicate()[1][-2000:]
        assert time.monotonic() < deadline, f"fewer than {n} steps after {bound} s"
        time.sleep(0.02)


def pending(pid, sig):
    """Whether sig is still waiting to be delivered to pid (its pending masks in /proc)."""
    bit = 1 << (sig - 1)
    with open(f"/proc/{pid}/status") as f:
        masks = [int(line.split()[1], 16) for line in f if line.startswith(("SigPnd:", "ShdPnd:"))]
    return any(m & bit for m in masks)


def check_stopped(p, run_dir, total):
    out, err = p.communicate(timeout=300)
    assert p.returncode == EXIT_STOPPED, (p.returncode, err[-3000:])
    stops = events(run_dir, "stop")
    assert len(stops) == 1, stops
    k = stops[0]["step"]
    assert 0 < k < total and f"stopped by a signal after step {k} of {total}" in out
    ckpt = os.path.join(run_dir, "ckpt_%08d" % k)
    assert json.load(open(os.path.join(ckpt, "state.json")))["step"] == k
    assert max(losses(run_dir)) == k   # no step ran after the one it stopped after
    return k, ckpt


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_with_a_checkpoint_and_resumes_bitwise(tmp_path, sig):
    ref_path, ref_dir = config(tmp_path, "ref")
    r = run(ref_path)
    assert r.returncode == 0, r.stderr
    path, run_dir = config(tmp_path, "stopped")
    p, _ = start(path)
    wait_steps(p, run_dir, 20)
    p.send_signal(sig)
    p.send_signal(sig)   # a copy within the second (srun forwards what Slurm also sent): one stop
    k, ckpt = check_stopped(p, run_dir, 200)
    r = run(path)
    assert r.returncode == 0, r.stderr
    assert f"resuming from {ckpt} (step {k})" in r.stdout
    ref, got = losses(ref_dir), losses(run_dir)
    assert sorted(got) == sorted(ref) == list(range(1, 201))
    for s in ref:
        assert got[s] == ref[s], (s, got[s], ref[s])


@needs_mpi
def test_two_ranks_stop_after_the_same_step_when_one_is_signalled(tmp_path):
    ref_path, ref_dir = config(tmp_path, "ref")
    r = run(ref_path, ranks=2)
    assert r.returncode == 0, r.stderr[-3000:]
    path, run_dir = config(tmp_path, "stopped")
    p, tag = start(path, ranks=2)
    wait_steps(p, run_dir, 20)
    pids = rank_pids(tag)
    assert sorted(pids) == [0, 1], pids
    os.kill(pids[1], signal.SIGTERM)   # rank 1 alone: the stop travels with the step's all-reduce
    k, ckpt = check_stopped(p, run_dir, 200)
    assert sorted(f for f in os.listdir(ckpt) if f.startswith("optimizer")) == \
        ["optimizer_rank0.safetensors", "optimizer_rank1.safetensors"]
    r = run(path, ranks=2)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"resuming from {ckpt} (step {k})" in r.stdout
    ref, got = losses(ref_dir), losses(run_dir)
    assert sorted(got) == list(range(1, 201))
    for s in ref:
        assert got[s] == ref[s], (s, got[s], ref[s])


def test_second_signal_exits_at_once_and_checkpoints_stay_intact(tmp_path):
    # Long steps (grad_accum 200, so that a step outlasts the 50 ms before the freeze on a
    # 16-core machine too) and a checkpoint after each: the first SIGTERM lands just after a
    # step. Once it is delivered the process is frozen (SIGSTOP) for 1.5 s, so the SIGINT that is
    # pending when it thaws comes well after the first signal: a second request, not a copy of
    # the first, and it must end the process before that step finishes.
    path, run_dir = config(tmp_path, "twice", steps=1000, train={"grad_accum": 200},
                           log={"checkpoint_every": 1, "keep_checkpoints": 2})
    p, _ = start(path)
    wait_steps(p, run_dir, 2)
    n = len(events(run_dir))
    while len(events(run_dir)) == n:   # the next step has just finished
        time.sleep(0.005)
    p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    while pending(p.pid, signal.SIGTERM):
        assert time.monotonic() < deadline, "SIGTERM was not delivered"
        time.sleep(0.001)
    time.sleep(0.05)   # its handler has run
    p.send_signal(signal.SIGSTOP)
    time.sleep(1.5)
    p.send_signal(signal.SIGINT)
    thawed = time.monotonic()
    p.send_signal(signal.SIGCONT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == -signal.SIGINT, (p.returncode, out[-1000:], err[-2000:])
    assert time.monotonic() - thawed < 5
    assert not events(run_dir, "stop")   # it did not get to finish the stop
    ckpts = sorted(d for d in os.listdir(run_dir) if d.startswith("ckpt_"))
    assert ckpts
    for d in ckpts:   # every complete checkpoint loads, verified against its checksums
        s = subprocess.run(command(["sample", "--checkpoint", os.path.join(run_dir, d), "--tokens", "2"]),
                           capture_output=True, text=True, cwd=ROOT, timeout=120, env=env())
        assert s.returncode == 0, (d, s.stderr)
    r = subprocess.run(command(["train", "-c", path, "--set", "train.steps=%d" % (int(ckpts[-1][5:]) + 1)]),
                       capture_output=True, text=True, cwd=ROOT, timeout=300, env=env())
    assert r.returncode == 0 and "resuming from " + os.path.join(run_dir, ckpts[-1]) in r.stdout, r.stderr
    assert not [d for d in os.listdir(run_dir) if d.startswith((".trash-", ".tmp-"))]   # cleared at start


def test_leftover_trash_and_tmp_directories_are_ignored_and_removed(tmp_path):
    # What a process ended while deleting an old checkpoint, or while writing one, leaves behind:
    # named after later steps than any complete checkpoint and holding a broken state.json, they
    # must not be resumed from (nor tried), and the next run removes them before it writes.
    path, run_dir = config(tmp_path, "leftovers", steps=6, log={"checkpoint_every": 3, "keep_checkpoints": 2})
    r = run(path)
    assert r.returncode == 0, r.stderr
    assert sorted(d for d in os.listdir(run_dir) if d.startswith("ckpt_")) == ["ckpt_00000003", "ckpt_00000006"]
    for name in (".trash-ckpt_00000099", ".tmp-ckpt_00000098"):
        os.makedirs(os.path.join(run_dir, name, "sub"))
        with open(os.path.join(run_dir, name, "state.json"), "w") as f:
            f.write("{ half a file")
    r = subprocess.run(command(["train", "-c", path, "--device", "cpu", "--set", "train.steps=8"]),
                       capture_output=True, text=True, cwd=ROOT, timeout=300, env=env())
    assert r.returncode == 0, r.stderr
    assert "resuming from " + os.path.join(run_dir, "ckpt_00000006") + " (step 6)" in r.stdout
    assert "trying the checkpoint before it" not in r.stderr   # nothing else was read
    left = sorted(os.listdir(run_dir))
    assert not [d for d in left if d.startswith((".trash-", ".tmp-"))], left
    assert [d for d in left if d.startswith("ckpt_")] == ["ckpt_00000006", "ckpt_00000008"], left


SLURM_SRUN = r"""#!/usr/bin/env python3
# A stand-in for srun: one task, run here on the CPU; forwards SIGTERM to it, exits with its code.
import os, signal, subprocess, sys
args = [a for a in sys.argv[1:] if not a.startswith("--kill-on-bad-exit") and not a.startswith("--cpu-bind")]
args = ["cpu" if a == "cuda" else a for a in args]
args[0] = os.environ["TRAIN_GPT_UNDER_TEST"]
child = subprocess.Popen(args, env={**os.environ, "SLURM_PROCID": "0", "SLURM_LOCALID": "0"})
signal.signal(signal.SIGTERM, lambda *_: child.send_signal(signal.SIGTERM))
sys.exit(child.wait())
"""
SLURM_SCONTROL = """#!/usr/bin/env bash
# A stand-in for scontrol: hostnames of the allocation, and requeue requests logged.
if [ "$1" = show ]; then echo localhost; else echo "$@" >> "$SCONTROL_LOG"; fi
"""


def test_slurm_script_forwards_sigterm_and_requeues(tmp_path):
    # scripts/launch_slurm.sh as sbatch runs it, with srun and scontrol stand-ins on PATH: the
    # SIGTERM that --signal=B:TERM sends the batch script reaches the task, which checkpoints and
    # exits 3, and the script requeues the job.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("srun", SLURM_SRUN), ("scontrol", SLURM_SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    path, run_dir = config(tmp_path, "slurm")
    log = tmp_path / "scontrol.log"
    e = env(PATH=f"{bin_dir}:{os.environ['PATH']}", SLURM_JOB_ID="4242", SLURM_JOB_NODELIST="localhost",
            SLURM_NTASKS="1", SLURM_JOB_NUM_NODES="1", SLURM_SUBMIT_DIR=ROOT, SCONTROL_LOG=str(log),
            TRAIN_GPT_UNDER_TEST=command([])[0])
    for var in ("SLURM_PROCID", "SLURM_LOCALID"):
        e.pop(var, None)
    p = subprocess.Popen(["bash", os.path.join(ROOT, "scripts", "launch_slurm.sh"), path], cwd=ROOT, env=e,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_steps(p, run_dir, 20)
    p.send_signal(signal.SIGTERM)
    k, ckpt = check_stopped(p, run_dir, 200)
    assert log.read_text().split() == ["requeue", "4242"]
