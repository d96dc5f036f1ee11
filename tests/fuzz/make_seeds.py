#!/usr/bin/env python3
"""Writes the fuzz harnesses' seed corpora, tests/fuzz/corpus/<harness>/: small valid inputs of
each format (and a few near misses), from which libFuzzer mutates. The state.json seeds come
from a checkpoint of a tiny run of ./train_gpt (or $TRAIN_GPT). Run from the repository root:

    /usr/bin/python3 tests/fuzz/make_seeds.py

The files are committed; this script is how they were made. It leaves tests/fuzz/regress/
alone: those are inputs that once crashed a parser.
"""
import json
import os
import re
import shutil
import struct
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus")
BIN = os.environ.get("TRAIN_GPT", os.path.join(ROOT, "train_gpt"))


def put(harness, name, data):
    d = os.path.join(CORPUS, harness)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)


def header(*ints, n=256, fmt="i"):
    h = list(ints) + [0] * (n - len(ints))
    return struct.pack("<%d%s" % (n, fmt), *h)


# ---- config ----
def configs():
    for name in ["tiny_cpu.json", "synthetic_copy.json", "gpt2_124m.json", "long_8k.json"]:
        put("config", name, open(os.path.join(ROOT, "configs", name), "rb").read())
    small = {"model": {"n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 16, "max_seq_len": 32,
                       "pos_embedding": "rope", "rope_dims": 8},
             "data": {"synthetic": "markov"}, "train": {"seq_len": 32, "divergence_steps": 3},
             "precision": {"loss_scale": 128}, "attention": {"window": 8, "window_every": 2}}
    put("config", "sets", json.dumps(small) + "\0train.steps=5\noptim.lr=1e-3\nmodel.n_kv_head=1\n"
        "precision.loss_scale=dynamic\nattention.impl=naive\nlog.dir=x")
    put("config", "bad_type", '{"model": {"n_layer": "two"}, "data": {"synthetic": "copy"}}')
    put("config", "floats", '{"optim": {"beta1": 0.9999989999999, "lr": 9.99999999}, '
        '"data": {"synthetic": "copy"}}')
    # Every number key at the ends of its range, from the config table as --help prints it.
    keys = subprocess.run([BIN, "train", "--help"], capture_output=True, text=True).stdout
    for end in (0, 1):
        cfg = {}
        for m in re.finditer(r"^  (\w+)\.(\w+)\s+number\s+default \S+\s+range \[(\S+), (\S+)\]", keys, re.M):
            cfg.setdefault(m.group(1), {})[m.group(2)] = float(m.group(3 + end))
        cfg.setdefault("data", {})["synthetic"] = "copy"
        put("config", "bounds_" + ("max" if end else "min"), json.dumps(cfg))


# ---- token shards ----
def shards():
    toks = [(i * 7) % 1000 for i in range(60)]
    put("shard", "u16", header(20240520, 1, len(toks)) + struct.pack("<%dH" % len(toks), *toks))
    put("shard", "u32", header(20240801, 7, len(toks)) + struct.pack("<%dI" % len(toks), *toks))
    put("shard", "bad_token", header(20240520, 1, 3) + struct.pack("<3H", 1, 2, 5000))
    put("shard", "short", header(20240520, 1, 100) + struct.pack("<3H", 1, 2, 3))


# ---- llm.c tokenizer files ----
def tokenizer_file(tokens, eot, version=2):
    body = b"".join(bytes([len(t)]) + t for t in tokens)
    return header(20240328, version, len(tokens), eot, fmt="I") + body


def tokenizers():
    put("tokenizer", "bytes", tokenizer_file([bytes([i]) for i in range(256)], 0xFFFFFFFF))
    chars = [c.encode() for c in "\n !,.:;?ABCabcé€"]
    put("tokenizer", "chars", tokenizer_file(chars, 0xFFFFFFFF))
    words = [b"a", b"ab", b"abc", b"b", b"c", b"<|endoftext|>", b"ab"]   # a duplicate
    put("tokenizer", "words_eot", tokenizer_file(words, 5))


# ---- GPT-2 BPE files ----
def printable(b):
    return 0x21 <= b <= 0x7E or (b >= 0xA1 and b != 0xAD)


def alphabet():
    """GPT-2's spelling of each byte, and the byte tokens' order."""
    spell, extra = {}, 0
    for b in range(256):
        if printable(b):
            spell[b] = chr(b)
        else:
            spell[b] = chr(256 + extra)
            extra += 1
    order = [b for b in range(256) if printable(b)] + [b for b in range(256) if not printable(b)]
    return spell, order


def gpt2_files(merges):
    spell, order = alphabet()
    enc = {spell[b]: i for i, b in enumerate(order)}
    for m in merges:
        enc[m.replace(" ", "")] = len(enc)
    enc["<|endoftext|>"] = len(enc)
    bpe = "#version: 0.2\n" + "".join(m + "\n" for m in merges)
    return json.dumps(enc, ensure_ascii=False).encode(), bpe.encode()


def gpt2():
    for name, merges in [("small", ["a a", "aa aa", "a b", "Ġ a", "ab c", "x y"]),
                         ("words", ["t h", "th e", "Ġ the", "i n", "Ġ in", "1 2", "12 3"]),
                         ("none", [])]:
        enc, bpe = gpt2_files(merges)
        put("gpt2_load", name, enc + b"\0" + bpe)
    enc, bpe = gpt2_files(["a b", "b c"])
    put("gpt2_load", "disagree", enc + b"\0" + bpe.replace(b"b c", b"c b"))
    texts = {"ascii": "Hello, world! It's 2024: the year's 12345 tests.\n\n  indented\tline\n",
             "unicode": "naïve café — 東京 🙂 Ελληνικά ‍\u00a0 nbsp\n",
             "contractions": "I'm you're we've they'll she'd it's DON'T\n",
             "invalid": b"ok \xff\xfe bytes \xc3 \xe2\x82 \xf0\x9f\x99 end \xed\xa0\x80 \xc0\xaf",
             "long_word": "x" * 300 + " " + "7" * 200 + " " + "ab" * 150,
             "spaces": " " * 50 + "\n" * 5 + "\t \t  \r\n",
             "documents": "first doc\n\nsecond doc\n\n\n\nthird\n\n"}
    for name, t in texts.items():
        put("gpt2_encode", name, t)


# ---- safetensors ----
def safetensors(tensors, meta=None, pad=True):
    hdr, data = {}, b""
    if meta is not None:
        hdr["__metadata__"] = meta
    for name, dtype, shape, raw in tensors:
        hdr[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(hdr).encode()
    if pad:
        h += b" " * (-(8 + len(h)) % 8)
    return struct.pack("<Q", len(h)) + h + data


def safetensors_seeds():
    f32 = struct.pack("<6f", *range(6))
    put("safetensors", "mixed", safetensors([
        ("w", "F32", [2, 3], f32), ("b", "BF16", [4], b"\x80\x3f" * 4), ("i", "I64", [2], struct.pack("<2q", 1, -1)),
        ("u", "U8", [3], b"abc"), ("e", "F16", [0, 5], b""), ("s", "F32", [], struct.pack("<f", 1.5))],
        {"format": "pt", "config": "{}"}))
    put("safetensors", "empty", safetensors([]))
    put("safetensors", "meta_only", safetensors([], {"a": "b"}))
    put("safetensors", "overlap", safetensors([("a", "F32", [1], b"\0" * 4)])[:-2] + b"\0\0")


# ---- llm.c model files ----
def llmc(version, V, Vp, maxT, L, NH, C):
    n = (Vp + maxT) * C + L * (12 * C * C + 13 * C) + 2 * C
    if version == 3:
        body = struct.pack("<%df" % n, *[((i * 37) % 101) / 101.0 - 0.5 for i in range(n)])
    else:
        body = struct.pack("<%dH" % n, *[0x3f00 + (i % 97) for i in range(n)])
    return header(20240326, version, maxT, V, L, NH, C, Vp) + body


def llmc_seeds():
    put("llmc", "fp32", llmc(3, 3, 3, 2, 1, 1, 4))
    put("llmc", "bf16", llmc(5, 5, 8, 3, 2, 2, 4))
    put("llmc", "truncated", llmc(3, 3, 3, 2, 1, 1, 4)[:-4])
    put("llmc", "shard_magic", header(20240520, 1, 10))


# ---- Hugging Face config.json ----
def hf_configs():
    base = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 50257,
            "n_positions": 1024, "n_ctx": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12,
            "n_inner": None, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-05,
            "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
            "tie_word_embeddings": True, "bos_token_id": 50256, "eos_token_id": 50256}
    put("hf_config", "gpt2", json.dumps(base, indent=2))
    put("hf_config", "minimal", json.dumps({"vocab_size": 65, "n_ctx": 64, "n_embd": 32, "n_layer": 2,
                                            "n_head": 4}))
    tanh = dict(base, activation_function="gelu_pytorch_tanh", n_inner=3072, layer_norm_epsilon=9.999999747378752e-06)
    put("hf_config", "tanh", json.dumps(tanh))
    put("hf_config", "relu", json.dumps(dict(base, activation_function="relu")))


# ---- state.json ----
def states():
    tmp = tempfile.mkdtemp()
    try:
        cfg = {"model": {"n_layer": 1, "n_head": 1, "n_embd": 8, "vocab_size": 8, "max_seq_len": 8},
               "data": {"synthetic": "copy"}, "train": {"batch_size": 1, "seq_len": 8, "steps": 2},
               "precision": {"dtype": "fp32"},
               "log": {"dir": "run", "eval_every": 0, "sample_tokens": 0}}
        path = os.path.join(tmp, "c.json")
        with open(path, "w") as f:
            json.dump(cfg, f)
        # One thread and a relative log.dir: the same bytes every time the seeds are made.
        subprocess.run([BIN, "train", "-c", path, "--device", "cpu"], check=True, capture_output=True,
                       cwd=tmp, env={**os.environ, "OMP_NUM_THREADS": "1"})
        text = open(os.path.join(tmp, "run", "ckpt_00000002", "state.json"), "rb").read()
    finally:
        shutil.rmtree(tmp)
    put("state", "v2", text)
    old = json.loads(text)
    old["format"] = "flashgpt-state-1"
    del old["files"], old["state_sha256"], old["guard_loss_mean"]
    put("state", "v1", json.dumps(old, indent=1))
    put("state", "v1_bad_tag", json.dumps(dict(old, format="flashgpt-state-9")))


if __name__ == "__main__":
    configs()
    shards()
    tokenizers()
    gpt2()
    safetensors_seeds()
    llmc_seeds()
    hf_configs()
    states()
    print("seeds in", CORPUS)
