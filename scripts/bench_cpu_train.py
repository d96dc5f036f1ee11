#!/usr/bin/env python3
"""CPU training throughput: flashgpt's CPU backend against PyTorch (CPU, fp32) on the same model,
batch and thread count, measured in one run on one machine.

usage: scripts/bench_cpu_train.py [-c configs/tiny_cpu.json] [--steps 5] [--threads N]
The PyTorch side is the oracle tests' reference GPT (tests/oracle_gpt.py: the same architecture,
explicit masked attention) trained with torch.optim.AdamW; the flashgpt side is `train_gpt bench`.
Prints one table: tokens/s of each and the ratio.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

from bench_train import LINE  # train_gpt bench's result line

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))


def bench_ours(config, steps, threads):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS="1")
    r = subprocess.run([os.path.join(ROOT, "train_gpt"), "bench", "-c", config, "--steps", str(steps),
                        "--device", "cpu"], capture_output=True, text=True, env=env, cwd=ROOT)
    if r.returncode != 0:
        sys.exit(f"train_gpt bench failed:\n{r.stderr}")
    m = LINE.search(r.stdout)
    return float(m.group(1)), float(m.group(2))


def resolved_config(path):
    """The config as train_gpt reads it: every key's default from `train_gpt train --help` (the C
    side's one table of keys), then the file's values. RefGPT reads any key it needs, so a key
    the file leaves out must still be there."""
    r = subprocess.run([os.path.join(ROOT, "train_gpt"), "train", "--help"], capture_output=True, text=True, cwd=ROOT)
    if r.returncode != 0:
        sys.exit(f"train_gpt train --help failed:\n{r.stderr}")
    cfg = {}
    for key, kind, value in re.findall(r"^  (\w+\.\w+)\s+(.+?)\s+default (\S+)\s+range", r.stdout, re.M):
        section, name = key.split(".")
        if kind == "integer":
            v = int(value)
        elif kind == "number":
            v = float(value)
        elif kind == "true|false":
            v = value == "true"
        else:
            v = "" if value == '""' else value
        cfg.setdefault(section, {})[name] = v
    if not cfg:
        sys.exit("train_gpt train --help lists no config keys: cannot read the defaults")
    with open(path) as f:
        for section, values in json.load(f).items():
            cfg.setdefault(section, {}).update(values)
    return cfg


def bench_torch(cfg, steps, threads):
    import numpy as np
    import torch
    from oracle_gpt import RefGPT

    torch.set_num_threads(threads)
    m, t = cfg["model"], cfg["train"]
    C, L, V, maxT = m["n_embd"], m["n_layer"], m["vocab_size"], m["max_seq_len"]
    m["n_kv_head"] = m["n_kv_head"] or m["n_head"]   # 0 means "as many as the query heads"
    HS = C // m["n_head"]
    qkv = (m["n_head"] + 2 * m["n_kv_head"]) * HS
    rng = np.random.default_rng(0)
    w = {"wte": rng.normal(0, 0.02, (V, C)), "wpe": rng.normal(0, 0.02, (maxT, C))}
    for l in range(L):
        w.update({f"h.{l}.ln1.weight": np.ones(C), f"h.{l}.ln1.bias": np.zeros(C),
                  f"h.{l}.attn.qkv.weight": rng.normal(0, 0.02, (qkv, C)), f"h.{l}.attn.qkv.bias": np.zeros(qkv),
                  f"h.{l}.attn.proj.weight": rng.normal(0, 0.02, (C, C)), f"h.{l}.attn.proj.bias": np.zeros(C),
                  f"h.{l}.ln2.weight": np.ones(C), f"h.{l}.ln2.bias": np.zeros(C),
                  f"h.{l}.mlp.fc.weight": rng.normal(0, 0.02, (4 * C, C)), f"h.{l}.mlp.fc.bias": np.zeros(4 * C),
                  f"h.{l}.mlp.proj.weight": rng.normal(0, 0.02, (C, 4 * C)), f"h.{l}.mlp.proj.bias": np.zeros(C)})
    w.update({"lnf.weight": np.ones(C), "lnf.bias": np.zeros(C)})
    model = RefGPT(cfg, w, dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    B, T, accum = t["batch_size"], t["seq_len"], t.get("grad_accum", 1)
    x = torch.randint(0, V, (B, T))
    y = torch.randint(0, V, (B, T))

    def step():
        opt.zero_grad()
        for _ in range(accum):
            _, loss = model(x, y)
            (loss / accum).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    step()  # warm-up
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    dt = (time.perf_counter() - t0) / steps
    return dt * 1e3, B * T * accum / dt


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-c", "--config", default="configs/tiny_cpu.json")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()
    cfg = resolved_config(os.path.join(ROOT, args.config))
    ours_ms, ours_tps = bench_ours(args.config, args.steps, args.threads)
    torch_ms, torch_tps = bench_torch(cfg, args.steps, args.threads)
    print(f"config {args.config}, {args.threads} threads, {args.steps} timed steps after 1 warm-up")
    print(f"| implementation | ms/step | tokens/s |")
    print(f"| --- | --- | --- |")
    print(f"| flashgpt cpu (fp32) | {ours_ms:.1f} | {ours_tps:.0f} |")
    print(f"| PyTorch cpu (fp32, eager) | {torch_ms:.1f} | {torch_tps:.0f} |")
    print(f"ratio flashgpt / PyTorch: {ours_tps / torch_tps:.2f}x")


if __name__ == "__main__":
    main()
