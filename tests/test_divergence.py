"""The divergence guard (train.divergence_steps, train.divergence_factor) through ./train_gpt on
the CPU backend, with a real input: a token shard whose windows repeat a short cycle, which the
model learns within a few steps, except one window of tokens the cycle never uses. Reading it
makes the loss jump far above the running mean: the run goes back to its newest checkpoint,
replays the steps after it bitwise, skips that window, and trains on; metrics.jsonl records the
divergence and the skip. An lr far too high diverges again before the next checkpoint: the guard
stops the run with exit code 1 instead of looping. With the guard off the same shard trains
through the spike."""
import json
import os
import struct
import subprocess

from launch import ROOT, command, env

V, T = 16, 16
BAD_WINDOW = 24   # step 25 reads it (batch 1, one rank, windows in order)


def write_shard(path, tokens):
    header = struct.pack("<256i", *([20240520, 1, len(tokens)] + [0] * 253))
    with open(path, "wb") as f:
        f.write(header + struct.pack("<%dH" % len(tokens), *tokens))


def shard(tmp_path):
    """Windows of the cycle 0 1 2 3; window BAD_WINDOW's targets are tokens 8..15 instead."""
    n = 60 * T + 1
    tokens = [i % 4 for i in range(n)]
    for i in range(BAD_WINDOW * T + 1, (BAD_WINDOW + 1) * T):
        tokens[i] = 8 + (i * 5) % 8
    path = tmp_path / "cycle.bin"
    write_shard(path, tokens)
    return str(path)


def config(tmp_path, name, **train):
    cfg = {"model": {"n_layer": 1, "n_head": 2, "n_embd": 32, "vocab_size": V, "max_seq_len": T},
           "data": {"train": shard(tmp_path)},
           "train": {"batch_size": 1, "seq_len": T, "steps": 40, "seed": 5, "divergence_steps": 1,
                     "divergence_factor": 3, **train},
           "optim": {"lr": 1e-2, "min_lr": 1e-2, "warmup_steps": 0, "schedule": "constant"},
           "precision": {"dtype": "fp32"},
           "log": {"dir": str(tmp_path / name), "every": 10, "eval_every": 0, "sample_every": 0,
                   "sample_tokens": 4, "checkpoint_every": 10, "keep_checkpoints": 5}}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(cfg))
    return str(path), cfg["log"]["dir"]


def run(path, *sets):
    args = ["train", "-c", path, "--device", "cpu"]
    for s in sets:
        args += ["--set", s]
    return subprocess.run(command(args), capture_output=True, text=True, cwd=ROOT, timeout=300, env=env())


def events(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_spike_goes_back_and_skips_the_window(tmp_path):
    path, run_dir = config(tmp_path, "guarded")
    r = run(path)
    assert r.returncode == 0, r.stderr
    ev = events(run_dir)
    div = [e for e in ev if e["event"] == "divergence"]
    assert len(div) == 1, div
    d = div[0]
    assert d["step"] == 25 and d["first_step"] == 25 and d["resume_step"] == 20
    assert d["checkpoint"] == os.path.join(run_dir, "ckpt_00000020")
    assert (d["skip_from"], d["skip_to"]) == (BAD_WINDOW, BAD_WINDOW + 1)
    assert "back to %s (step 20)" % d["checkpoint"] in r.stdout
    skips = [e for e in ev if e["event"] == "skip_data"]
    assert [(e["step"], e["from"], e["to"]) for e in skips] == [(25, BAD_WINDOW, BAD_WINDOW + 1)]
    train = [e for e in ev if e["event"] == "train"]
    first = {e["step"]: e["loss"] for e in train[:25]}
    again = {e["step"]: e["loss"] for e in train[25:]}
    assert sorted(again) == list(range(21, 41))
    assert first[25] > 3 * max(first[s] for s in range(20, 25))   # the spike
    for s in range(21, 25):   # replayed from the checkpoint: the same steps, bitwise
        assert again[s] == first[s], (s, again[s], first[s])
    assert again[25] < first[25] / 3 and max(again.values()) < first[25] / 3


def test_off_trains_through_the_spike(tmp_path):
    path, run_dir = config(tmp_path, "off", divergence_steps=0)
    r = run(path)
    assert r.returncode == 0, r.stderr
    ev = events(run_dir)
    assert not [e for e in ev if e["event"] in ("divergence", "skip_data")]
    assert [e["step"] for e in ev if e["event"] == "train"] == list(range(1, 41))
    assert not os.path.exists(os.path.join(run_dir, "ckpt_00000000"))   # no step-0 checkpoint


def test_diverging_again_before_a_checkpoint_stops_the_run(tmp_path):
    # lr 10 makes every step after the first explode: the guard goes back to the step-0
    # checkpoint a fresh guarded run writes, skips the data, diverges again, and gives up.
    path, run_dir = config(tmp_path, "hot", divergence_steps=2)
    r = run(path, "optim.lr=10", "optim.min_lr=10")
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "diverged again" in r.stderr and "optim.lr" in r.stderr
    ev = events(run_dir)
    div = [e for e in ev if e["event"] == "divergence"]
    assert len(div) == 1 and div[0]["resume_step"] == 0, div
    assert div[0]["checkpoint"] == os.path.join(run_dir, "ckpt_00000000")
    s = subprocess.run(command(["sample", "--checkpoint", div[0]["checkpoint"], "--tokens", "2"]),
                       capture_output=True, text=True, cwd=ROOT, timeout=120, env=env())
    assert s.returncode == 0, s.stderr   # the checkpoint it went back to is intact
