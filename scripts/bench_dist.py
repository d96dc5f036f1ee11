#!/usr/bin/env python3
"""Data-parallel scaling of `train_gpt bench` on the GPUs of one host, with the time of the
gradient reduction that backward hides.

usage: python3 scripts/bench_dist.py [-c configs/gpt2_124m.json] [--batch 16] [--seq 1024]
           [--steps 30] [--gpus 2] [--sweep VAR=v1,v2,...] [--bin ./train_gpt]

Runs the bench (random tokens, bf16, batch per GPU fixed) on 1 GPU, then under torchrun on
--gpus GPUs twice: with the default gradient buckets (reduce-scatters start during backward, on
NCCL's side stream) and with FLASHGPT_BUCKET_MB=0 (one reduce-scatter after backward). With t1
the step time on one GPU, the communication a step pays is t(N) - t1: for the unbucketed run
that is the whole reduction plus the parameter all-gather, for the bucketed run only the part
backward did not hide. --sweep adds a bucketed row per value of an environment variable (for
example NCCL_MAX_CTAS=4,8,16: fewer NCCL blocks take fewer SMs from backward).

Each run also times --steps more steps phase by phase (`bench --breakdown`: a device sync ends
each phase): forward+backward, the reduction still running after backward, norm, optimizer and
all-gather. The reduction after backward, bucketed against unbucketed, is the part of the
reduce-scatter that backward hides; forward+backward, bucketed against unbucketed, is what the
concurrent NCCL kernels cost backward. Prints two tables.
"""
import argparse
import os
import re
import socket
import subprocess
import sys

from bench_train import LINE  # train_gpt bench's result line

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PHASES = re.compile(r"bench: phases .*?:(.*)")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bench(args, gpus, bucket_mb=None, extra_env=None):
    cmd = [args.bin, "bench", "-c", args.config, "--steps", str(args.steps), "--breakdown", "--device", "cuda",
           "--set", f"train.batch_size={args.batch}", "--set", f"train.seq_len={args.seq}",
           "--set", "train.grad_accum=1"]
    if gpus > 1:
        cmd = ["torchrun", f"--nproc_per_node={gpus}", "--no-python", f"--master_port={free_port()}"] + cmd
    env = dict(os.environ, NCCL_NVLS_ENABLE=os.environ.get("NCCL_NVLS_ENABLE", "0"))
    if bucket_mb is not None:
        env["FLASHGPT_BUCKET_MB"] = bucket_mb
    env.update(extra_env or {})
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    m = LINE.search(p.stdout)
    if p.returncode != 0 or not m:
        sys.exit(f"failed: {' '.join(cmd)}\n{p.stdout[-2000:]}{p.stderr[-3000:]}")
    ph = PHASES.search(p.stdout)
    phases = {}
    for part in (ph.group(1).split("|") if ph else []):
        name, _, val = part.strip().rpartition(" ")
        phases[name] = float(val)
    return {"ms": float(m.group(1)), "tok_s": float(m.group(2)), "mfu": float(m.group(3) or 0),
            "phases": phases}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-c", "--config", default="configs/gpt2_124m.json")
    ap.add_argument("--batch", type=int, default=16, help="sequences per GPU")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--sweep", help="VAR=v1,v2,...: one more bucketed run per value")
    ap.add_argument("--bin", default=os.path.join(ROOT, "train_gpt"))
    args = ap.parse_args()
    if args.sweep and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=[^,]+(,[^,]+)*", args.sweep):
        ap.error(f"--sweep {args.sweep!r}: expected VAR=v1,v2,...")
    one = bench(args, 1)
    rows = [("1 GPU", one),
            (f"{args.gpus} GPUs, buckets during backward (default)", bench(args, args.gpus)),
            (f"{args.gpus} GPUs, one reduce-scatter after backward", bench(args, args.gpus, "0"))]
    if args.sweep:
        var, _, values = args.sweep.partition("=")
        for v in values.split(","):
            rows.append((f"{args.gpus} GPUs, buckets, {var}={v}", bench(args, args.gpus, None, {var: v})))
    print(f"data parallel ({args.config}), batch {args.batch} x seq {args.seq} per GPU, bf16, "
          f"{args.steps} timed steps")
    print("| run | ms/step | tokens/s | scaling | MFU | communication paid per step (ms) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, r in rows:
        paid = "-" if r is one else f"{r['ms'] - one['ms']:.2f}"
        print(f"| {name} | {r['ms']:.1f} | {r['tok_s']:,.0f} | {r['tok_s'] / one['tok_s']:.3f}x | "
              f"{r['mfu']:.1f}% | {paid} |")
    names = [k for k in one["phases"] if k != "total"]
    print()
    print("phases per step on rank 0 (ms; " + str(args.steps) + " more steps, a device sync ending each phase)")
    print("| run | " + " | ".join(names) + " | total |")
    print("| --- |" + " --- |" * (len(names) + 1))
    for name, r in rows:
        print(f"| {name} | " + " | ".join(f"{r['phases'].get(k, 0):.2f}" for k in names) +
              f" | {r['phases'].get('total', 0):.2f} |")
    red = "reduction after backward"
    if len(rows) > 2 and rows[2][1]["phases"].get(red, 0) > 0:
        b, u = rows[1][1]["phases"], rows[2][1]["phases"]
        print(f"reduce-scatter left after backward: {b[red]:.2f} ms with buckets, {u[red]:.2f} ms "
              f"without (backward hides {100 * (1 - b[red] / u[red]):.0f}% of it); forward+backward "
              f"{b['forward+backward'] - u['forward+backward']:+.2f} ms with buckets")
    serial, hidden = rows[2][1]["ms"] - one["ms"], rows[1][1]["ms"] - one["ms"]
    if serial > 0:
        share = max(0.0, 1 - max(hidden, 0) / serial)
        print(f"backward hides {100 * share:.0f}% of the {serial:.2f} ms that communication costs "
              f"when the reduction runs after backward (buckets pay {hidden:.2f} ms)")


if __name__ == "__main__":
    main()
