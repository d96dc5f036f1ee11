"""`train_gpt sample --batch N` on the CPU backend, from a tiny checkpoint: N sequences decoded
together print under '--- sample i ---' lines, sequence i being the --batch 1 sample of seed S + i
(greedy: all of them the greedy sample); tokens/s goes to stderr, so stdout holds the samples
alone; --no-split (the training attention path) gives the same text; bad values exit 2 with a
message and print nothing on stdout."""
import json
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("TRAIN_GPT", os.path.join(ROOT, "train_gpt"))

TINY = {
    "model": {"n_layer": 2, "n_head": 4, "n_kv_head": 2, "n_embd": 32, "vocab_size": 16, "max_seq_len": 32,
              "pos_embedding": "rope"},
    "data": {"synthetic": "markov"},
    "train": {"batch_size": 4, "seq_len": 32, "steps": 10, "seed": 7},
    "precision": {"dtype": "fp32"},
    "log": {"every": 10, "sample_every": 0, "checkpoint_every": 10, "keep_checkpoints": 1},
}


def run(args):
    return subprocess.run([BIN] + args, capture_output=True, text=True, cwd=ROOT, timeout=300)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sample_batch")
    cfg = json.loads(json.dumps(TINY))
    cfg["log"]["dir"] = str(tmp / "run")
    path = tmp / "cfg.json"
    path.write_text(json.dumps(cfg))
    r = run(["train", "-c", str(path), "--device", "cpu"])
    assert r.returncode == 0, r.stderr
    return os.path.join(cfg["log"]["dir"], "ckpt_00000010")


def samples(stdout, n):
    """The n samples of a --batch n run, in order."""
    parts = re.split(r"^--- sample (\d+) ---\n", stdout, flags=re.M)
    assert parts[0] == "" and [int(i) for i in parts[1::2]] == list(range(n)), stdout
    return parts[2::2]


def sample(ckpt, *args):
    r = run(["sample", "--checkpoint", ckpt, "--device", "cpu", "--tokens", "20"] + list(args))
    assert r.returncode == 0, r.stderr
    assert re.search(r"sample: \d+ x 20 tokens \(prompt 1\) in [0-9.]+ s: [0-9.]+ tokens/s", r.stderr), r.stderr
    return r.stdout


def test_greedy_batch_repeats_the_single_sample(ckpt):
    one = sample(ckpt, "--temperature", "0")
    assert one.count("<") >= 20 and "tokens/s" not in one
    assert samples(sample(ckpt, "--temperature", "0", "--batch", "3"), 3) == [one] * 3
    assert sample(ckpt, "--temperature", "0", "--no-split") == one


def test_sequence_i_draws_with_seed_plus_i(ckpt):
    batch = samples(sample(ckpt, "--seed", "5", "--batch", "3"), 3)
    singles = [sample(ckpt, "--seed", str(5 + i)) for i in range(3)]
    assert batch == singles
    assert len(set(batch)) > 1  # different draws, not one sample repeated


def test_context_starts_later(ckpt):
    r = run(["sample", "--checkpoint", ckpt, "--device", "cpu", "--tokens", "50", "--context", "20"])
    assert r.returncode == 0, r.stderr
    assert re.search(r"sample: 1 x 11 tokens", r.stderr), r.stderr  # positions 21..31 are left


@pytest.mark.parametrize("args,needle", [
    (["--batch", "16777216"], "GiB"),   # the cache alone would need hundreds of GiB
    (["--batch", "0"], "--batch"),
    (["--batch", "two"], "--batch"),
    (["--context", "32"], "--context"),
])
def test_bad_values_exit_2(ckpt, args, needle):
    r = run(["sample", "--checkpoint", ckpt, "--device", "cpu"] + args)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert needle in r.stderr and r.stdout == ""
