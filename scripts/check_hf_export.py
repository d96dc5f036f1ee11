#!/usr/bin/env python3
"""Checks `train_gpt export --format hf` against Hugging Face transformers itself.

Run from the repository root on a machine with torch and transformers (the GPU machine) after
`make`:

    python3 scripts/check_hf_export.py

Without --checkpoint it trains a small model with ./train_gpt (a vocabulary that is not a
multiple of 128, so the unpadding is exercised), exports it, loads the export with
transformers.GPT2LMHeadModel.from_pretrained and compares, on the same random tokens:
  1. logits: transformers (float64) against an independent float64 forward of the checkpoint's own
     weights in flashgpt's layout (Linear (out, in), padded vocabulary): the max logit difference;
  2. loss: transformers' mean cross-entropy over the windows `train_gpt eval` reads against the
     val_loss that `train_gpt eval` prints (flashgpt's forward);
  3. greedy tokens: transformers' argmax decoding against `train_gpt sample --temperature 0`
     (flashgpt's KV-cache decoder), when the checkpoint has no tokenizer (sample then prints ids);
  4. import: the model transformers saves (save_pretrained) imports back to the same weights.
It prints one line per check and PASS or FAIL with the max logit difference; exit code 0 on PASS.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from oracle_st import read_safetensors  # noqa: E402  (json + numpy safetensors reader)

SMALL = {
    "model": {"n_layer": 3, "n_head": 4, "n_embd": 64, "vocab_size": 200, "max_seq_len": 64},
    "data": {"synthetic": "markov"},
    "train": {"batch_size": 8, "seq_len": 64, "steps": 30, "seed": 11},
    "optim": {"lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 5},
    "precision": {"dtype": "fp32"},
    "log": {"every": 10, "sample_tokens": 8},
}

# Tolerances.
# - Logits, float64 against float64: the two forwards differ only in summation order, ~1e-13 on
#   logits of magnitude ~10; 1e-8 flags any real difference (a wrong layout moves them by O(1)).
LOGIT_TOL = 1e-8
# - Loss, flashgpt fp32 (CPU) against float64: a few fp32 ulp per logit (~1e-6 on the mean), plus
#   the 6 printed decimals; 1e-4 leaves a wide margin. The CUDA backend's bf16 (8-bit mantissa,
#   relative error 2^-9 per rounding, partly averaging out over the mean) is held to 3e-2.
LOSS_TOL = {"cpu": 1e-4, "cuda": 3e-2}


def sh(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)} exited with {r.returncode}:\n{r.stdout}\n{r.stderr}")
    return r.stdout


def write_shard(path, tokens):
    header = np.zeros(256, np.int32)
    header[:3] = [20240520, 1, len(tokens)]
    with open(path, "wb") as f:
        f.write(header.tobytes() + np.asarray(tokens, np.uint16).tobytes())


def flashgpt_forward(w, m, tokens):
    """Float64 logits (T, V) from flashgpt's own parameter tensors (model.safetensors)."""
    d = {k: torch.tensor(np.asarray(v, np.float64)) for k, v in w.items()}
    C, NH, L, V = m["n_embd"], m["n_head"], m["n_layer"], m["vocab_size"]
    HS, T = C // NH, len(tokens)
    x = d["wte"][torch.tensor(tokens)] + d["wpe"][:T]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for l in range(L):
        p = lambda n: d[f"h.{l}.{n}"]  # noqa: E731
        h = F.layer_norm(x, (C,), p("ln1.weight"), p("ln1.bias"), 1e-5)
        q, k, v = F.linear(h, p("attn.qkv.weight"), p("attn.qkv.bias")).split(C, dim=-1)
        q, k, v = (t.view(T, NH, HS).transpose(0, 1) for t in (q, k, v))
        att = ((q @ k.transpose(-1, -2)) / np.sqrt(HS)).masked_fill(~causal, float("-inf")).softmax(-1)
        x = x + F.linear((att @ v).transpose(0, 1).reshape(T, C), p("attn.proj.weight"), p("attn.proj.bias"))
        h = F.layer_norm(x, (C,), p("ln2.weight"), p("ln2.bias"), 1e-5)
        f = F.gelu(F.linear(h, p("mlp.fc.weight"), p("mlp.fc.bias")), approximate="tanh")
        x = x + F.linear(f, p("mlp.proj.weight"), p("mlp.proj.bias"))
    x = F.layer_norm(x, (C,), d["lnf.weight"], d["lnf.bias"], 1e-5)
    return (x @ d["wte"].T)[:, :V]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train-gpt", default=os.path.join(ROOT, "train_gpt"), help="the binary to check")
    ap.add_argument("--checkpoint", help="check this checkpoint instead of training a small one")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="train_gpt's backend")
    ap.add_argument("--workdir", help="keep the run, export and data here (default: a temporary dir)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the random evaluation tokens")
    args = ap.parse_args()
    import transformers  # here, so --help works without it

    work = args.workdir or tempfile.mkdtemp(prefix="check_hf_export.")
    os.makedirs(work, exist_ok=True)
    bin_ = os.path.abspath(args.train_gpt)
    dev = ["--device", args.device]
    ckpt = args.checkpoint
    if not ckpt:
        cfg = json.loads(json.dumps(SMALL))
        cfg["log"]["dir"] = os.path.join(work, "run")
        with open(os.path.join(work, "small.json"), "w") as f:
            json.dump(cfg, f)
        sh([bin_, "train", "-c", os.path.join(work, "small.json")] + dev)
        ckpt = os.path.join(work, "run", f"ckpt_{cfg['train']['steps']:08d}")
    hf_dir = os.path.join(work, "hf")
    if os.path.exists(hf_dir):
        sys.exit(f"FAIL: {hf_dir} exists: use an empty --workdir")
    sh([bin_, "export", "--checkpoint", ckpt, "--format", "hf", "--out", hf_dir])

    model, info = transformers.GPT2LMHeadModel.from_pretrained(hf_dir, output_loading_info=True)
    model = model.double().eval()
    with open(os.path.join(ckpt, "state.json")) as f:
        run_cfg = json.load(f)["config"]
    m, B, T = run_cfg["model"], run_cfg["train"]["batch_size"], run_cfg["train"]["seq_len"]
    V = m["vocab_size"]
    results = []

    def report(name, passed, detail):
        results.append(passed)
        print(f"{'ok  ' if passed else 'FAIL'} {name}: {detail}")

    strange = {k: v for k, v in info.items() if v}
    report("from_pretrained", not strange, f"loading info {strange or 'clean'}")

    # 1. logits on full-length windows
    rng = np.random.RandomState(args.seed)
    n_windows = 2 * B
    tokens = rng.randint(0, V, n_windows * T + 1).tolist()
    ours, _ = read_safetensors(os.path.join(ckpt, "model.safetensors"))
    max_diff, hf_loss_sum = 0.0, 0.0
    with torch.no_grad():
        for i in range(n_windows):
            seq = tokens[i * T:i * T + T + 1]
            hf_logits = model(torch.tensor([seq[:-1]])).logits[0]
            ref = flashgpt_forward(ours, m, seq[:-1])
            max_diff = max(max_diff, (hf_logits - ref).abs().max().item())
            hf_loss_sum += F.cross_entropy(hf_logits, torch.tensor(seq[1:]), reduction="sum").item()
    report("logits", max_diff < LOGIT_TOL,
           f"max |transformers - flashgpt weights| = {max_diff:.3e} over {n_windows} x {T} tokens "
           f"(tol {LOGIT_TOL:g})")

    # 2. loss against train_gpt eval on the same windows
    shard = os.path.join(work, "check_val.bin")
    write_shard(shard, tokens)
    out = sh([bin_, "eval", "--checkpoint", ckpt, "--data", shard] + dev)
    ours_loss = float(out.split("val_loss:")[1].split()[0])
    hf_loss = hf_loss_sum / (n_windows * T)
    tol = LOSS_TOL[args.device]
    report("loss", abs(ours_loss - hf_loss) < tol,
           f"train_gpt eval {ours_loss:.6f} vs transformers {hf_loss:.6f} (|diff| "
           f"{abs(ours_loss - hf_loss):.2e}, tol {tol:g})")

    # 3. greedy decoding against train_gpt sample
    has_tok = os.path.exists(os.path.join(ckpt, "tokenizer.bin")) or run_cfg["data"]["tokenizer"]
    if has_tok:
        print("skip greedy: the checkpoint has a tokenizer, so sample prints text, not ids")
    else:
        n = min(32, m["max_seq_len"] - 1)
        out = sh([bin_, "sample", "--checkpoint", ckpt, "--tokens", str(n), "--temperature", "0"] + dev)
        flash = [int(s) for s in out.strip().lstrip("<").rstrip(">").split("><")]
        with torch.no_grad():
            # No end-of-text stop and a pad id that is not the start token (no padding here).
            gen = model.generate(torch.tensor([[0]]), attention_mask=torch.ones(1, 1, dtype=torch.long),
                                 max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=V - 1,
                                 eos_token_id=None)[0, 1:].tolist()
        report("greedy", flash == gen, f"{n} tokens from token 0: train_gpt sample "
                                       f"{'==' if flash == gen else '!='} transformers generate")

    # 4. what transformers saves imports back to the same weights
    saved, back = os.path.join(work, "hf_saved"), os.path.join(work, "imported")
    transformers.GPT2LMHeadModel.from_pretrained(hf_dir).save_pretrained(saved, safe_serialization=True)
    sh([bin_, "import", "--from", "hf", saved, "--out", back])
    again, _ = read_safetensors(os.path.join(back, "model.safetensors"))
    same = set(again) == set(ours) and all(
        np.array_equal(again[k][:V], ours[k][:V]) if k == "wte" else np.array_equal(again[k], ours[k])
        for k in ours)
    report("import", same, f"transformers' save_pretrained imported back {'bitwise equal' if same else 'DIFFERS'}")

    verdict = "PASS" if all(results) else "FAIL"
    print(f"{verdict}: max logit difference {max_diff:.3e} (checkpoint {ckpt}, export {hf_dir}, "
          f"transformers {transformers.__version__}, torch {torch.__version__})")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
