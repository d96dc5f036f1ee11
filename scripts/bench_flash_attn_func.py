#!/usr/bin/env python3
"""Benchmark flashgpt's public PyTorch function beside PyTorch's SDPA backends.

The speed table of scripts/bench_attention.py (bf16, B*N = 16K tokens, H*D = 2048, head dims 64
and 128, causal and full; TFLOP/s by the FlashAttention convention), but ours is timed through
flashgpt.flash_attn_func and its autograd backward, as a PyTorch user calls it: argument checks,
the output, LSE and workspace allocations and the ctypes call are inside the times, as autograd's
own bookkeeping is inside SDPA's. bench_attention.py times the kernels alone; the difference
between the two tables is the package's overhead, largest at short sequences. First the same
correctness check against a float64 PyTorch reference.

usage: python3 scripts/bench_flash_attn_func.py [--quick] [--seqs N,N,...] [--reps 10] [--json OUT.json]
(the library: build/libattention.so from `make libattention`, or $FLASHGPT_LIBATTENTION)
"""
import argparse
import json
import sys

import bench_attention as ba


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer sequence lengths")
    ap.add_argument("--seqs", type=ba.seq_list, help="comma-separated sequence lengths (overrides --quick)")
    ap.add_argument("--reps", type=ba.positive_int, default=10, help="timings per measurement (median)")
    ap.add_argument("--json", help="write the raw numbers here")
    args = ap.parse_args()
    ba.load_torch()
    torch = ba.torch
    if not torch.cuda.is_available():
        sys.exit("bench_flash_attn_func.py: no CUDA GPU visible to PyTorch")
    from flashgpt import _lib, flash_attn_func
    try:
        path = _lib.default_library().path
    except OSError as e:
        sys.exit(f"bench_flash_attn_func.py: {e}")

    def run(q, k, v, dout, causal):
        out = flash_attn_func(q, k, v, causal=causal)
        return (out,) + torch.autograd.grad(out, (q, k, v), dout)

    def timings(q, k, v, dout, causal, reps):
        fwd = ba.time_ms(lambda: flash_attn_func(q, k, v, causal=causal), reps)
        out = flash_attn_func(q, k, v, causal=causal)
        bwd = ba.time_ms(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), reps)
        return fwd, bwd

    print(f"GPU: {torch.cuda.get_device_name()}, PyTorch {torch.__version__}, CUDA {torch.version.cuda}, "
          f"library {path}")
    ok = ba.check_correctness(run, torch.bfloat16)
    seqs = args.seqs or ([1024, 8192] if args.quick else [1024, 2048, 4096, 8192, 16384, 32768])
    speed = ba.bench_speed(timings, torch.bfloat16, seqs, args.reps)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"speed": speed, "correct": ok, "through": "flashgpt.flash_attn_func"}, f, indent=1)
    print("\nours: flashgpt.flash_attn_func (forward) and torch.autograd.grad through it (backward)")
    ba.print_speed(speed, "bf16")
    print(f"\ncorrectness: {'ok' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
