#!/usr/bin/env python3
"""Checks `train_gpt export --format hf` against Hugging Face transformers itself.

Run from the repository root on a machine with torch and transformers after `make` (and
`make build/tests/tools/gpt_oracle`, which prints flashgpt's own fp32 logits):

    python3 scripts/check_hf_export.py [--arch learned,rope,gqa_window,partial]

For each architecture it trains a small model with ./train_gpt (a vocabulary that is not a
multiple of 128, so the unpadding is exercised; sequences four times the window), exports it,
loads the export with transformers.AutoModelForCausalLM (GPT2LMHeadModel for learned
positions, Starcoder2ForCausalLM for RoPE, GQA and the sliding window, GPTNeoXForCausalLM for
partial RoPE) and compares, on the same random tokens:
  1. logits: transformers in fp32 against flashgpt's fp32 CPU forward of the checkpoint
     (tests/tools/gpt_oracle): the max absolute difference, under 1e-4;
  2. loss: transformers' mean cross-entropy over the windows `train_gpt eval` reads against the
     val_loss that `train_gpt eval` prints;
  3. greedy tokens: transformers' generate (do_sample=False) against
     `train_gpt sample --temperature 0` (flashgpt's KV-cache decoder), past the window;
  4. import: the model transformers saves (save_pretrained) imports back to the same weights.
It prints one line per check and `PASS <arch>` or `FAIL <arch>` per architecture; exit code 0
when every architecture passes.
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

BASE = {
    "model": {"n_layer": 3, "n_head": 4, "n_embd": 64, "vocab_size": 200, "max_seq_len": 64},
    "data": {"synthetic": "markov"},
    "train": {"batch_size": 8, "seq_len": 64, "steps": 30, "seed": 11},
    "optim": {"lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 5},
    "precision": {"dtype": "fp32"},
    "log": {"every": 10, "sample_tokens": 8},
}
ARCHS = {  # name: (model keys, attention keys)
    "learned": ({}, {}),
    "rope": ({"pos_embedding": "rope", "rope_theta": 10000.0}, {}),
    "gqa_window": ({"pos_embedding": "rope", "n_kv_head": 2, "rope_theta": 500.0}, {"window": 15}),
    "partial": ({"pos_embedding": "rope", "rope_dims": 6, "rope_theta": 1000.0}, {}),
}

# Tolerances.
# - Logits, fp32 against fp32: both sum C <= 256 products per dot in a different order (~1e-6
#   relative on logits of magnitude ~10), and transformers computes the RoPE angles in fp32
#   (an angle error of position * 2^-24, ~4e-6 rad at position 63) where flashgpt rounds exact
#   angles once; 1e-4 is the bound the export promises, while a misplaced row moves logits by O(1).
LOGIT_TOL = 1e-4
# - Loss, flashgpt fp32 (CPU) against transformers fp32: a few ulp per logit, plus the 6 printed
#   decimals; 1e-4. The CUDA backend's bf16 (8-bit mantissa) is held to 3e-2.
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


def flashgpt_logits(oracle, ckpt, run_cfg, work):
    """flashgpt's fp32 CPU logits (B, T, V) and their tokens (B, T), from gpt_oracle --init."""
    m, a = run_cfg["model"], run_cfg["attention"]
    keys = [f"model.{k}={m[k]}" for k in ("n_layer", "n_head", "n_kv_head", "n_embd", "vocab_size",
                                           "max_seq_len", "pos_embedding", "rope_theta", "rope_dims")]
    keys += [f"attention.window={a['window']}", f"attention.window_every={a['window_every']}",
             f"train.seq_len={run_cfg['train']['seq_len']}", "train.batch_size=2"]
    out = os.path.join(work, "oracle.safetensors")
    sh([oracle, out, "--init", os.path.join(ckpt, "model.safetensors")] + sum((["--set", k] for k in keys), []))
    t, _ = read_safetensors(out)
    return t["logits"], t["tokens"]


def check(arch, args, transformers, work):
    bin_ = os.path.abspath(args.train_gpt)
    dev = ["--device", args.device]
    cfg = json.loads(json.dumps(BASE))
    cfg["model"].update(ARCHS[arch][0])
    cfg["attention"] = dict(ARCHS[arch][1])
    cfg["log"]["dir"] = os.path.join(work, "run")
    with open(os.path.join(work, "small.json"), "w") as f:
        json.dump(cfg, f)
    sh([bin_, "train", "-c", os.path.join(work, "small.json")] + dev)
    ckpt = os.path.join(work, "run", f"ckpt_{cfg['train']['steps']:08d}")
    hf_dir = os.path.join(work, "hf")
    sh([bin_, "export", "--checkpoint", ckpt, "--format", "hf", "--out", hf_dir])
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        hf_dir, output_loading_info=True, torch_dtype=torch.float32, attn_implementation="eager")
    model = model.eval()
    with open(os.path.join(ckpt, "state.json")) as f:
        run_cfg = json.load(f)["config"]
    m, B, T = run_cfg["model"], run_cfg["train"]["batch_size"], run_cfg["train"]["seq_len"]
    V = m["vocab_size"]
    results = []

    def report(name, passed, detail):
        results.append(passed)
        print(f"{'ok  ' if passed else 'FAIL'} {arch} {name}: {detail}")

    strange = {k: v for k, v in info.items() if v}
    report("from_pretrained", not strange, f"{type(model).__name__}, loading info {strange or 'clean'}")

    # 1. logits against flashgpt's own fp32 forward
    ours, tok = flashgpt_logits(args.oracle, ckpt, run_cfg, work)
    with torch.no_grad():
        hf_logits = model(torch.tensor(tok.astype(np.int64))).logits.numpy()
    max_diff = float(np.abs(hf_logits - ours).max())
    report("logits", max_diff < LOGIT_TOL, f"max |transformers fp32 - flashgpt fp32| = {max_diff:.3e} over "
                                          f"{tok.shape[0]} x {tok.shape[1]} tokens (tol {LOGIT_TOL:g})")

    # 2. loss against train_gpt eval on the same windows
    rng = np.random.RandomState(args.seed)
    n_windows = 2 * B
    tokens = rng.randint(0, V, n_windows * T + 1).tolist()
    hf_loss_sum = 0.0
    with torch.no_grad():
        for i in range(n_windows):
            seq = tokens[i * T:i * T + T + 1]
            logits = model(torch.tensor([seq[:-1]])).logits[0]
            hf_loss_sum += F.cross_entropy(logits, torch.tensor(seq[1:]), reduction="sum").item()
    shard = os.path.join(work, "check_val.bin")
    write_shard(shard, tokens)
    out = sh([bin_, "eval", "--checkpoint", ckpt, "--data", shard] + dev)
    ours_loss = float(out.split("val_loss:")[1].split()[0])
    hf_loss = hf_loss_sum / (n_windows * T)
    tol = LOSS_TOL[args.device]
    report("loss", abs(ours_loss - hf_loss) < tol,
           f"train_gpt eval {ours_loss:.6f} vs transformers {hf_loss:.6f} (|diff| "
           f"{abs(ours_loss - hf_loss):.2e}, tol {tol:g})")

    # 3. greedy decoding against train_gpt sample (no tokenizer: sample prints ids)
    n = m["max_seq_len"] - 1
    out = sh([bin_, "sample", "--checkpoint", ckpt, "--tokens", str(n), "--temperature", "0"] + dev)
    flash = [int(s) for s in out.strip().lstrip("<").rstrip(">").split("><")]
    with torch.no_grad():
        # No end-of-text stop and a pad id that is not the start token (no padding here).
        gen = model.generate(torch.tensor([[0]]), attention_mask=torch.ones(1, 1, dtype=torch.long),
                             max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=V - 1,
                             eos_token_id=None)[0, 1:].tolist()
    same = sum(a == b for a, b in zip(flash, gen))
    report("greedy", flash == gen, f"{n} tokens from token 0: train_gpt sample "
                                   f"{'==' if flash == gen else '!='} transformers generate ({same} agree)")

    # 4. what transformers saves imports back to the same weights
    saved, back = os.path.join(work, "hf_saved"), os.path.join(work, "imported")
    model.save_pretrained(saved, safe_serialization=True)
    sh([bin_, "import", "--from", "hf", saved, "--out", back])
    again, _ = read_safetensors(os.path.join(back, "model.safetensors"))
    mine, _ = read_safetensors(os.path.join(ckpt, "model.safetensors"))
    same = set(again) == set(mine) and all(np.array_equal(again[k], mine[k]) for k in mine)
    report("import", same, f"transformers' save_pretrained imported back {'bitwise equal' if same else 'DIFFERS'}")
    print(f"{'PASS' if all(results) else 'FAIL'} {arch}: {type(model).__name__}, max logit difference "
          f"{max_diff:.3e} (transformers {transformers.__version__}, torch {torch.__version__})")
    return all(results)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train-gpt", default=os.path.join(ROOT, "train_gpt"), help="the binary to check")
    ap.add_argument("--oracle", default=os.path.join(ROOT, "build", "tests", "tools", "gpt_oracle"),
                    help="gpt_oracle, which prints flashgpt's fp32 CPU logits")
    ap.add_argument("--arch", default=",".join(ARCHS), help=f"comma-separated, of {', '.join(ARCHS)}")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="train_gpt's backend")
    ap.add_argument("--workdir", help="keep the runs, exports and data here (default: a temporary dir)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the random evaluation tokens")
    args = ap.parse_args()
    import transformers  # here, so --help works without it

    archs = args.arch.split(",")
    unknown = [a for a in archs if a not in ARCHS]
    if unknown:
        sys.exit(f"--arch: unknown {', '.join(unknown)} (known: {', '.join(ARCHS)})")
    work = args.workdir or tempfile.mkdtemp(prefix="check_hf_export.")
    ok = True
    for arch in archs:
        d = os.path.join(work, arch)
        if os.path.exists(d):
            sys.exit(f"FAIL: {d} exists: use an empty --workdir")
        os.makedirs(d)
        ok = check(arch, args, transformers, d) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
