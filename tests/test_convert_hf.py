"""Long-context models that move between flashgpt and Hugging Face (./train_gpt export / import,
CPU): RoPE, grouped-query attention and sliding windows as Starcoder2ForCausalLM, partial RoPE
(model.rope_dims) as GPTNeoXForCausalLM.

- The export holds the checkpoint's weights bitwise where an independent mapping written here
  puts them (q/k/v row blocks, GPT-NeoX's per-head [q|k|v] with its rotary dimensions first).
- Float64 forwards of Starcoder2 and GPT-NeoX written here from transformers' modeling code, run
  on the exported files, give the logits of tests/oracle_gpt.py's flashgpt reference on the
  checkpoint (1e-9), the loss `train_gpt eval` prints, and `train_gpt sample --temperature 0`'s
  greedy tokens, on sequences longer than the window.
- export -> import -> export is bitwise; a Hugging Face file with bf16 weights and without the
  model prefix imports.
- Models no architecture computes are refused with the reason; bad Hugging Face directories
  (unknown model_type, missing tensors, wrong shapes, options flashgpt lacks) exit 2 with a
  message naming the problem and leave nothing behind.
scripts/check_hf_export.py runs the same comparisons against transformers itself."""
import json
import math
import os
import shutil
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_interop as ti  # noqa: E402  (the CLI helpers and the tiny run)
from oracle_gpt import RefGPT  # noqa: E402
from oracle_st import read_safetensors  # noqa: E402

# Tolerances. Float64 against float64: the forwards differ in summation order only (~1e-14 on
# logits of magnitude ~5); 1e-9 flags any real difference (a misplaced row moves logits by
# O(0.1)). Loss against the CPU backend's fp32: test_interop.LOSS_TOL (a few fp32 ulp, 6 printed
# decimals).
LOGIT_TOL = 1e-9

ARCHS = {  # name: (model keys, attention keys, exported model_type)
    "rope": ({"pos_embedding": "rope"}, {}, "starcoder2"),
    "gqa_window": ({"pos_embedding": "rope", "n_head": 4, "n_kv_head": 2, "rope_theta": 500.0},
                   {"window": 5}, "starcoder2"),
    "partial": ({"pos_embedding": "rope", "rope_dims": 6, "rope_theta": 1000.0}, {}, "gpt_neox"),
}


def train(tmp_path, name, model, attention):
    cfg = json.loads(json.dumps(ti.TINY))
    cfg["model"].update(model)
    cfg["attention"] = dict(attention)
    cfg["log"]["dir"] = str(tmp_path / name)
    p = tmp_path / f"{name}.json"
    p.write_text(json.dumps(cfg))
    ti.ok(["train", "-c", str(p), "--device", "cpu"])
    return str(tmp_path / name / f"ckpt_{cfg['train']['steps']:08d}")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """name -> (checkpoint, export directory)."""
    out = {}
    for name, (model, attention, _) in ARCHS.items():
        d = tmp_path_factory.mktemp(name)
        ckpt = train(d, name, model, attention)
        hf = str(d / "hf")
        ti.ok(["export", "--checkpoint", ckpt, "--format", "hf", "--out", hf])
        out[name] = ckpt, hf
    return out


def run_config(ckpt):
    with open(os.path.join(ckpt, "state.json")) as f:
        return json.load(f)["config"]


# ---------------------------------------------------------------------------------------------
# the expected files, from the checkpoint's own tensors

def neox_head_order(HS, R):
    """GPT-NeoX head dimension j <- our dimension: rotated halves first, then the rest."""
    half, r2 = HS // 2, R // 2
    return (list(range(r2)) + list(range(half, half + r2)) + list(range(r2, half)) +
            list(range(half + r2, HS)))


def expected_hf(ours, cfg):
    m = cfg["model"]
    V, L, C, NH, NKV = m["vocab_size"], m["n_layer"], m["n_embd"], m["n_head"], m["n_kv_head"]
    HS = C // NH
    R = m["rope_dims"] or HS
    pairs = [("ln1", "input_layernorm"), ("ln2", "post_attention_layernorm")]
    if R < HS:
        pairs += [("attn.proj", "attention.dense"), ("mlp.fc", "mlp.dense_h_to_4h"),
                  ("mlp.proj", "mlp.dense_4h_to_h")]
        hf = {"gpt_neox.embed_in.weight": ours["wte"][:V],
              "gpt_neox.final_layer_norm.weight": ours["lnf.weight"],
              "gpt_neox.final_layer_norm.bias": ours["lnf.bias"]}
        order = np.array(neox_head_order(HS, R))
        for l in range(L):
            for kind in ("weight", "bias"):
                qkv = ours[f"h.{l}.attn.qkv.{kind}"]
                q, k, v = (qkv[i * C:(i + 1) * C].reshape((NH, HS) + qkv.shape[1:]) for i in range(3))
                per_head = np.concatenate([q[:, order], k[:, order], v], axis=1)   # (NH, 3HS, ...)
                hf[f"gpt_neox.layers.{l}.attention.query_key_value.{kind}"] = per_head.reshape(qkv.shape)
        prefix = "gpt_neox.layers"
    else:
        pairs += [("attn.proj", "self_attn.o_proj"), ("mlp.fc", "mlp.c_fc"), ("mlp.proj", "mlp.c_proj")]
        hf = {"model.embed_tokens.weight": ours["wte"][:V], "model.norm.weight": ours["lnf.weight"],
              "model.norm.bias": ours["lnf.bias"]}
        for l in range(L):
            for kind in ("weight", "bias"):
                qkv = ours[f"h.{l}.attn.qkv.{kind}"]
                cuts = [NH * HS, (NH + NKV) * HS]
                for name, part in zip(("q_proj", "k_proj", "v_proj"), np.split(qkv, cuts)):
                    hf[f"model.layers.{l}.self_attn.{name}.{kind}"] = part
        prefix = "model.layers"
    for l in range(L):
        for o, h in pairs:
            for kind in ("weight", "bias"):
                hf[f"{prefix}.{l}.{h}.{kind}"] = ours[f"h.{l}.{o}.{kind}"]
    return hf


@pytest.mark.parametrize("name", list(ARCHS))
def test_export_is_the_checkpoint_bitwise(runs, name):
    ckpt, hf = runs[name]
    tensors, meta, cfg = ti.read_hf(hf)
    ours, _ = read_safetensors(os.path.join(ckpt, "model.safetensors"))
    rc = run_config(ckpt)
    want = expected_hf(ours, rc)
    assert meta.get("format") == "pt" and set(tensors) == set(want)
    for k, v in want.items():
        assert tensors[k].dtype == np.float32 and np.array_equal(tensors[k], v), k
    m = rc["model"]
    assert cfg["model_type"] == ARCHS[name][2] and cfg["tie_word_embeddings"] is True
    assert cfg["hidden_size"] == m["n_embd"] and cfg["num_hidden_layers"] == m["n_layer"]
    assert cfg["num_attention_heads"] == m["n_head"] and cfg["max_position_embeddings"] == m["max_seq_len"]
    assert cfg["hidden_act"] == "gelu_pytorch_tanh" and cfg["intermediate_size"] == 4 * m["n_embd"]
    if cfg["model_type"] == "starcoder2":
        assert cfg["num_key_value_heads"] == m["n_kv_head"] and cfg["rope_theta"] == m["rope_theta"]
        window = rc["attention"]["window"]
        assert cfg["sliding_window"] == (window + 1 if window >= 0 else None) and cfg["use_bias"] is True
    else:
        HS = m["n_embd"] // m["n_head"]
        assert int(HS * cfg["rotary_pct"]) == m["rope_dims"] and cfg["rotary_emb_base"] == m["rope_theta"]
        assert cfg["use_parallel_residual"] is False


# ---------------------------------------------------------------------------------------------
# Float64 forwards of the two targets, written from transformers' modeling_starcoder2.py and
# modeling_gpt_neox.py (Linear: y = x W^T + b; rotate_half RoPE; causal softmax attention).

def rotate(x, pos, theta, dims):
    """rotate_half RoPE on the first `dims` of x (H, T, HS): HF's cos/sin of cat(freqs, freqs)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, dims, 2, dtype=torch.float64) / dims)
    freqs = pos[:, None].double() * inv_freq                       # (T, dims/2)
    cos, sin = torch.cat([freqs, freqs], -1).cos(), torch.cat([freqs, freqs], -1).sin()
    rot, rest = x[..., :dims], x[..., dims:]
    half = torch.cat([-rot[..., dims // 2:], rot[..., :dims // 2]], -1)
    return torch.cat([rot * cos + half * sin, rest], -1)


def attend(q, k, v, window):
    """q (NH, T, HS), k and v (NKV, T, HS) -> (T, NH*HS); HF's sliding_window keeps i - S < j <= i."""
    NH, T, HS = q.shape
    k, v = (t.repeat_interleave(NH // t.shape[0], dim=0) for t in (k, v))   # repeat_kv
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    visible = (j <= i) if window is None else (j <= i) & (j > i - window)
    att = (q @ k.transpose(-1, -2) / math.sqrt(HS)).masked_fill(~visible, float("-inf")).softmax(-1)
    return (att @ v).transpose(0, 1).reshape(T, NH * HS)


def hf_forward(w, cfg, tokens):
    """Logits (T, V) of an exported directory's tensors w and config.json cfg."""
    d = {k: torch.tensor(np.asarray(v, np.float64)) for k, v in w.items()}
    C, NH, L = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_hidden_layers"]
    HS, T = C // NH, len(tokens)
    pos = torch.arange(T)
    neox = cfg["model_type"] == "gpt_neox"
    pre = "gpt_neox." if neox else "model."
    lin = lambda x, n: F.linear(x, d[n + ".weight"], d[n + ".bias"])  # noqa: E731
    ln = lambda x, n: F.layer_norm(x, (C,), d[n + ".weight"], d[n + ".bias"], 1e-5)  # noqa: E731
    embed = d[pre + ("embed_in.weight" if neox else "embed_tokens.weight")]
    x = embed[torch.tensor(tokens)]
    for l in range(L):
        p = f"{pre}layers.{l}."
        h = ln(x, p + "input_layernorm")
        if neox:
            qkv = lin(h, p + "attention.query_key_value").view(T, NH, 3 * HS).transpose(0, 1)
            q, k, v = qkv[..., :HS], qkv[..., HS:2 * HS], qkv[..., 2 * HS:]
            R = int(HS * cfg["rotary_pct"])
            q, k = rotate(q, pos, cfg["rotary_emb_base"], R), rotate(k, pos, cfg["rotary_emb_base"], R)
            x = x + lin(attend(q, k, v, None), p + "attention.dense")
            h = ln(x, p + "post_attention_layernorm")
            x = x + lin(F.gelu(lin(h, p + "mlp.dense_h_to_4h"), approximate="tanh"), p + "mlp.dense_4h_to_h")
        else:
            NKV = cfg["num_key_value_heads"]
            q = lin(h, p + "self_attn.q_proj").view(T, NH, HS).transpose(0, 1)
            k = lin(h, p + "self_attn.k_proj").view(T, NKV, HS).transpose(0, 1)
            v = lin(h, p + "self_attn.v_proj").view(T, NKV, HS).transpose(0, 1)
            q, k = rotate(q, pos, cfg["rope_theta"], HS), rotate(k, pos, cfg["rope_theta"], HS)
            x = x + lin(attend(q, k, v, cfg["sliding_window"]), p + "self_attn.o_proj")
            h = ln(x, p + "post_attention_layernorm")
            x = x + lin(F.gelu(lin(h, p + "mlp.c_fc"), approximate="tanh"), p + "mlp.c_proj")
    x = ln(x, pre + ("final_layer_norm" if neox else "norm"))
    return x @ embed.T


@pytest.mark.parametrize("name", list(ARCHS))
def test_export_computes_our_model(runs, name, tmp_path):
    ckpt, hf = runs[name]
    tensors, _, cfg = ti.read_hf(hf)
    rc = run_config(ckpt)
    V, T, B = rc["model"]["vocab_size"], rc["train"]["seq_len"], rc["train"]["batch_size"]
    ref = RefGPT(rc, read_safetensors(os.path.join(ckpt, "model.safetensors"))[0])
    rng = np.random.RandomState(7)
    tokens = rng.randint(0, V, B * T + 1).tolist()   # one batch of the windows eval reads
    total, worst = 0.0, 0.0
    with torch.no_grad():
        for i in range(B):
            seq = tokens[i * T:i * T + T + 1]
            logits = hf_forward(tensors, cfg, seq[:-1])
            ours, _ = ref(torch.tensor([seq[:-1]]), torch.tensor([seq[1:]]))
            worst = max(worst, (logits - ours[0]).abs().max().item())
            total += F.cross_entropy(logits, torch.tensor(seq[1:]), reduction="sum").item()
    assert worst < LOGIT_TOL, f"{name}: max |Hugging Face forward - flashgpt reference| = {worst:.3e}"
    shard = str(tmp_path / "val.bin")
    ti.write_shard(shard, tokens)
    assert abs(ti.eval_loss(ckpt, shard) - total / (B * T)) < ti.LOSS_TOL
    # Greedy decoding from token 0 past the window: flashgpt's KV-cache decoder against the
    # Hugging Face forward rerun on the whole prefix; a near tie would make argmax ill-posed.
    n = T - 1
    seq, gaps = [0], []
    with torch.no_grad():
        for _ in range(n):
            top = hf_forward(tensors, cfg, seq)[-1].topk(2)
            gaps.append((top.values[0] - top.values[1]).item())
            seq.append(int(top.indices[0]))
    assert min(gaps) > 1e-4, f"{name}: a near tie in greedy decoding ({min(gaps):.2e})"
    assert ti.greedy(ckpt, n) == seq[1:]


# ---------------------------------------------------------------------------------------------
# import

@pytest.mark.parametrize("name", list(ARCHS))
def test_round_trip_is_bitwise(runs, name, tmp_path):
    ckpt, hf = runs[name]
    back, hf2 = str(tmp_path / "back"), str(tmp_path / "hf2")
    ti.ok(["import", "--from", "hf", hf, "--out", back])
    ours, _ = read_safetensors(os.path.join(ckpt, "model.safetensors"))
    again, _ = read_safetensors(os.path.join(back, "model.safetensors"))
    assert set(again) == set(ours) and all(np.array_equal(again[k], ours[k]) for k in ours)
    want, got = run_config(ckpt), run_config(back)
    for key in ("n_layer", "n_head", "n_kv_head", "n_embd", "vocab_size", "max_seq_len", "pos_embedding",
                "rope_theta", "rope_dims"):
        assert got["model"][key] == want["model"][key], key
    assert got["attention"]["window"] == want["attention"]["window"]
    ti.ok(["export", "--checkpoint", back, "--format", "hf", "--out", hf2])
    for f in ("model.safetensors", "config.json"):
        assert open(os.path.join(hf, f), "rb").read() == open(os.path.join(hf2, f), "rb").read(), f


def test_import_accepts_bf16_and_names_without_prefix(runs, tmp_path):
    ckpt, hf = runs["gqa_window"]
    tensors, _, _ = ti.read_hf(hf)
    variant, back = str(tmp_path / "variant"), str(tmp_path / "back")

    def plain_bf16(t):
        return {k[len("model."):] if k.startswith("model.") else k: ("BF16", ti.to_bf16_bits(v))
                for k, v in t.items()}
    ti.hf_dir_variant(hf, variant, plain_bf16)
    ti.ok(["import", "--from", "hf", variant, "--out", back])
    got, _ = read_safetensors(os.path.join(back, "model.safetensors"))
    want = ti.from_bf16_bits(ti.to_bf16_bits(tensors["model.layers.1.self_attn.k_proj.weight"]))
    C = run_config(ckpt)["model"]["n_embd"]
    assert np.array_equal(got["h.1.attn.qkv.weight"][C:C + want.shape[0]], want)


def test_export_refuses_what_no_architecture_computes(tmp_path):
    cases = [
        ("alibi", {"pos_embedding": "alibi"}, {}, ["model.pos_embedding = alibi", "BLOOM", "MPT"]),
        ("learned_gqa", {"n_head": 4, "n_kv_head": 2}, {}, ["grouped-query", "learned positions"]),
        ("alternating", {"pos_embedding": "rope"}, {"window": 4, "window_every": 2},
         ["attention.window_every = 2", "every layer"]),
        ("partial_gqa", {"pos_embedding": "rope", "rope_dims": 4, "n_head": 4, "n_kv_head": 2}, {},
         ["model.rope_dims = 4", "GPT-NeoX", "grouped-query attention"]),
        ("partial_window", {"pos_embedding": "rope", "rope_dims": 6}, {"window": 4},
         ["model.rope_dims = 6", "sliding window"]),
    ]
    for name, model, attention, needles in cases:
        ckpt = train(tmp_path, name, model, attention)
        ti.expect_refusal(["export", "--checkpoint", ckpt, "--format", "hf", "--out", str(tmp_path / "out")],
                          [ckpt] + needles, tmp_path)


def transformers5_neox(c):
    """The GPT-NeoX config as transformers 5 saves it: rotary_pct and rotary_emb_base inside
    rope_parameters."""
    c["rope_parameters"] = {"rope_type": "default", "rope_theta": c.pop("rotary_emb_base"),
                            "partial_rotary_factor": c.pop("rotary_pct")}


def test_import_reads_transformers5_rope_parameters(runs, tmp_path):
    ckpt, hf = runs["partial"]
    variant, back = str(tmp_path / "variant"), str(tmp_path / "back")
    edited_config(hf, variant, transformers5_neox)
    ti.ok(["import", "--from", "hf", variant, "--out", back])
    want, got = run_config(ckpt)["model"], run_config(back)["model"]
    assert (got["rope_dims"], got["rope_theta"]) == (want["rope_dims"], want["rope_theta"])
    ours, _ = read_safetensors(os.path.join(ckpt, "model.safetensors"))
    again, _ = read_safetensors(os.path.join(back, "model.safetensors"))
    assert set(again) == set(ours) and all(np.array_equal(again[k], ours[k]) for k in ours)


def edited_config(hf, dst, edit):
    shutil.copytree(hf, dst)
    path = os.path.join(dst, "config.json")
    cfg = json.load(open(path))
    edit(cfg)
    json.dump(cfg, open(path, "w"))


@pytest.mark.parametrize("name,edit,needles", [
    ("rope", lambda c: c.update(model_type="llama"), ["model_type 'llama'", "gpt2, starcoder2 and gpt_neox"]),
    ("rope", lambda c: c.update(rope_scaling={"type": "linear", "factor": 2.0}), ["rope_scaling"]),
    ("rope", lambda c: c.update(use_bias=False), ["use_bias = false"]),
    ("rope", lambda c: c.update(hidden_act="silu"), ["hidden_act 'silu'"]),
    ("rope", lambda c: c.update(num_key_value_heads=3), ["not divisible by the 3 key/value heads"]),
    ("gqa_window", lambda c: c.update(num_key_value_heads=4), ["layers.1.self_attn.v_proj.weight",
                                                                "shape (16, 32), expected (32, 32)"]),
    ("rope", lambda c: c.update(num_hidden_layers=3), ["layers.2.mlp.c_proj.weight", "missing"]),
    ("partial", lambda c: c.update(use_parallel_residual=True), ["use_parallel_residual = true"]),
    ("partial", lambda c: c.update(rotary_pct=0.32), ["rotary_pct gives 5 rotated dimensions"]),
    ("partial", lambda c: c.update(tie_word_embeddings=False), ["tie_word_embeddings is false",
                                                                "embed_out.weight' is missing"]),
])
def test_import_refuses_bad_directories(runs, tmp_path, name, edit, needles):
    bad = str(tmp_path / "bad")
    edited_config(runs[name][1], bad, edit)
    ti.expect_refusal(["import", "--from", "hf", bad, "--out", str(tmp_path / "out")], [bad] + needles,
                      tmp_path)


def test_import_refuses_bad_tensors(runs, tmp_path):
    hf = runs["partial"][1]
    untied, stranger = str(tmp_path / "untied"), str(tmp_path / "stranger")

    def untie(t):
        out = {k: ("F32", v) for k, v in t.items()}
        out["embed_out.weight"] = ("F32", t["gpt_neox.embed_in.weight"] * 2)
        return out

    def extra(t):
        out = {k: ("F32", v) for k, v in t.items()}
        out["gpt_neox.layers.5.mlp.dense_h_to_4h.bias"] = ("F32", t["gpt_neox.layers.0.mlp.dense_h_to_4h.bias"])
        return out
    ti.hf_dir_variant(hf, untied, untie)
    ti.expect_refusal(["import", "--from", "hf", untied, "--out", str(tmp_path / "out")],
                      ["embed_out.weight differs from embed_in.weight"], tmp_path)
    ti.hf_dir_variant(hf, stranger, extra)
    ti.expect_refusal(["import", "--from", "hf", stranger, "--out", str(tmp_path / "out")],
                      ["unexpected tensor 'gpt_neox.layers.5.mlp.dense_h_to_4h.bias'"], tmp_path)
