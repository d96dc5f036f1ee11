"""Models that move between flashgpt, llm.c and Hugging Face (./train_gpt export / import, CPU).

- A model trained by ./train_gpt, exported to Hugging Face format, matches the checkpoint bitwise
  (Conv1D transposes, unpadded vocabulary), and imported back gives the same checkpoint bitwise.
- The exported directory, run through an independent float64 PyTorch GPT-2 written here in
  Hugging Face's layout (x @ W + b), gives the loss `train_gpt eval` reports for the checkpoint.
- llm.c model files (version 3 fp32, version 5 bf16, a padded vocabulary) written here from numpy
  import with the right loss and greedy tokens, and their weights land bitwise where they belong.
- Bad input: exit code 2, a message naming the file and the problem, no output left behind.
transformers itself is not needed here; scripts/check_hf_export.py runs the real thing on the
GPU machine."""
import json
import os
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import data_files  # noqa: E402,F401  (GPT-2's files in data_cache/, where prepare looks)
from ckpt_state import write_state  # noqa: E402
from oracle_st import read_safetensors  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("TRAIN_GPT", os.path.join(ROOT, "train_gpt"))
LLMC_MAGIC = 20240326
SHARD_MAGIC = 20240520

TINY = {
    "model": {"n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 16, "max_seq_len": 32},
    "data": {"synthetic": "markov"},
    "train": {"batch_size": 4, "seq_len": 32, "steps": 6, "seed": 3},
    "optim": {"lr": 1e-2, "min_lr": 1e-3},
    "precision": {"dtype": "fp32"},
    "log": {"every": 10, "sample_tokens": 4},
}

# The CPU backend computes in fp32, the references in float64. Over these tiny models (C <= 48,
# two or three blocks) an fp32 forward differs from float64 by a few ulp of the logits, ~1e-6 in
# the mean loss; eval prints 6 decimals (rounding 5e-7). 2e-5 leaves a 10x margin over both
# while a single misplaced or untransposed tensor moves the loss by 1e-2 or more.
LOSS_TOL = 2e-5


# Tiny models: one thread is fastest, and OpenMP threads spinning on a loaded CI machine are not.
ENV = dict(os.environ, OMP_NUM_THREADS="1")


def run(args, cwd=ROOT):
    return subprocess.run([BIN] + args, capture_output=True, text=True, cwd=cwd, timeout=300, env=ENV)


def ok(args):
    r = run(args)
    assert r.returncode == 0, f"{args}: rc {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r.stdout


def train_tiny(tmp_path, name="run", **model):
    cfg = json.loads(json.dumps(TINY))
    cfg["model"].update(model)
    cfg["log"]["dir"] = str(tmp_path / name)
    p = tmp_path / f"{name}.json"
    p.write_text(json.dumps(cfg))
    ok(["train", "-c", str(p), "--device", "cpu"])
    return str(tmp_path / name / f"ckpt_{cfg['train']['steps']:08d}")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return train_tiny(tmp_path_factory.mktemp("trained"))


def write_shard(path, tokens):
    header = np.zeros(256, np.int32)
    header[:3] = [SHARD_MAGIC, 1, len(tokens)]
    with open(path, "wb") as f:
        f.write(header.tobytes() + np.asarray(tokens, np.uint16).tobytes())


def eval_loss(ckpt, shard):
    out = ok(["eval", "--checkpoint", ckpt, "--data", shard, "--device", "cpu"])
    return float(out.split("val_loss:")[1].split()[0])


def greedy(ckpt, n):
    """Token ids ./train_gpt samples greedily from start token 0 (no tokenizer: '<id>' text)."""
    out = ok(["sample", "--checkpoint", ckpt, "--tokens", str(n), "--temperature", "0", "--device", "cpu"])
    return [int(s) for s in out.strip().lstrip("<").rstrip(">").split("><")]


def write_safetensors(path, tensors, meta=None):
    """tensors: name -> (dtype name, numpy array of the stored bits)."""
    header, blobs, pos = {}, [], 0
    for name, (dt, arr) in tensors.items():
        b = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [pos, pos + len(b)]}
        blobs.append(b)
        pos += len(b)
    if meta is not None:
        header["__metadata__"] = meta
    text = json.dumps(header).encode()
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def to_bf16_bits(x):
    """fp32 -> bf16 bits, round to nearest even (finite inputs)."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def from_bf16_bits(b):
    return (b.astype(np.uint32) << 16).view(np.float32)


# ---------------------------------------------------------------------------------------------
# An independent GPT-2 in Hugging Face's layout (Conv1D: y = x @ W + b), float64.

def hf_forward(w, cfg, tokens):
    """Logits (T, V) of a Hugging Face GPT-2 state dict w (names without 'transformer.')."""
    d = {k: torch.tensor(np.asarray(v, np.float64)) for k, v in w.items()}
    C, NH, L = cfg["n_embd"], cfg["n_head"], cfg["n_layer"]
    HS = C // NH
    T = len(tokens)
    x = d["wte.weight"][torch.tensor(tokens)] + d["wpe.weight"][:T]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for l in range(L):
        p = lambda n: d[f"h.{l}.{n}"]  # noqa: E731
        h = F.layer_norm(x, (C,), p("ln_1.weight"), p("ln_1.bias"), 1e-5)
        q, k, v = (h @ p("attn.c_attn.weight") + p("attn.c_attn.bias")).split(C, dim=-1)
        q, k, v = (t.view(T, NH, HS).transpose(0, 1) for t in (q, k, v))
        att = (q @ k.transpose(-1, -2)) / np.sqrt(HS)
        att = att.masked_fill(~causal, float("-inf")).softmax(-1)
        y = (att @ v).transpose(0, 1).reshape(T, C)
        x = x + y @ p("attn.c_proj.weight") + p("attn.c_proj.bias")
        h = F.layer_norm(x, (C,), p("ln_2.weight"), p("ln_2.bias"), 1e-5)
        f = F.gelu(h @ p("mlp.c_fc.weight") + p("mlp.c_fc.bias"), approximate="tanh")
        x = x + f @ p("mlp.c_proj.weight") + p("mlp.c_proj.bias")
    x = F.layer_norm(x, (C,), d["ln_f.weight"], d["ln_f.bias"], 1e-5)
    return x @ d["wte.weight"].T


def windows_loss(w, cfg, tokens, T):
    """Mean cross-entropy over the windows eval reads: inputs [iT, iT+T), targets shifted by one."""
    total, count = 0.0, 0
    for i in range((len(tokens) - 1) // T):
        seq = tokens[i * T:i * T + T + 1]
        logits = hf_forward(w, cfg, seq[:-1])
        total += F.cross_entropy(logits, torch.tensor(seq[1:]), reduction="sum").item()
        count += T
    return total / count


def reference_greedy(w, cfg, n):
    seq, gaps = [0], []
    for _ in range(n):
        logits = hf_forward(w, cfg, seq)[-1]
        top = logits.topk(2).values
        gaps.append((top[0] - top[1]).item())
        seq.append(int(logits.argmax()))
    return seq[1:], min(gaps)


def read_hf(dirname):
    tensors, meta = read_safetensors(os.path.join(dirname, "model.safetensors"))
    with open(os.path.join(dirname, "config.json")) as f:
        return tensors, meta, json.load(f)


def strip(tensors):
    return {k[len("transformer."):] if k.startswith("transformer.") else k: v for k, v in tensors.items()}


LAYER_NAMES = [  # ours, Hugging Face, stored transposed
    ("ln1.weight", "ln_1.weight", False), ("ln1.bias", "ln_1.bias", False),
    ("attn.qkv.weight", "attn.c_attn.weight", True), ("attn.qkv.bias", "attn.c_attn.bias", False),
    ("attn.proj.weight", "attn.c_proj.weight", True), ("attn.proj.bias", "attn.c_proj.bias", False),
    ("ln2.weight", "ln_2.weight", False), ("ln2.bias", "ln_2.bias", False),
    ("mlp.fc.weight", "mlp.c_fc.weight", True), ("mlp.fc.bias", "mlp.c_fc.bias", False),
    ("mlp.proj.weight", "mlp.c_proj.weight", True), ("mlp.proj.bias", "mlp.c_proj.bias", False),
]


def ours_to_hf(ours, V, L):
    hf = {"wte.weight": ours["wte"][:V], "wpe.weight": ours["wpe"],
          "ln_f.weight": ours["lnf.weight"], "ln_f.bias": ours["lnf.bias"]}
    for l in range(L):
        for o, h, tr in LAYER_NAMES:
            a = ours[f"h.{l}.{o}"]
            hf[f"h.{l}.{h}"] = a.T if tr else a
    return hf


# ---------------------------------------------------------------------------------------------
# Hugging Face export and import

def test_help_and_usage():
    for cmd in ("export", "import"):
        r = run([cmd, "--help"])
        assert r.returncode == 0 and "usage: train_gpt " + cmd in r.stdout
    r = run(["--help"])
    assert "export" in r.stdout and "import" in r.stdout


def test_hf_export_is_the_checkpoint_bitwise(trained, tmp_path):
    out = str(tmp_path / "hf")
    ok(["export", "--checkpoint", trained, "--format", "hf", "--out", out])
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]
    tensors, meta, cfg = read_hf(out)
    assert meta.get("format") == "pt"   # transformers refuses safetensors without it
    ours, _ = read_safetensors(os.path.join(trained, "model.safetensors"))
    m = TINY["model"]
    V, L = m["vocab_size"], m["n_layer"]
    assert all(k.startswith("transformer.") for k in tensors) and "lm_head.weight" not in tensors
    want = ours_to_hf(ours, V, L)
    assert set(strip(tensors)) == set(want)
    for name, arr in strip(tensors).items():
        assert arr.dtype == np.float32 and arr.shape == want[name].shape, name
        assert np.array_equal(arr, want[name]), name
    assert not ours["wte"][V:].any()   # the padded rows that export drops hold nothing
    assert cfg["model_type"] == "gpt2" and cfg["architectures"] == ["GPT2LMHeadModel"]
    assert (cfg["n_embd"], cfg["n_layer"], cfg["n_head"], cfg["n_positions"], cfg["vocab_size"]) == (
        m["n_embd"], m["n_layer"], m["n_head"], m["max_seq_len"], V)
    assert cfg["activation_function"] == "gelu_new" and cfg["layer_norm_epsilon"] == 1e-5
    assert cfg["tie_word_embeddings"] is True


def test_hf_round_trip_is_bitwise(trained, tmp_path):
    hf, back, hf2 = (str(tmp_path / n) for n in ("hf", "back", "hf2"))
    ok(["export", "--checkpoint", trained, "--format", "hf", "--out", hf])
    ok(["import", "--from", "hf", hf, "--out", back])
    assert sorted(os.listdir(back)) == ["model.safetensors", "optimizer_rank0.safetensors", "state.json"]
    a, _ = read_safetensors(os.path.join(trained, "model.safetensors"))
    b, meta = read_safetensors(os.path.join(back, "model.safetensors"))
    assert set(a) == set(b)
    for k in a:
        assert np.array_equal(a[k], b[k]), k
    opt, _ = read_safetensors(os.path.join(back, "optimizer_rank0.safetensors"))
    assert not opt["m"].any() and not opt["v"].any()
    state = json.load(open(os.path.join(back, "state.json")))
    assert state["step"] == 0 and state["config"]["model"]["n_layer"] == TINY["model"]["n_layer"]
    ok(["export", "--checkpoint", back, "--format", "hf", "--out", hf2])
    assert open(os.path.join(hf, "model.safetensors"), "rb").read() == \
        open(os.path.join(hf2, "model.safetensors"), "rb").read()


def test_hf_export_logits_match_flashgpt_eval(trained, tmp_path):
    """The exported weights in GPT-2 semantics give the loss flashgpt's own forward gives."""
    hf = str(tmp_path / "hf")
    ok(["export", "--checkpoint", trained, "--format", "hf", "--out", hf])
    tensors, _, cfg = read_hf(hf)
    T = TINY["train"]["seq_len"]
    tokens = np.random.RandomState(5).randint(0, cfg["vocab_size"], 4 * T + 1).tolist()
    shard = str(tmp_path / "val.bin")
    write_shard(shard, tokens)
    ref = windows_loss(strip(tensors), cfg, tokens, T)
    assert abs(eval_loss(trained, shard) - ref) < LOSS_TOL


def hf_dir_variant(src, dst, transform, meta={"format": "pt"}):
    """Copies the Hugging Face directory src to dst, rewriting its tensors through transform."""
    os.makedirs(dst)
    shutil.copy(os.path.join(src, "config.json"), dst)
    tensors, _ = read_safetensors(os.path.join(src, "model.safetensors"))
    write_safetensors(os.path.join(dst, "model.safetensors"), transform(tensors), meta)


def test_hf_import_accepts_plain_names_half_precision_and_buffers(trained, tmp_path):
    hf = str(tmp_path / "hf")
    ok(["export", "--checkpoint", trained, "--format", "hf", "--out", hf])
    L = TINY["model"]["n_layer"]

    def as_original_gpt2(t):
        """Names without prefix (OpenAI's gpt2 files), bf16 and f16 weights, attention buffers, and
        an lm_head tied to wte."""
        out = {}
        for i, (k, v) in enumerate(strip(t).items()):
            out[k] = ("BF16", to_bf16_bits(v)) if i % 2 else ("F16", v.astype(np.float16))
        for l in range(L):
            out[f"h.{l}.attn.bias"] = ("F32", np.tril(np.ones((1, 1, 32, 32), np.float32)))
        out["lm_head.weight"] = out["wte.weight"]
        return out

    variant, back = str(tmp_path / "variant"), str(tmp_path / "back")
    hf_dir_variant(hf, variant, as_original_gpt2)
    ok(["import", "--from", "hf", variant, "--out", back])
    src = as_original_gpt2(read_safetensors(os.path.join(hf, "model.safetensors"))[0])
    got, _ = read_safetensors(os.path.join(back, "model.safetensors"))
    conv = {k: from_bf16_bits(a) if dt == "BF16" else a.astype(np.float32) for k, (dt, a) in src.items()}
    want = ours_to_hf(got, TINY["model"]["vocab_size"], L)
    for k, v in want.items():
        assert np.array_equal(v, conv[k]), k


# ---------------------------------------------------------------------------------------------
# llm.c import

LLMC = {"V": 50, "Vp": 64, "maxT": 24, "L": 3, "NH": 3, "C": 48}


def llmc_params(seed, V, Vp, maxT, L, NH, C):
    """llm.c's parameter tensors in file order. Weights of std 0.3 (not GPT-2's 0.02) spread the
    logits, so greedy decoding has clear winners; padded wte rows hold garbage, which import drops."""
    r = np.random.RandomState(seed)
    n = lambda *s: (0.3 * r.randn(*s)).astype(np.float32)  # noqa: E731
    return [n(Vp, C), n(maxT, C), 1 + n(L, C), n(L, C), n(L, 3 * C, C), n(L, 3 * C), n(L, C, C), n(L, C),
            1 + n(L, C), n(L, C), n(L, 4 * C, C), n(L, 4 * C), n(L, C, 4 * C), n(L, C), 1 + n(C), n(C)]


def write_llmc(path, params, version, V, Vp, maxT, L, NH, C):
    header = np.zeros(256, np.int32)
    header[:8] = [LLMC_MAGIC, version, maxT, V, L, NH, C, Vp]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        for p in params:
            f.write(to_bf16_bits(p).tobytes() if version == 5 else p.tobytes())


def llmc_to_hf(params, V, L):
    wte, wpe, *layer, lnfw, lnfb = params
    hf = {"wte.weight": wte[:V], "wpe.weight": wpe, "ln_f.weight": lnfw, "ln_f.bias": lnfb}
    for l in range(L):
        for (o, h, tr), stacked in zip(LAYER_NAMES, layer):
            hf[f"h.{l}.{h}"] = stacked[l].T if tr else stacked[l]
    return hf


@pytest.mark.parametrize("version", [3, 5])
def test_llmc_import_logits_and_weights(tmp_path, version):
    d = LLMC
    params = llmc_params(11, **d)
    path, ckpt, hf = (str(tmp_path / n) for n in ("model.bin", "ckpt", "hf"))
    write_llmc(path, params, version, **d)
    if version == 5:   # the reference sees what the file holds
        params = [from_bf16_bits(to_bf16_bits(p)) for p in params]
    out = ok(["import", "--from", "llmc", path, "--out", ckpt])
    assert "imported" in out
    want = llmc_to_hf(params, d["V"], d["L"])
    # Bitwise: every weight where it belongs (read back through the Hugging Face export).
    ok(["export", "--checkpoint", ckpt, "--format", "hf", "--out", hf])
    got = strip(read_hf(hf)[0])
    assert set(got) == set(want)
    for k in want:
        assert np.array_equal(got[k], want[k]), k
    ours, _ = read_safetensors(os.path.join(ckpt, "model.safetensors"))
    assert ours["wte"].shape == (128, d["C"]) and not ours["wte"][d["V"]:].any()
    # Logits: the loss eval reports and the greedy tokens against the float64 reference.
    cfg = {"n_embd": d["C"], "n_head": d["NH"], "n_layer": d["L"]}
    T = d["maxT"]   # an import evaluates windows of min(1024, maxT)
    tokens = np.random.RandomState(2).randint(0, d["V"], 3 * T + 1).tolist()
    shard = str(tmp_path / "val.bin")
    write_shard(shard, tokens)
    assert abs(eval_loss(ckpt, shard) - windows_loss(want, cfg, tokens, T)) < LOSS_TOL
    ref, gap = reference_greedy(want, cfg, T - 1)
    # fp32 logits of magnitude ~10 are off by ~1e-5 at most: a smaller top-2 gap could flip argmax.
    assert gap > 1e-4, "the reference has a near-tie: pick another seed"
    assert greedy(ckpt, T - 1) == ref


def test_llmc_import_then_fine_tune_resumes(tmp_path):
    d = dict(LLMC, V=16, Vp=128, maxT=32, L=2, NH=2, C=32)
    path = str(tmp_path / "model.bin")
    write_llmc(path, llmc_params(4, **d), 3, **d)
    run_dir = tmp_path / "ft"
    ok(["import", "--from", "llmc", path, "--out", str(run_dir / "ckpt_00000000")])
    cfg = json.loads(json.dumps(TINY))
    cfg["log"]["dir"] = str(run_dir)
    (tmp_path / "ft.json").write_text(json.dumps(cfg))
    out = ok(["train", "-c", str(tmp_path / "ft.json"), "--device", "cpu"])
    assert "resuming from" in out and "ckpt_00000000" in out
    assert os.path.isdir(run_dir / f"ckpt_{cfg['train']['steps']:08d}")


# ---------------------------------------------------------------------------------------------
# bad input: exit code 2, a message naming the file and the problem, nothing written

def expect_refusal(args, needles, parent):
    before = sorted(os.listdir(parent))
    r = run(args)
    assert r.returncode == 2, f"{args}: rc {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert "error:" in r.stderr
    for n in needles:
        assert n in r.stderr, f"'{n}' not in: {r.stderr}"
    assert sorted(os.listdir(parent)) == before, "output or temporary files left behind"


def llmc_bad(tmp_path, kind):
    d = LLMC
    path = str(tmp_path / "bad.bin")
    write_llmc(path, llmc_params(1, **d), 3, **d)
    blob = bytearray(open(path, "rb").read())
    if kind == "magic":
        blob[0:4] = struct.pack("<i", SHARD_MAGIC)
    elif kind == "version":
        blob[4:8] = struct.pack("<i", 4)
    elif kind == "truncated":
        blob = blob[:-4]
    elif kind == "trailing":
        blob += b"\0\0\0\0"
    elif kind == "header":
        blob = blob[:100]
    elif kind == "vocab":
        blob[28:32] = struct.pack("<i", 10)   # Vp < V
    open(path, "wb").write(bytes(blob))
    return path


@pytest.mark.parametrize("kind,needles", [
    ("magic", ["bad magic 20240520", "token shard"]),
    ("version", ["unsupported version 4"]),
    ("truncated", ["bytes but its header"]),
    ("trailing", ["bytes but its header"]),
    ("header", ["shorter than llm.c's 1024-byte header"]),
    ("vocab", ["bad header", "Vp 10"]),
])
def test_llmc_bad_files(tmp_path, kind, needles):
    path = llmc_bad(tmp_path, kind)
    expect_refusal(["import", "--from", "llmc", path, "--out", str(tmp_path / "out")], [path] + needles, tmp_path)


def test_llmc_missing_file(tmp_path):
    p = str(tmp_path / "nope.bin")
    expect_refusal(["import", "--from", "llmc", p, "--out", str(tmp_path / "out")], [p, "cannot open"], tmp_path)


def drop(name):
    return lambda t: {k: ("F32", v) for k, v in t.items() if k != name}


def reshape_first(name):
    return lambda t: {k: ("F32", v[:-1] if k == name else v) for k, v in t.items()}


def untie(t):
    out = {k: ("F32", v) for k, v in t.items()}
    out["lm_head.weight"] = ("F32", t["transformer.wte.weight"] + 1)
    return out


def stranger(t):
    out = {k: ("F32", v) for k, v in t.items()}
    out["transformer.h.7.attn.c_attn.weight"] = ("F32", t["transformer.h.0.attn.c_attn.weight"])
    return out


@pytest.mark.parametrize("transform,needles", [
    (drop("transformer.h.1.mlp.c_fc.bias"), ["h.1.mlp.c_fc.bias", "missing"]),
    (reshape_first("transformer.h.0.attn.c_attn.weight"), ["h.0.attn.c_attn.weight", "shape (31, 96)",
                                                            "expected (32, 96)"]),
    (untie, ["lm_head.weight differs"]),
    (stranger, ["unexpected tensor 'transformer.h.7.attn.c_attn.weight'"]),
])
def test_hf_bad_tensors(trained, tmp_path, transform, needles):
    hf, bad = str(tmp_path / "hf"), str(tmp_path / "bad")
    ok(["export", "--checkpoint", trained, "--format", "hf", "--out", hf])
    hf_dir_variant(hf, bad, transform)
    expect_refusal(["import", "--from", "hf", bad, "--out", str(tmp_path / "out")],
                   [os.path.join(bad, "model.safetensors")] + needles, tmp_path)


@pytest.mark.parametrize("edit,needles", [
    (lambda c: c.pop("n_head"), ["'n_head' is missing"]),
    (lambda c: c.update(activation_function="relu"), ["activation_function 'relu'"]),
    (lambda c: c.update(layer_norm_epsilon=1e-6), ["layer_norm_epsilon"]),
    (lambda c: c.update(model_type="llama"), ["model_type 'llama'"]),
    (lambda c: c.update(n_embd=64), ["shape"]),
    # Sizes the file does not hold are refused before a model of that size is allocated.
    (lambda c: c.update(n_layer=1000), ["h.999.mlp.c_proj.weight", "missing"]),
    (lambda c: c.update(n_positions=4000000), ["wpe.weight' has shape (32, 32), expected (4000000, 32)"]),
    (lambda c: c.update(scale_attn_by_inverse_layer_idx=True), ["scale_attn_by_inverse_layer_idx"]),
])
def test_hf_bad_config(trained, tmp_path, edit, needles):
    hf = str(tmp_path / "hf")
    ok(["export", "--checkpoint", trained, "--format", "hf", "--out", hf])
    cfg_path = os.path.join(hf, "config.json")
    cfg = json.load(open(cfg_path))
    edit(cfg)
    json.dump(cfg, open(cfg_path, "w"))
    expect_refusal(["import", "--from", "hf", hf, "--out", str(tmp_path / "out")], [hf] + needles, tmp_path)


def test_hf_missing_pieces(trained, tmp_path):
    missing = str(tmp_path / "nothing")
    expect_refusal(["import", "--from", "hf", missing, "--out", str(tmp_path / "out")],
                   [missing, "not a directory"], tmp_path)
    hf = str(tmp_path / "hf")
    ok(["export", "--checkpoint", trained, "--format", "hf", "--out", hf])
    os.remove(os.path.join(hf, "model.safetensors"))
    expect_refusal(["import", "--from", "hf", hf, "--out", str(tmp_path / "out")],
                   ["model.safetensors' is missing"], tmp_path)
    os.remove(os.path.join(hf, "config.json"))
    expect_refusal(["import", "--from", "hf", hf, "--out", str(tmp_path / "out")],
                   ["config.json' is missing"], tmp_path)


def test_export_refuses_what_gpt2_cannot_compute(trained, tmp_path):
    cases = [
        (train_tiny(tmp_path, "gqa", n_kv_head=1), ["model.n_kv_head = 1", "grouped-query"]),
        (train_tiny(tmp_path, "alibi", pos_embedding="alibi"), ["model.pos_embedding = alibi"]),
    ]
    # A windowed run and a RoPE run with alternating windows (tests/test_convert_hf.py has the
    # RoPE models that export): the same weights with those options in the stored config (the
    # refusal comes from the config alone, before any weight is read).
    for key, edits, needles in [
            ("window", {"attention": {"window": 8}}, ["attention.window = 8", "sliding window"]),
            ("alternating", {"model": {"pos_embedding": "rope"}, "attention": {"window": 8, "window_every": 2}},
             ["attention.window_every = 2"])]:
        ckpt = str(tmp_path / f"edited_{key}")
        shutil.copytree(trained, ckpt)
        state = json.load(open(os.path.join(ckpt, "state.json")))
        for section, value in edits.items():
            state["config"][section].update(value)
        write_state(ckpt, state)   # with its checksum, so the refusal is the config's
        cases.append((ckpt, needles))
    for ckpt, needles in cases:
        expect_refusal(["export", "--checkpoint", ckpt, "--format", "hf", "--out", str(tmp_path / "out")],
                       [ckpt] + needles, tmp_path)


def test_export_and_import_bad_usage(trained, tmp_path):
    out = str(tmp_path / "out")
    expect_refusal(["export", "--checkpoint", trained, "--format", "onnx", "--out", out], ["onnx"], tmp_path)
    expect_refusal(["export", "--checkpoint", str(tmp_path / "none"), "--format", "hf", "--out", out],
                   ["none", "not a directory"], tmp_path)
    expect_refusal(["export", "--checkpoint", trained, "--out", out], ["--format hf"], tmp_path)
    expect_refusal(["import", "--from", "gguf", "x", "--out", out], ["gguf"], tmp_path)
    expect_refusal(["import", "--from", "llmc"], ["--from"], tmp_path)
    os.makedirs(out)
    expect_refusal(["export", "--checkpoint", trained, "--format", "hf", "--out", out], ["already exists"],
                   tmp_path)
    expect_refusal(["import", "--from", "llmc", "x.bin", "--out", out], ["already exists"], tmp_path)
    tok = tmp_path / "tok.bin"
    # a valid llm.c tokenizer file (header, then each token's length byte and byte) of 99 tokens
    tok.write_bytes(np.array([20240328, 2, 99, 0] + [0] * 252, np.int32).tobytes() +
                    b"".join(bytes([1, i + 1]) for i in range(99)))
    d = LLMC
    model = str(tmp_path / "m.bin")
    write_llmc(model, llmc_params(1, **d), 3, **d)
    expect_refusal(["import", "--from", "llmc", model, "--out", str(tmp_path / "o2"), "--tokenizer", str(tok)],
                   [str(tok), "99 tokens", "50"], tmp_path)


# ---------------------------------------------------------------------------------------------
# sampling with the GPT-2 tokenizer from an imported GPT-2-vocabulary model


def read_llmc_tokenizer(path):
    blob = open(path, "rb").read()
    header = np.frombuffer(blob[:1024], np.uint32)
    tokens, pos = [], 1024
    for _ in range(header[2]):
        n = blob[pos]
        tokens.append(blob[pos + 1:pos + 1 + n])
        pos += 1 + n
    return tokens, int(header[3])


def test_gpt2_tokenizer_sample_prints_text(tmp_path):
    # prepare finds GPT-2's files at their default place, data_cache/gpt2/ (tests/data_files.py).
    text = tmp_path / "text.txt"
    text.write_text("Hello world, this is a GPT-2 tokenized sample.\n" * 20)
    ok(["prepare", "--tokenizer", "gpt2", "--input", str(text), "--out", str(tmp_path / "g")])
    tok = str(tmp_path / "g_tokenizer.bin")
    vocab, eot = read_llmc_tokenizer(tok)
    assert len(vocab) == 50257 and eot == 50256
    d = dict(V=50257, Vp=50304, maxT=16, L=1, NH=2, C=16)
    path, ckpt = str(tmp_path / "gpt2ish.bin"), str(tmp_path / "ckpt")
    params = llmc_params(8, **d)
    write_llmc(path, params, 3, **d)
    ok(["import", "--from", "llmc", path, "--out", ckpt, "--tokenizer", tok])
    assert os.path.exists(os.path.join(ckpt, "tokenizer.bin"))
    # The sample starts from end-of-text and prints the tokens' bytes: the reference decodes its
    # greedy ids through the same table.
    w = llmc_to_hf(params, d["V"], d["L"])
    cfg = {"n_embd": d["C"], "n_head": d["NH"], "n_layer": d["L"]}
    seq, gaps = [eot], []
    for _ in range(d["maxT"] - 1):
        top = hf_forward(w, cfg, seq)[-1].topk(2)
        gaps.append((top.values[0] - top.values[1]).item())
        seq.append(int(top.indices[0]))
    assert min(gaps) > 1e-4, "the reference has a near-tie: pick another seed"
    r = subprocess.run([BIN, "sample", "--checkpoint", ckpt, "--tokens", str(d["maxT"] - 1), "--temperature", "0",
                        "--device", "cpu"], capture_output=True, cwd=ROOT, timeout=300, env=ENV)
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"".join(vocab[i] for i in seq[1:]) + b"\n"

    # With a prompt, GPT-2 BPE encodes it ("Hello world" is [15496, 995] in GPT-2) and the greedy
    # continuation follows from those ids.
    seq = [15496, 995]
    for _ in range(6):
        seq.append(int(hf_forward(w, cfg, seq)[-1].argmax()))
    r = subprocess.run([BIN, "sample", "--checkpoint", ckpt, "--prompt", "Hello world", "--tokens", "6",
                        "--temperature", "0", "--device", "cpu"], capture_output=True, cwd=ROOT, timeout=300, env=ENV)
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"Hello world" + b"".join(vocab[i] for i in seq[2:]) + b"\n"
