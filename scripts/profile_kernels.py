#!/usr/bin/env python3
"""Where a training step's GPU time goes: every kernel of `train_gpt bench` timed by Nsight
Compute (ncu), summed by kernel, beside the step's wall time.

usage: python3 scripts/profile_kernels.py -c configs/gpt2_124m.json [--set key=value ...]
           [--top 25] [--csv OUT.csv] [--bin ./train_gpt]

Runs `train_gpt bench --steps 1` (one warm-up step and one timed step) under
`ncu --metrics gpu__time_duration.sum` (clocks and caches left as they are), so each kernel's
duration is measured alone, serialised. Kernels are grouped by name (template arguments cut) and
their time per step is the total over both steps divided by 2 (setup kernels, a few, are
counted in). A separate run without ncu gives the wall time of a step (10 timed steps); the
difference between the two is time the GPU spends outside kernels: launch gaps and host syncs.
"""
import argparse
import csv
import io
import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEP = re.compile(r"([0-9.]+) ms/step")


def short_name(name):
    """The kernel's name without its argument list and template arguments."""
    name = name.split("(")[0]
    depth, out = 0, []
    for ch in name:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    short = "".join(out).replace("void ", "").strip()
    if short.startswith("cutlass::Kernel") and "<" in name:  # the kernel is the template argument
        short = name[name.index("<") + 1:].split("(")[0].rstrip(">").strip()
    return short


def bench_cmd(args, steps):
    cmd = [args.bin, "bench", "-c", args.config, "--steps", str(steps), "--device", "cuda"]
    for s in args.set or []:
        cmd += ["--set", s]
    return cmd


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-c", "--config", default="configs/gpt2_124m.json")
    ap.add_argument("--set", action="append", help="config override, as train_gpt's --set")
    ap.add_argument("--top", type=int, default=25, help="kernels listed (the rest are summed)")
    ap.add_argument("--csv", help="also write the per-kernel table here")
    ap.add_argument("--bin", default=os.path.join(ROOT, "train_gpt"))
    ap.add_argument("--ncu", default=shutil.which("ncu") or "ncu")
    args = ap.parse_args()

    wall = subprocess.run(bench_cmd(args, 10), capture_output=True, text=True, cwd=ROOT)
    m = STEP.search(wall.stdout)
    if wall.returncode != 0 or not m:
        sys.exit(f"bench failed:\n{wall.stdout[-2000:]}{wall.stderr[-2000:]}")
    step_ms = float(m.group(1))

    cmd = [args.ncu, "--metrics", "gpu__time_duration.sum", "--csv", "--print-units", "base",
           "--clock-control", "none", "--cache-control", "none"] + bench_cmd(args, 1)
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if p.returncode != 0:
        sys.exit(f"ncu failed:\n{p.stdout[-2000:]}{p.stderr[-3000:]}")
    lines = p.stdout.splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        sys.exit(f"no kernel table in ncu's output:\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    total_ns, calls = defaultdict(float), defaultdict(int)
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        k = short_name(row["Kernel Name"])
        total_ns[k] += float(row["Metric Value"].replace(",", ""))
        calls[k] += 1
    kernels = sorted(total_ns, key=total_ns.get, reverse=True)
    per_step = {k: total_ns[k] / 2 / 1e6 for k in kernels}  # ms, 2 steps profiled
    sum_ms = sum(per_step.values())

    print(f"{args.config} {' '.join('--set ' + s for s in args.set or [])}")
    print(f"step wall time {step_ms:.2f} ms; kernels {sum_ms:.2f} ms; outside kernels "
          f"{step_ms - sum_ms:.2f} ms ({100 * (step_ms - sum_ms) / step_ms:.0f}%: launch gaps, host syncs)")
    print("| kernel | calls per step | ms per step | share of kernel time |")
    print("| --- | --- | --- | --- |")
    for k in kernels[:args.top]:
        print(f"| `{k}` | {calls[k] / 2:g} | {per_step[k]:.3f} | {100 * per_step[k] / sum_ms:.1f}% |")
    rest = kernels[args.top:]
    if rest:
        r = sum(per_step[k] for k in rest)
        print(f"| {len(rest)} others | {sum(calls[k] for k in rest) / 2:g} | {r:.3f} | {100 * r / sum_ms:.1f}% |")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["kernel", "calls_per_step", "ms_per_step"])
            for k in kernels:
                w.writerow([k, calls[k] / 2, f"{per_step[k]:.6f}"])


if __name__ == "__main__":
    main()
