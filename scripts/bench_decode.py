#!/usr/bin/env python3
"""Benchmark decoding (one new token per sequence against a KV cache) at long contexts, GPT-2 124M
shape with RoPE (12 layers, 12 heads of 64), on one GPU.

Part 1, the decode attention of one layer, on the same cache in one process: a bf16 cache laid
out as the model's, (B, 12, T_max, 64) for the keys and the same for the values, filled with
random values, and one query per sequence. Timed: our split-KV kernel (attn_decode), our flash
path (attn_forward, which decoding ran before), and PyTorch's scaled_dot_product_attention on
the very same cache tensors (its own backend choice), each the median of CUDA-event timings
(scripts/bench_attention.py's time_ms) after a check that the three agree. Printed per (context,
batch): microseconds per layer and the attention-only tokens/s of 12 layers, B / (12 t).

Part 2, the whole model through `train_gpt sample`: a random GPT-2 124M RoPE checkpoint
(configs/gpt2_124m.json, model.pos_embedding rope, max_seq_len the largest context plus the
tokens, one training step on synthetic data), then `sample --context C --batch B --tokens N
--temperature 0`, with and without --no-split; tokens/s is the first rate sample prints on
stderr (generated tokens over the time of the N decode steps; the prompt's prefill is timed
apart). --context starts the
decode at position C over a cache left empty, which costs what a filled one costs.

usage: python3 scripts/bench_decode.py [--contexts 1024,32768,131072] [--batches 1,8]
           [--tokens 64] [--lib build/libattention.so] [--bin ./train_gpt] [--reps 20]
           [--no-model] [--json OUT.json]
"""
import argparse
import ctypes
import json
import math
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import bench_attention  # noqa: E402  (time_ms, load_torch: PyTorch and the package)

L, NH, HS = 12, 12, 64   # GPT-2 124M


def attention_row(lib, ctx, ctx_len, B, reps):
    """Times of one layer's decode attention at context ctx_len for B sequences (ms)."""
    torch, F, interface, _lib = (bench_attention.torch, bench_attention.F, bench_attention.interface,
                                 bench_attention._lib)
    g = torch.Generator(device="cuda").manual_seed(ctx_len + B)
    T_max = ctx_len + 8
    kc = torch.randn(B, NH, T_max, HS, device="cuda", dtype=torch.bfloat16, generator=g)
    vc = torch.randn(B, NH, T_max, HS, device="cuda", dtype=torch.bfloat16, generator=g)
    q = torch.randn(B, 1, NH, HS, device="cuda", dtype=torch.bfloat16, generator=g)
    k = kc[:, :, :ctx_len].transpose(1, 2)   # (B, T, H, D) views of the cache, no copies
    v = vc[:, :, :ctx_len].transpose(1, 2)
    outs = {name: torch.empty_like(q) for name in ("split", "flash")}
    lse = torch.empty(B, NH, 1, device="cuda", dtype=torch.float32)
    params = {name: interface.attn_params(q, k, v, outs[name], lse, interface.Options(1 / math.sqrt(HS), True))
              for name in outs}
    ws = interface.workspace(lib, params["flash"], _lib.DEVICE_CUDA, "cuda")  # noqa: F841 (kept alive)
    splits = lib.lib.attn_decode_splits(ctx, ctypes.byref(params["split"]))
    run = {"split": lambda: lib._run(lib.lib.attn_decode, ctx, params["split"]),
           "flash": lambda: lib.forward(ctx, params["flash"]),
           "sdpa": lambda: F.scaled_dot_product_attention(q.transpose(1, 2), kc[:, :, :ctx_len],
                                                          vc[:, :, :ctx_len])}
    run["split"]()
    run["flash"]()
    ref = run["sdpa"]().transpose(1, 2).float()
    for name in outs:
        err = ((outs[name].float() - ref).norm() / ref.norm()).item()
        if not err < 2e-2:
            sys.exit(f"bench_decode.py: {name} differs from SDPA by {err:.3g} at context {ctx_len}, batch {B}")
    times = {name: bench_attention.time_ms(fn, reps) for name, fn in run.items()}
    return times, splits


def make_checkpoint(bin_path, work, max_seq):
    cfg = json.load(open(os.path.join(ROOT, "configs", "gpt2_124m.json")))
    cfg["model"].update({"pos_embedding": "rope", "max_seq_len": max_seq})
    cfg["data"] = {"synthetic": "copy"}
    cfg["train"].update({"batch_size": 1, "seq_len": 256, "steps": 1})
    cfg["log"] = {"dir": os.path.join(work, "run"), "every": 1, "eval_every": 0, "sample_every": 0,
                  "checkpoint_every": 1, "keep_checkpoints": 1}
    path = os.path.join(work, "cfg.json")
    json.dump(cfg, open(path, "w"))
    r = subprocess.run([bin_path, "train", "-c", path], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"bench_decode.py: making the checkpoint failed:\n{r.stderr}")
    return os.path.join(work, "run", "ckpt_00000001")


def model_tokens_per_s(bin_path, ckpt, ctx_len, B, tokens, split):
    args = [bin_path, "sample", "--checkpoint", ckpt, "--context", str(ctx_len), "--batch", str(B),
            "--tokens", str(tokens), "--temperature", "0"] + ([] if split else ["--no-split"])
    r = subprocess.run(args, capture_output=True, text=True)
    m = re.search(r"([0-9.]+) tokens/s", r.stderr)
    if r.returncode != 0 or not m:
        sys.exit(f"bench_decode.py: {' '.join(args)} failed:\n{r.stderr}")
    return float(m.group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--contexts", default="1024,32768,131072")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--tokens", type=int, default=64, help="tokens each sample run draws per sequence")
    ap.add_argument("--lib", default=os.path.join(ROOT, "build", "libattention.so"))
    ap.add_argument("--bin", default=os.path.join(ROOT, "train_gpt"))
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--no-model", action="store_true", help="part 1 only")
    ap.add_argument("--json", help="also write the results to this file")
    a = ap.parse_args()
    try:
        contexts = [int(x) for x in a.contexts.split(",")]
        batches = [int(x) for x in a.batches.split(",")]
    except ValueError:
        ap.error("--contexts and --batches take comma-separated integers")
    if min(contexts) < 1 or min(batches) < 1 or a.tokens < 1 or a.reps < 1:
        ap.error("contexts, batches, --tokens and --reps must be positive")
    for path, what in ((a.lib, "make libattention"), (a.bin if not a.no_model else a.lib, "make")):
        if not os.path.isfile(path):
            ap.error(f"{path} does not exist ({what})")
    bench_attention.load_torch()
    torch, _lib = bench_attention.torch, bench_attention._lib
    lib = _lib.Library(a.lib)
    # The decode entries of attention.h (the package binds the forward and backward ones).
    lib.lib.attn_decode.argtypes = [ctypes.c_void_p, ctypes.POINTER(_lib.AttnParams), ctypes.c_char_p,
                                    ctypes.c_size_t]
    lib.lib.attn_decode_splits.argtypes = [ctypes.c_void_p, ctypes.POINTER(_lib.AttnParams)]
    lib.lib.attn_decode.restype = lib.lib.attn_decode_splits.restype = ctypes.c_int
    ctx = lib.context(_lib.DEVICE_CUDA, torch.cuda.current_device(), torch.cuda.current_stream().cuda_stream)
    print(f"# {torch.cuda.get_device_name()}, PyTorch {torch.__version__}, bf16, {L} layers x {NH} heads x {HS}")
    print("| context | batch | splits | split us/layer | flash us/layer | SDPA us/layer | split attn tok/s "
          "| flash attn tok/s | SDPA attn tok/s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    results = []
    for c in contexts:
        for B in batches:
            t, splits = attention_row(lib, ctx, c, B, a.reps)
            tok = {k: B / (L * v * 1e-3) for k, v in t.items()}
            print(f"| {c} | {B} | {splits} | {t['split'] * 1e3:.1f} | {t['flash'] * 1e3:.1f} | {t['sdpa'] * 1e3:.1f} "
                  f"| {tok['split']:.0f} | {tok['flash']:.0f} | {tok['sdpa']:.0f} |", flush=True)
            results.append({"context": c, "batch": B, "splits": splits, "ms": t})
            torch.cuda.empty_cache()
    if not a.no_model:
        with tempfile.TemporaryDirectory() as work:
            ckpt = make_checkpoint(a.bin, work, max(contexts) + a.tokens + 8)
            print("\n| context | batch | sample tok/s, split | sample tok/s, --no-split | speed-up |")
            print("| --- | --- | --- | --- | --- |")
            for c in contexts:
                for B in batches:
                    on = model_tokens_per_s(a.bin, ckpt, c, B, a.tokens, True)
                    off = model_tokens_per_s(a.bin, ckpt, c, B, a.tokens, False)
                    print(f"| {c} | {B} | {on:.1f} | {off:.1f} | {on / off:.2f}x |", flush=True)
                    results.append({"context": c, "batch": B, "sample_tok_s": {"split": on, "no_split": off}})
    if a.json:
        json.dump(results, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
