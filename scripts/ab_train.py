#!/usr/bin/env python3
"""Two train_gpt binaries on one config, alternately in one run: the A/B of a change to the step.

usage: python3 scripts/ab_train.py A_BIN B_BIN [-c configs/shakespeare_char.json] [--device cuda]
           [--rounds 3] [--steps 200] [--whole-run] [--set KEY=VALUE ...] [--json OUT.json]

A is the reference (the commit before the change), B the change. The runs start in the
repository's root (a config's data paths are relative to it); CONFIG is found from the current
directory or from the root. Each round runs both, A first in odd rounds and B first in even
ones, so neither side always follows the other on the GPU.
- By default each run is `BIN bench -c CONFIG --device DEVICE --steps STEPS` (random tokens, one
  warm-up step, then STEPS timed optimizer steps) and its tokens/s are read from its result line.
- With --whole-run each run is `BIN train -c CONFIG --device DEVICE` from scratch into a
  temporary log.dir (its own batch and steps; --steps is not used), timed from the process's
  start to its exit; the training tokens/s come from its "done:" line and the best validation
  loss from its "val loss" lines.
--set passes overrides to both binaries. Prints one table, a row per round, then B/A over the
rounds: the median and the range of the per-round ratios.
Exit status 2 when a binary or the config is missing, 1 when a run fails (its output's tail is
shown).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from bench_train import DONE, LINE, ROOT, VAL, flashgpt_sets  # train_gpt's output lines, --set


def fail(msg, code):
    print(f"ab_train: {msg}", file=sys.stderr)
    sys.exit(code)


def run_once(binary, args, log_dir):
    """One run of one binary: {"tokens_s", "wall_s"} and, for a whole run, "best_val"."""
    cmd = [binary] + (["train"] if args.whole_run else ["bench", "--steps", str(args.steps)])
    cmd += ["-c", args.config, "--device", args.device] + flashgpt_sets(args)
    if args.whole_run:
        cmd += ["--set", f"log.dir={log_dir}"]
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    wall = time.monotonic() - t0
    out = r.stdout + r.stderr
    if r.returncode != 0:
        tail = "\n".join(out.strip().splitlines()[-8:])
        fail(f"{' '.join(cmd)} exited with {r.returncode}:\n{tail}", 1)
    res = {"wall_s": wall}
    if args.whole_run:
        done = [m for m in map(DONE.match, out.splitlines()) if m and m.group(3)]
        if not done:
            fail(f"{' '.join(cmd)} printed no 'done:' line with tok/s", 1)
        res["tokens_s"] = int(done[-1].group(3))
        vals = [float(v) for v in VAL.findall(out)]
        res["best_val"] = min(vals) if vals else None
    else:
        m = LINE.search(out)
        if not m:
            fail(f"{' '.join(cmd)} printed no 'ms/step, tokens/s' line", 1)
        res["tokens_s"] = int(float(m.group(2)))
    return res


def fmt_val(v):
    return "-" if v is None else f"{v:.4f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("a_bin", metavar="A_BIN", help="the reference train_gpt")
    ap.add_argument("b_bin", metavar="B_BIN", help="the changed train_gpt")
    ap.add_argument("-c", "--config", default="configs/shakespeare_char.json")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=200, help="timed steps of each bench run")
    ap.add_argument("--whole-run", action="store_true", help="train the config from scratch instead")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args()
    for b in (args.a_bin, args.b_bin):
        if not (os.path.isfile(b) and os.access(b, os.X_OK)):
            fail(f"{b}: not an executable file", 2)
    for path in (args.config, os.path.join(ROOT, args.config)):
        if os.path.isfile(path):
            args.config = os.path.abspath(path)
            break
    else:
        fail(f"{args.config}: no such config", 2)
    if args.rounds < 1 or args.steps < 1:
        fail("--rounds and --steps must be at least 1", 2)
    args.a_bin, args.b_bin = os.path.abspath(args.a_bin), os.path.abspath(args.b_bin)

    what = "whole run (train)" if args.whole_run else f"bench --steps {args.steps}"
    print(f"A: {args.a_bin}\nB: {args.b_bin}")
    shown = os.path.relpath(args.config, ROOT) if args.config.startswith(ROOT + os.sep) else args.config
    print(f"{shown} on {args.device}, {what}, {args.rounds} rounds (A first in odd rounds)")
    rows = []
    with tempfile.TemporaryDirectory(prefix="ab_train.") as tmp:
        for rnd in range(1, args.rounds + 1):
            order = ("a", "b") if rnd % 2 else ("b", "a")
            row = {"round": rnd}
            for side in order:
                row[side] = run_once(getattr(args, f"{side}_bin"), args, os.path.join(tmp, f"{side}{rnd}"))
            row["ratio"] = row["b"]["tokens_s"] / row["a"]["tokens_s"]
            rows.append(row)
            print(f"  round {rnd}/{args.rounds} done", file=sys.stderr, flush=True)

    if args.whole_run:
        print("| round | A tokens/s | B tokens/s | B/A | A whole s | B whole s | A best val | B best val |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for r in rows:
            a, b = r["a"], r["b"]
            print(f"| {r['round']} | {a['tokens_s']:,} | {b['tokens_s']:,} | {r['ratio']:.3f} | "
                  f"{a['wall_s']:.2f} | {b['wall_s']:.2f} | {fmt_val(a['best_val'])} | {fmt_val(b['best_val'])} |")
    else:
        print("| round | A tokens/s | B tokens/s | B/A |")
        print("| --- | --- | --- | --- |")
        for r in rows:
            print(f"| {r['round']} | {r['a']['tokens_s']:,} | {r['b']['tokens_s']:,} | {r['ratio']:.3f} |")
    ratios = [r["ratio"] for r in rows]
    print(f"B/A: median {statistics.median(ratios):.3f}, range {min(ratios):.3f}-{max(ratios):.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": args.config, "device": args.device, "whole_run": args.whole_run,
                       "a": args.a_bin, "b": args.b_bin, "rounds": rows}, f, indent=1)


if __name__ == "__main__":
    main()
