#!/usr/bin/env python3
"""Plot one or more runs' metrics.jsonl: train and val loss against tokens seen, and tokens/s.

usage: scripts/plot_metrics.py RUN_DIR_OR_METRICS.jsonl [...] [-o plot.png] [--smooth N]
                               [--positions EVAL.json ...]
Each run is labelled by its directory name. Later lines for the same step (a resumed run
re-training steps after its last checkpoint) replace earlier ones. --positions adds a panel of
the mean loss by token position that `train_gpt eval --per-position --json EVAL.json` wrote.
"""
import argparse
import json
import os
import sys


def load(path):
    if os.path.isdir(path):
        path = os.path.join(path, "metrics.jsonl")
    train, val = {}, {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                ev = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"error: {path}:{n}: not JSON ({e})")
            if ev.get("event") == "train" and isinstance(ev.get("loss"), (int, float)):
                train[ev["step"]] = ev
            elif ev.get("event") == "eval" and isinstance(ev.get("val_loss"), (int, float)):
                val[ev["step"]] = ev
    label = os.path.basename(os.path.dirname(os.path.abspath(path)))
    return label, [train[k] for k in sorted(train)], [val[k] for k in sorted(val)]


def load_positions(path):
    """The buckets of an `eval --per-position --json` file: (first, last, loss) with a loss."""
    try:
        ev = json.load(open(path))
        rows = [(b["first"], b["last"], b["loss"]) for b in ev["per_position"] if b["loss"] is not None]
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f"error: {path}: not a train_gpt eval --per-position --json file ({e})")
    return rows


def smooth(xs, n):
    if n <= 1:
        return xs
    out, acc = [], []
    for x in xs:
        acc.append(x)
        if len(acc) > n:
            acc.pop(0)
        out.append(sum(acc) / len(acc))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="*", help="run directories or metrics.jsonl files")
    ap.add_argument("-o", "--out", default="metrics.png", help="output PNG (default metrics.png)")
    ap.add_argument("--smooth", type=int, default=1, help="moving average over N train steps")
    ap.add_argument("--positions", nargs="+", default=[], help="eval --per-position --json files")
    args = ap.parse_args()
    if not args.runs and not args.positions:
        ap.error("name a run or a --positions file")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = 3 if args.positions else 2
    fig, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 4.5))
    ax_loss, ax_speed = axes[0], axes[1]
    for path in args.positions:
        rows = load_positions(path)
        axes[2].plot([last for _, last, _ in rows], [loss for _, _, loss in rows], "o-", ms=3,
                     label=os.path.basename(path))
    if args.positions:
        axes[2].set_xscale("log", base=2)
        axes[2].set_xlabel("token position (bucket end)")
        axes[2].set_ylabel("loss (nats)")
        axes[2].set_title("loss by position")
        axes[2].grid(alpha=0.3)
        axes[2].legend(fontsize=8)
    for path in args.runs:
        if not os.path.exists(path):
            sys.exit(f"error: {path} does not exist")
        label, train, val = load(path)
        if train:
            x = [e["tokens_seen"] for e in train]
            ax_loss.plot(x, smooth([e["loss"] for e in train], args.smooth), lw=1, label=f"{label} train")
            ax_speed.plot(x, [e.get("tok_per_s", 0) for e in train], lw=1, label=label)
        if val:
            ax_loss.plot([e.get("tokens_seen", 0) for e in val], [e["val_loss"] for e in val], "o-", ms=3,
                         label=f"{label} val")
    ax_loss.set_xlabel("tokens seen")
    ax_loss.set_ylabel("loss (nats)")
    ax_loss.set_title("loss")
    ax_loss.grid(alpha=0.3)
    ax_loss.legend(fontsize=8)
    ax_speed.set_xlabel("tokens seen")
    ax_speed.set_ylabel("tokens / s")
    ax_speed.set_title("throughput")
    ax_speed.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
