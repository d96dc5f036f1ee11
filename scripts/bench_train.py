#!/usr/bin/env python3
"""GPT training throughput and memory: flashgpt beside PyTorch, in one run on one GPU.

usage: python3 scripts/bench_train.py [-c configs/gpt2_124m.json] [--batch 16] [--seq 1024]
           [--steps 20] [--no-compile | --compile-mode MODE ...] [--set KEY=VALUE ...] [--whole-run]
           [--bin ./train_gpt] [--json OUT.json]

The model sizes: configs/gpt2_124m.json, gpt2_medium.json (350M), gpt2_large.json (774M),
gpt2_xl.json (1.5B) at 1024 tokens, and configs/long_350m_32k.json (350M, RoPE, 4 key/value
heads for 16 query heads) at --seq 32768 --batch 1.

flashgpt: `train_gpt bench` (random tokens, one warm-up step, then --steps timed optimizer steps:
forward, backward, clipping and AdamW) on the config with batch/seq overridden, twice: with
train.cuda_graph = on (the step captured once and replayed; a config the graphs cannot serve,
e.g. with attention.doc_mask, shows why) and off (every kernel launched each step). --set passes
more overrides to train_gpt (e.g. precision.dtype=bf16 for configs/tiny_cpu.json's fp32).
--whole-run also trains the config from scratch with `train_gpt train` (its own batch and
steps, graphs auto and off) and reports the whole process's seconds, the mean step time and the
best validation loss it printed.
PyTorch: the same GPT-2 architecture (the config's positions: learned, or RoPE half-split as
flashgpt's; grouped-query attention by repeating key/value heads; pre-LayerNorm blocks, tanh GELU, tied
head, vocabulary padded to a multiple of 128; as in nanoGPT the softmax spans the padded
vocabulary, flashgpt's only the real one), bf16 autocast, scaled_dot_product_attention
(causal), fused AdamW with weight decay on 2-D weights, gradient clipping; eager and, unless
--no-compile, torch.compile in mode max-autotune-no-cudagraphs and in mode reduce-overhead
(which replays CUDA graphs), or only the modes --compile-mode names (max-autotune's tuning of
GPT-2 124M alone takes minutes). Tokens/s over the timed steps (CUDA synchronised). GPU memory is
the device's used memory (total - free, the CUDA context included) at the end of the timed steps
for both sides: flashgpt allocates everything up front, so this is its peak; PyTorch's caching
allocator keeps its peak reservation, so this is PyTorch's peak footprint on the device (each
PyTorch row runs in a process of its own, so none inherits another's cache or a fault: a mode
that fails, e.g. with an error inside torch.compile, is a FAIL row with the error's last line and
the other rows still print). PyTorch's own max_memory_allocated (the tensors alone, without the
allocator's slack or the context) is shown beside it.
Prints one table. MFU is train_gpt's (6*N + 6*L*T*C FLOPs per token against the peak of the GPU
it runs on, cli/peak_flops.c); PyTorch's rows scale it by their tokens/s, since both sides run
the same FLOPs per token. Where train_gpt prints no MFU (a GPU its table lacks), no row has one.
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINE = re.compile(r"([0-9.]+) ms/step, ([0-9.]+) tokens/s(?:, MFU ([0-9.]+)%)?(?:, GPU memory ([0-9.]+) GiB)?")


def flashgpt_sets(args):
    sets = []
    for kv in args.set:
        sets += ["--set", kv]
    return sets


def bench_flashgpt(args, graph):
    cmd = [args.bin, "bench", "-c", args.config, "--steps", str(args.steps), "--device", "cuda",
           "--set", f"train.batch_size={args.batch}", "--set", f"train.seq_len={args.seq}",
           "--set", f"model.max_seq_len={max(args.seq, args.max_seq_len)}", "--set", "train.grad_accum=1",
           "--set", f"train.cuda_graph={graph}"] + flashgpt_sets(args)
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    m = LINE.search(p.stdout)
    if p.returncode == 2:
        return {"cmd": " ".join(cmd), "status": "n/a", "output": p.stderr.strip()[-300:]}
    if p.returncode != 0 or not m:
        return {"cmd": " ".join(cmd), "status": "FAIL", "output": (p.stdout + p.stderr)[-2000:]}
    return {"cmd": " ".join(cmd), "status": "ok", "ms": float(m.group(1)), "tok_s": float(m.group(2)),
            "mfu": float(m.group(3)) if m.group(3) else None, "mem_gib": float(m.group(4)) if m.group(4) else None}


DONE = re.compile(r"^done: (\d+) steps, ([0-9.]+) s of training(?: \((\d+) tok/s\))?")
VAL = re.compile(r"val loss ([0-9.]+)")


def whole_run(args, graph):
    """The config trained from scratch: process seconds, mean step ms, best val loss."""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        cmd = [args.bin, "train", "-c", args.config, "--device", "cuda", "--set", f"log.dir={d}/run",
               "--set", f"train.cuda_graph={graph}"] + flashgpt_sets(args)
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        wall = time.perf_counter() - t0
    done = [DONE.match(l) for l in p.stdout.splitlines()]
    done = [m for m in done if m]
    vals = [float(v) for v in VAL.findall(p.stdout)]
    if p.returncode != 0 or not done:
        return {"cmd": " ".join(cmd), "status": "FAIL", "output": (p.stdout + p.stderr)[-2000:]}
    steps, train_s = int(done[0].group(1)), float(done[0].group(2))
    return {"cmd": " ".join(cmd), "status": "ok", "wall_s": wall, "step_ms": 1e3 * train_s / steps,
            "best_val": min(vals) if vals else None}


def build_torch_model(torch, cfg, seq):
    nn, F = torch.nn, torch.nn.functional
    L, NH, C, V = cfg["n_layer"], cfg["n_head"], cfg["n_embd"], cfg["vocab_size"]
    NKV = cfg.get("n_kv_head") or NH
    HS, Vp = C // NH, (V + 127) // 128 * 128
    rope = cfg.get("pos_embedding", "learned") == "rope"

    def rotate(x, cos, sin):   # half-split RoPE over the whole head, (B, H, T, HS)
        x1, x2 = x[..., :HS // 2], x[..., HS // 2:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.qkv, self.proj = nn.Linear(C, (NH + 2 * NKV) * HS), nn.Linear(C, C)
            self.fc, self.fc_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

        def forward(self, x, cos, sin):
            B, T, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).split([NH * HS, NKV * HS, NKV * HS], dim=2)
            q = q.view(B, T, NH, HS).transpose(1, 2)
            k, v = (t.view(B, T, NKV, HS).transpose(1, 2) for t in (k, v))
            if rope:
                q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            if NKV != NH:
                k, v = (t.repeat_interleave(NH // NKV, dim=1) for t in (k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
            return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(Vp, C)
            self.wpe = None if rope else nn.Embedding(max(seq, cfg["max_seq_len"]), C)
            self.blocks = nn.ModuleList(Block() for _ in range(L))
            self.lnf = nn.LayerNorm(C)
            for n, p in self.named_parameters():
                if p.dim() == 2:
                    std = 0.02 / math.sqrt(2 * L) if n.endswith(("proj.weight", "fc_proj.weight")) else 0.02
                    nn.init.normal_(p, 0.0, std)

        def forward(self, idx, targets):
            pos = torch.arange(idx.shape[1], device=idx.device)
            x = self.wte(idx)
            cos = sin = None
            if rope:
                inv_freq = cfg.get("rope_theta", 10000.0) ** (
                    -torch.arange(0, HS, 2, device=idx.device, dtype=torch.float32) / HS)
                ang = pos[:, None].float() * inv_freq   # (T, HS/2)
                cos, sin = ang.cos(), ang.sin()
            else:
                x = x + self.wpe(pos)
            for b in self.blocks:
                x = b(x, cos, sin)
            # nanoGPT's head (and the anchors'): logits over the padded vocabulary, whose extra
            # columns are never targets; cross_entropy runs in fp32 under autocast. Slicing the
            # head to the real 50257 columns made eager PyTorch 1.5x slower than the anchor
            # (an odd-sized matmul and an explicit fp32 copy of the logits).
            logits = self.lnf(x) @ self.wte.weight.t()
            return F.cross_entropy(logits.view(-1, Vp), targets.view(-1))

    return GPT()


def bench_torch(args, cfg, mode):
    import torch
    torch.manual_seed(0)
    dev = "cuda"
    model = build_torch_model(torch, cfg, args.seq).to(dev)
    decay = [p for p in model.parameters() if p.dim() == 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), fused=True)
    fwd = torch.compile(model, mode=mode) if mode else model
    V = cfg["vocab_size"]
    x = torch.randint(0, V, (args.batch, args.seq), device=dev)
    y = torch.randint(0, V, (args.batch, args.seq), device=dev)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    try:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            step()
        torch.cuda.synchronize()
    except torch.cuda.OutOfMemoryError:
        return {"status": "OOM"}
    dt = (time.perf_counter() - t0) / args.steps
    free, total = torch.cuda.mem_get_info()
    return {"status": "ok", "ms": dt * 1e3, "tok_s": args.batch * args.seq / dt,
            "mem_gib": (total - free) / 2**30, "alloc_gib": torch.cuda.max_memory_allocated() / 2**30}


COMPILE_MODES = ("max-autotune-no-cudagraphs", "reduce-overhead")


def torch_row(args, mode):
    """bench_torch in a process of its own (this script with --torch-row): its result, or FAIL
    with the last line of what it printed (a CUDA fault poisons the process that meets it)."""
    cmd = [sys.executable, os.path.abspath(__file__), "-c", args.config, "--batch", str(args.batch),
           "--seq", str(args.seq), "--steps", str(args.steps), "--torch-row", mode or "eager"]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    lines = p.stdout.strip().splitlines()
    if p.returncode == 0 and lines and lines[-1].startswith("{"):
        return json.loads(lines[-1])
    err = [l.strip() for l in (p.stdout + p.stderr).splitlines() if l.strip()]
    return {"cmd": " ".join(cmd), "status": "FAIL", "why": (err[-1] if err else f"exit status {p.returncode}")[:200],
            "output": (p.stdout + p.stderr)[-2000:]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-c", "--config", default="configs/gpt2_124m.json")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile rows")
    ap.add_argument("--compile-mode", action="append", choices=COMPILE_MODES, metavar="MODE",
                    help=f"a torch.compile mode to time (repeatable; default: {' and '.join(COMPILE_MODES)})")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for train_gpt (repeatable)")
    ap.add_argument("--whole-run", action="store_true",
                    help="also train the config from scratch, graphs auto and off (whole process)")
    ap.add_argument("--bin", default=os.path.join(ROOT, "train_gpt"))
    ap.add_argument("--json", help="also write the results to this file")
    ap.add_argument("--torch-row", choices=("eager",) + COMPILE_MODES, help=argparse.SUPPRESS)  # torch_row's worker
    args = ap.parse_args()
    if args.no_compile and args.compile_mode:
        ap.error("--no-compile skips every torch.compile row: drop --compile-mode, or --no-compile")
    cfg = json.load(open(os.path.join(ROOT, args.config)))["model"]
    cfg.setdefault("max_seq_len", 1024)
    args.max_seq_len = cfg["max_seq_len"]
    if args.torch_row:
        print(json.dumps(bench_torch(args, cfg, None if args.torch_row == "eager" else args.torch_row)))
        return
    rows = {"flashgpt, graph": bench_flashgpt(args, "on"), "flashgpt, no graph": bench_flashgpt(args, "off"),
            "pytorch eager": torch_row(args, None)}
    if not args.no_compile:
        for mode in args.compile_mode or COMPILE_MODES:
            rows[f"pytorch compile {mode}"] = torch_row(args, mode)
    print(f"GPT ({args.config}), batch {args.batch} x seq {args.seq}, {args.steps} timed steps, bf16")
    print("| implementation | ms/step | tokens/s | MFU | GPU memory GiB | PyTorch allocated GiB | vs flashgpt |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    ours = rows["flashgpt, graph"].get("tok_s") or rows["flashgpt, no graph"].get("tok_s")
    # MFU per token/s, from the first flashgpt row that printed one
    ref = next((r for r in rows.values() if r.get("mfu")), None)
    mfu_per_tok = ref["mfu"] / ref["tok_s"] if ref else None
    for name, r in rows.items():
        if r["status"] != "ok":
            why = r.get("output", "").replace("\n", " ") if r["status"] == "n/a" else r.get("why", "")
            print(f"| {name} | {r['status']} {why} | | | | | |")
            continue
        mem = f"{r['mem_gib']:.2f}" if r.get("mem_gib") is not None else "-"
        alloc = f"{r['alloc_gib']:.2f}" if r.get("alloc_gib") is not None else "-"
        ratio = f"{r['tok_s'] / ours:.2f}x" if ours else "-"
        mfu = r.get("mfu") or (mfu_per_tok * r["tok_s"] if mfu_per_tok else None)
        mfu = f"{mfu:.1f}%" if mfu else "-"
        print(f"| {name} | {r['ms']:.1f} | {r['tok_s']:,.0f} | {mfu} | {mem} | {alloc} | {ratio} |")
    for name, r in rows.items():
        if r["status"] == "FAIL":
            print(f"{name}:\n{r.get('output', '')}", file=sys.stderr)
    runs = {}
    if args.whole_run:
        print(f"\nwhole run of {args.config} (train_gpt train, from scratch)")
        print("| train.cuda_graph | process s | ms/step | best val loss |")
        print("| --- | --- | --- | --- |")
        for graph in ("auto", "off"):
            r = runs[graph] = whole_run(args, graph)
            if r["status"] != "ok":
                print(f"| {graph} | FAIL | | |")
                print(r.get("output", ""), file=sys.stderr)
                continue
            val = f"{r['best_val']:.4f}" if r["best_val"] is not None else "-"
            print(f"| {graph} | {r['wall_s']:.1f} | {r['step_ms']:.2f} | {val} |")
    if args.json:
        json.dump({"args": vars(args), "rows": rows, "whole_run": runs}, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
