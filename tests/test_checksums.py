"""Checkpoint checksums, end to end through ./train_gpt on the CPU backend: a byte changed in
any file of a checkpoint (model.safetensors, optimizer_rank<R>.safetensors, tokenizer.bin,
state.json) is reported as that file being corrupt, with exit code 2, by eval, sample and export;
`train` resuming skips a damaged newest checkpoint with a warning and resumes, bitwise, from the
one before; with none that loads it exits 2; a wrong format tag is refused; a checkpoint written
before checksums (flashgpt-state-1) loads with a notice; with two ranks (mpirun) a damaged shard
that only one rank reads still sends both back to the same checkpoint."""
import json
import os
import re
import shutil
import struct
import subprocess

import pytest

from ckpt_state import write_state
from launch import ROOT, command, env, needs_mpi

V = 16


def run(args, mpi=1):
    return subprocess.run(command(args, mpi), capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env=env())


def write_tokenizer(path):
    """An llm.c tokenizer file (version 2) of V one-letter tokens, no end-of-text."""
    body = b"".join(bytes([1, ord("a") + i]) for i in range(V))
    header = struct.pack("<256I", *([20240328, 2, V, 0xFFFFFFFF] + [0] * 252))
    with open(path, "wb") as f:
        f.write(header + body)


def config(tmp_path, name="run", **log):
    tok = tmp_path / "tok.bin"
    write_tokenizer(tok)
    cfg = {"model": {"n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": V, "max_seq_len": 32},
           "data": {"synthetic": "markov", "tokenizer": str(tok)},
           "train": {"batch_size": 4, "seq_len": 32, "steps": 20, "seed": 7},
           "optim": {"lr": 1e-2, "min_lr": 1e-3, "warmup_steps": 5},
           "precision": {"dtype": "fp32"},
           "log": {"dir": str(tmp_path / name), "every": 10, "eval_every": 0, "eval_tokens": 256,
                   "sample_tokens": 8, "checkpoint_every": 10, "keep_checkpoints": 5, **log}}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(cfg))
    return str(path), cfg["log"]["dir"]


def losses(run_dir):
    out = {}
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for e in map(json.loads, f):
            if e["event"] == "train":
                out[e["step"]] = e["loss"]   # a resumed run's lines win
    return out


def tensor_offset(path):
    """The first byte of a safetensors file's data section (inside its first tensor)."""
    with open(path, "rb") as f:
        return 8 + struct.unpack("<Q", f.read(8))[0]


def flip(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x5A]))


def state_with(ckpt, **changes):
    st = json.load(open(os.path.join(ckpt, "state.json")))
    st.update(changes)
    write_state(ckpt, st)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("trained")
    path, run_dir = config(tmp)
    r = run(["train", "-c", path])
    assert r.returncode == 0, r.stderr
    return tmp, path, run_dir


READERS = {  # command line of each reader of a checkpoint directory, given the copy and a scratch dir
    "eval": lambda ck, tmp: ["eval", "--checkpoint", ck, "--data", str(tmp / "none.bin")],
    "sample": lambda ck, tmp: ["sample", "--checkpoint", ck, "--tokens", "4"],
    "export": lambda ck, tmp: ["export", "--checkpoint", ck, "--format", "hf", "--out", str(tmp / "hf")],
}


@pytest.mark.parametrize("name,where", [("model.safetensors", "tensor"), ("model.safetensors", "header"),
                                        ("state.json", "middle"), ("tokenizer.bin", "middle")])
@pytest.mark.parametrize("reader", sorted(READERS))
def test_a_changed_byte_is_reported_as_corrupt(trained, tmp_path, name, where, reader):
    _, _, run_dir = trained
    ck = str(tmp_path / "ckpt")
    shutil.copytree(os.path.join(run_dir, "ckpt_00000020"), ck)
    path = os.path.join(ck, name)
    size = os.path.getsize(path)
    offset = {"tensor": lambda: tensor_offset(path) + 5, "header": lambda: 20,
              "middle": lambda: size // 2}[where]()
    flip(path, offset)
    r = run(READERS[reader](ck, tmp_path))
    if name == "tokenizer.bin" and reader != "sample":
        # eval and export never read the tokenizer; eval then fails on its missing data instead
        assert "tokenizer.bin" not in r.stderr
        return
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert f"checkpoint {ck}: {name} is corrupt (checksum mismatch)" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "hf").exists()


def test_truncated_file_names_both_sizes(trained, tmp_path):
    _, _, run_dir = trained
    ck = str(tmp_path / "ckpt")
    shutil.copytree(os.path.join(run_dir, "ckpt_00000020"), ck)
    path = os.path.join(ck, "model.safetensors")
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size - 100)
    r = run(READERS["sample"](ck, tmp_path))
    assert r.returncode == 2
    assert f"model.safetensors is corrupt ({size - 100} bytes, state.json records {size}" in r.stderr, r.stderr


@pytest.mark.parametrize("name", ["model.safetensors", "optimizer_rank0.safetensors", "state.json"])
def test_resume_skips_a_damaged_newest_checkpoint(trained, tmp_path, name):
    tmp, _, run_dir = trained
    path, mine = config(tmp_path, "resumed")
    shutil.copytree(run_dir, mine)
    os.remove(os.path.join(mine, "metrics.jsonl"))
    target = os.path.join(mine, "ckpt_00000020", name)
    flip(target, tensor_offset(target) + 7 if name.endswith(".safetensors") else os.path.getsize(target) // 3)
    r = run(["train", "-c", path])
    assert r.returncode == 0, r.stderr
    assert re.search(r"warning: checkpoint \S*ckpt_00000020: %s is corrupt" % re.escape(name), r.stderr), r.stderr
    assert "trying the checkpoint before it" in r.stderr
    assert "resuming from " + os.path.join(mine, "ckpt_00000010") in r.stdout
    # From step 10 the resumed run repeats the original's steps 11..20 bitwise.
    ref = losses(run_dir)
    got = losses(mine)
    assert sorted(got) == list(range(11, 21))
    for s in range(11, 21):
        assert got[s] == ref[s], (s, got[s], ref[s])


def test_no_loadable_checkpoint_exits_2(trained, tmp_path):
    _, _, run_dir = trained
    path, mine = config(tmp_path, "broken")
    shutil.copytree(run_dir, mine)
    for ck in ("ckpt_00000010", "ckpt_00000020"):
        target = os.path.join(mine, ck, "model.safetensors")
        flip(target, tensor_offset(target))
    r = run(["train", "-c", path, "--set", "train.steps=30"])
    assert r.returncode == 2, r.stderr
    assert "no checkpoint in '%s' loads" % mine in r.stderr and "model.safetensors is corrupt" in r.stderr
    assert sorted(os.listdir(mine)) == ["ckpt_00000010", "ckpt_00000020", "config.json", "metrics.jsonl"]


def test_wrong_format_tag_is_refused(trained, tmp_path):
    _, _, run_dir = trained
    ck = str(tmp_path / "ckpt")
    shutil.copytree(os.path.join(run_dir, "ckpt_00000020"), ck)
    state_with(ck, format="flashgpt-state-9")
    r = run(READERS["sample"](ck, tmp_path))
    assert r.returncode == 2 and "state.json has format 'flashgpt-state-9'" in r.stderr, r.stderr


def test_checkpoint_without_checksums_loads_with_a_notice(trained, tmp_path):
    tmp, _, run_dir = trained
    path, mine = config(tmp_path, "old")
    shutil.copytree(run_dir, mine)
    ck = os.path.join(mine, "ckpt_00000020")
    st = json.load(open(os.path.join(ck, "state.json")))
    for key in ("files", "state_sha256", "guard_loss_mean"):
        del st[key]
    st["format"] = "flashgpt-state-1"
    json.dump(st, open(os.path.join(ck, "state.json"), "w"), indent=1)
    r = run(READERS["sample"](ck, tmp_path))
    assert r.returncode == 0, r.stderr
    assert "notice: checkpoint %s was written without checksums" % ck in r.stderr
    r = run(["train", "-c", path, "--set", "train.steps=22"])
    assert r.returncode == 0 and "resuming from " + ck in r.stdout, r.stderr


@needs_mpi
def test_two_ranks_agree_to_skip_a_shard_only_one_reads(tmp_path):
    path, run_dir = config(tmp_path, "two")
    r = run(["train", "-c", path, "--device", "cpu"], mpi=2)
    assert r.returncode == 0, r.stderr[-3000:]
    shard = os.path.join(run_dir, "ckpt_00000020", "optimizer_rank1.safetensors")
    flip(shard, tensor_offset(shard) + 3)   # only rank 1 reads its own shard back
    r = run(["train", "-c", path, "--device", "cpu", "--set", "train.steps=22"], mpi=2)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "optimizer_rank1.safetensors is corrupt (checksum mismatch)" in r.stderr
    assert "resuming from " + os.path.join(run_dir, "ckpt_00000010") in r.stdout
    st = json.load(open(os.path.join(run_dir, "ckpt_00000022", "state.json")))
    assert st["step"] == 22 and sorted(st["files"]) == ["model.safetensors", "optimizer_rank0.safetensors",
                                                          "optimizer_rank1.safetensors", "tokenizer.bin"]
