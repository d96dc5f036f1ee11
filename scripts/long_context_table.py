#!/usr/bin/env python3
"""The long-context experiment: the same GPT trained for a fixed number of steps at several
sequence lengths with attention.impl = naive and = flash; one row per length with peak GPU memory,
tokens/s and the speedup of flash over naive (OOM shown as OOM).

Each cell is one `train_gpt bench` process (random tokens, one warm-up step, then --steps timed
training steps: forward, backward and AdamW), so an OOM in one cell cannot disturb the next.
Memory is the GPU memory in use after the timed steps as bench prints it (every buffer is
allocated up front and kept, so this is the run's peak; the CUDA context is included).

usage: python3 scripts/long_context_table.py [--bin ./train_gpt] [--config configs/long_32k.json]
           [--seqs 2048,8192,32768] [--batch 8] [--steps 10] [--device cuda] [--json OUT.json]
           [--set key=value ...]
Every number in the table is measured by this run on this machine: the memory and tokens/s of
each implementation, and the ratio of flash's tokens/s to naive's."""
import argparse
import json
import subprocess
import sys

from bench_train import LINE  # train_gpt bench's result line


def run_cell(args, seq, impl):
    """One bench run; returns a dict with status ok/OOM/FAIL and what bench printed."""
    cmd = [args.bin, "bench", "-c", args.config, "--steps", str(args.steps), "--device", args.device,
           "--set", f"train.seq_len={seq}", "--set", f"model.max_seq_len={seq}",
           "--set", f"train.batch_size={args.batch}", "--set", f"attention.impl={impl}",
           "--set", "train.grad_accum=1"]
    for s in args.set:
        cmd += ["--set", s]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"status": "TIMEOUT", "cmd": " ".join(cmd)}
    out = p.stdout + p.stderr
    cell = {"cmd": " ".join(cmd), "rc": p.returncode}
    if p.returncode != 0:
        oom = "out of GPU memory" in out or "out of memory" in out
        cell["status"] = "OOM" if oom else "FAIL"
        cell["message"] = out.strip().splitlines()[-1] if out.strip() else ""
        return cell
    m = LINE.search(out)
    if not m:
        cell.update(status="FAIL", message="no bench line in: " + out.strip()[-200:])
        return cell
    cell.update(status="ok", ms_per_step=float(m.group(1)), tokens_per_s=float(m.group(2)),
                mfu=float(m.group(3)) if m.group(3) else None,
                memory_gib=float(m.group(4)) if m.group(4) else None)
    return cell


def fmt_mem(c):
    if c["status"] != "ok":
        return c["status"]
    return f"{c['memory_gib']:.1f} GiB" if c["memory_gib"] is not None else "-"


def fmt_tps(c):
    return f"{c['tokens_per_s']:,.0f}" if c["status"] == "ok" else c["status"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="./train_gpt")
    ap.add_argument("--config", default="configs/long_32k.json")
    ap.add_argument("--seqs", default="2048,8192,32768")
    ap.add_argument("--batch", type=int, default=8, help="sequences per step at every length")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per cell")
    ap.add_argument("--set", action="append", default=[], help="extra config override (repeatable)")
    ap.add_argument("--json", help="also write every cell (with its command) to this file")
    args = ap.parse_args()
    seqs = [int(s) for s in args.seqs.split(",")]

    rows = []
    hdr = (f"{'seq':>7} | {'naive mem':>10} {'naive tok/s':>12} | {'flash mem':>10} {'flash tok/s':>12} | "
           f"{'speedup':>8}")
    print(f"config {args.config}, batch {args.batch}, {args.steps} timed steps, device {args.device}")
    print(hdr)
    print("-" * len(hdr))
    for seq in seqs:
        naive, flash = run_cell(args, seq, "naive"), run_cell(args, seq, "flash")
        speedup = (f"{flash['tokens_per_s'] / naive['tokens_per_s']:.2f}x"
                   if naive["status"] == "ok" and flash["status"] == "ok" else "-")
        print(f"{seq:>7} | {fmt_mem(naive):>10} {fmt_tps(naive):>12} | {fmt_mem(flash):>10} "
              f"{fmt_tps(flash):>12} | {speedup:>8}", flush=True)
        for c in (naive, flash):
            if c["status"] not in ("ok", "OOM"):
                print(f"        {c['status']}: {c.get('message', '')}", file=sys.stderr)
        rows.append({"seq": seq, "naive": naive, "flash": flash, "speedup": speedup})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": args.config, "batch": args.batch, "steps": args.steps, "rows": rows}, f, indent=1)
    return 0 if all(r[k]["status"] in ("ok", "OOM") for r in rows for k in ("naive", "flash")) else 1


if __name__ == "__main__":
    sys.exit(main())
