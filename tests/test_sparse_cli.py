"""attention.sparse through the command line on the CPU backend: parameters that do not fit the
sequence (a band or global tokens beyond train.seq_len, more random blocks than blocks) and the
naive implementation are refused by `train` and `bench` with exit code 2 and a message naming the
key, before anything is written; a sparse checkpoint samples greedily the same text with and
without --no-split; `bench --attention --no-dense` times the sparse call alone."""
import json
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("TRAIN_GPT", os.path.join(ROOT, "train_gpt"))

TINY = {
    "model": {"n_layer": 2, "n_head": 4, "n_kv_head": 2, "n_embd": 32, "vocab_size": 16, "max_seq_len": 640,
              "pos_embedding": "rope"},
    "data": {"synthetic": "markov"},
    "train": {"batch_size": 1, "seq_len": 512, "steps": 2, "seed": 7},
    "precision": {"dtype": "fp32"},
    "attention": {"sparse": "bigbird", "sparse_band": 128, "sparse_global": 128, "sparse_random": 1},
    "log": {"every": 1, "sample_every": 0, "checkpoint_every": 2, "keep_checkpoints": 1},
}


def run(args):
    return subprocess.run([BIN] + args, capture_output=True, text=True, cwd=ROOT, timeout=300)


def write_config(tmp_path, **sections):
    cfg = json.loads(json.dumps(TINY))
    for name, values in sections.items():
        cfg[name].update(values)
    cfg["log"]["dir"] = str(tmp_path / "run")
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg))
    return path


@pytest.mark.parametrize("sets,needle", [
    (["attention.sparse_band=1024"], "attention.sparse_band (1024 tokens) does not fit train.seq_len (512)"),
    (["attention.sparse_global=640"], "attention.sparse_global (640 tokens) does not fit train.seq_len"),
    (["attention.sparse_random=5"], "attention.sparse_random (5 blocks) is more than the 4 blocks"),
    (["attention.sparse=strided", "attention.sparse_stride=1024"], "attention.sparse_stride (1024 tokens)"),
    (["attention.impl=naive"], "needs attention.impl = flash"),
])
@pytest.mark.parametrize("command", ["train", "bench"])
def test_bad_sparse_parameters_exit_2(tmp_path, command, sets, needle):
    path = write_config(tmp_path)
    args = [command, "-c", str(path), "--device", "cpu"] + [a for s in sets for a in ("--set", s)]
    r = run(args + (["--steps", "1"] if command == "bench" else []))
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert needle in r.stderr, r.stderr
    assert not os.path.exists(tmp_path / "run")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sparse_sample")
    r = run(["train", "-c", str(write_config(tmp)), "--device", "cpu"])
    assert r.returncode == 0, r.stderr
    return os.path.join(str(tmp / "run"), "ckpt_00000002")


def sample(ckpt, *args):
    r = run(["sample", "--checkpoint", ckpt, "--device", "cpu", "--temperature", "0"] + list(args))
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_sparse_greedy_sample_is_the_same_without_the_split(ckpt):
    # 400 tokens: from position 256 on, each step skips a block (band and global are one each).
    one = sample(ckpt, "--tokens", "400")
    assert one.count("<") >= 400
    assert sample(ckpt, "--tokens", "400", "--no-split") == one



def test_bench_attention_no_dense(tmp_path):
    """--no-dense times the sparse call alone (the dense one takes seconds per pass at 1M tokens)."""
    path = write_config(tmp_path)
    r = run(["bench", "-c", str(path), "--device", "cpu", "--attention", "--no-dense", "--steps", "1"])
    assert r.returncode == 0, r.stderr
    assert "sparse bigbird" in r.stdout and "batch 1 x seq 512" in r.stdout and "dense forward" not in r.stdout
    assert "x dense" not in r.stdout, r.stdout
    r = run(["bench", "-c", str(path), "--device", "cpu", "--attention", "--no-dense", "--steps", "1",
             "--set", "attention.sparse=none"])
    assert r.returncode == 2 and "--no-dense" in r.stderr, r.stderr
