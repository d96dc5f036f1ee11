#!/usr/bin/env python3
"""Why a flash attention kernel takes the time it does: Nsight Compute's full section set on one
launch of the forward's or the backward's main kernel at one shape, summarised in one table.

usage: python3 scripts/profile_attention.py [--shape gpt2|shakespeare_char|B,N,H,D] [--full]
           [--dropout P] [--pass fwd|bwd] [--lib build/libattention.so] [--kernel auto|sm90|sm80]
           [--out DIR] [--ncu PATH] [--mix N]

A worker (this script with --worker) makes the shape's forward and backward three times through
the package's ctypes layer, as scripts/bench_attention.py does (bf16, random inputs, causal unless
--full). ncu (--set full; clocks and caches as they are) profiles the third launch of the pass's
main kernel: flash_fwd_sm90_kernel or flash_fwd_kernel for the forward, flash_bwd_sm90_kernel or
flash_bwd_kernel for the backward, whichever family the library runs. The report stays in DIR
(default profile_attention/) as SHAPE_PASS.ncu-rep for Nsight Compute's interface, and the script
prints the kernel, its time, warp instructions, issue slots busy, the tensor pipe's, L2's and
DRAM's utilisation (when the report has them), achieved occupancy and registers, the
warp-stall reasons' shares of the PC samples (`wait`: a fixed-latency dependency;
`barrier`: a named barrier or __syncthreads; `long_sb`: global or shared memory; see Nsight
Compute's kernel profiling guide), and the N opcodes (--mix, default 12, 0 for none) that
executed the most warp instructions.

The shapes: bench_attention.py's named ones (gpt2: 16 x 1024, 12 heads of 64; shakespeare_char:
64 x 256, 6 heads of 64, with its dropout 0.2 unless --dropout says otherwise) or B,N,H,D.
Arguments, the library file and ncu are checked before PyTorch is imported or a GPU is needed.
"""
import argparse
import csv
import io
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import bench_attention  # noqa: E402  (imports no PyTorch until load_torch)

MAIN_KERNEL = {"fwd": r"regex:(^|void )flash_fwd(_sm90)?_kernel<", "bwd": r"regex:(^|void )flash_bwd(_sm90)?_kernel<"}
RUNS = 3  # forward and backward calls; ncu profiles the last one's main kernel
STALL = "smsp__pcsamp_warps_issue_stalled_"
TIME = "gpu__time_duration.sum"
US_PER = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}
SUMMARY = (  # (raw metric, label, format, printed as '-' when the report lacks it)
    (TIME, "time us", "{:.1f}", True),
    ("smsp__inst_executed.sum", "warp instructions", "{:,.0f}", True),
    ("smsp__issue_active.avg.pct_of_peak_sustained_active", "issue slots busy, % of active cycles", "{:.1f}", True),
    ("sm__warps_active.avg.pct_of_peak_sustained_active", "achieved occupancy, % of the warp slots", "{:.1f}", True),
    # the pipe and memory rows only when the report has them (the tensor pipe's metric is named
    # after the instruction family the kernel uses)
    ("sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
     "tensor pipe (wgmma) busy, % of active cycles", "{:.1f}", False),
    ("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
     "tensor pipe (mma.sync) busy, % of active cycles", "{:.1f}", False),
    ("lts__throughput.avg.pct_of_peak_sustained_elapsed", "L2 throughput, % of peak", "{:.1f}", False),
    ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "DRAM throughput, % of peak", "{:.1f}", False),
    ("launch__registers_per_thread", "registers per thread", "{:.0f}", True),
    ("launch__block_size", "threads per block", "{:.0f}", True),
    ("launch__grid_size", "blocks", "{:,.0f}", True),
)


def parse_shape(text):
    """(B, N, H, D, dropout or None) of a named shape or of B,N,H,D (positive integers)."""
    if text in bench_attention.NAMED_SHAPES:
        B, N, H, D, drop = bench_attention.NAMED_SHAPES[text]
        return B, N, H, D, drop
    parts = text.split(",")
    if len(parts) != 4 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(
            f"expected {' or '.join(bench_attention.NAMED_SHAPES)} or B,N,H,D (four positive integers), got '{text}'")
    B, N, H, D = (int(p) for p in parts)
    if D not in bench_attention.FLASH_HEAD_DIMS:
        raise argparse.ArgumentTypeError(
            f"head size D = {D} has no flash kernel: use one of {', '.join(map(str, bench_attention.FLASH_HEAD_DIMS))}")
    return B, N, H, D, None


def _number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def summarize_raw(text):
    """From `ncu --import REP --page raw --csv` (a header row, a units row, one row per kernel):
    the first kernel's name, its SUMMARY metrics by label and its stall reasons' shares, largest
    first."""
    rows = list(csv.reader(io.StringIO(text)))
    rows = [r for r in rows if r and not r[0].startswith("==")]
    if len(rows) < 3:
        raise ValueError("the report holds no kernel (did the kernel-name filter match none?)")
    head, units, vals = rows[0], rows[1], rows[2]
    col = {name: i for i, name in enumerate(head)}
    name = vals[col["Kernel Name"]] if "Kernel Name" in col else "?"
    metrics = {label: _number(vals[col[m]]) for m, label, _, _ in SUMMARY if m in col}
    if TIME in col and metrics.get("time us") is not None:  # ncu picks the unit by the size
        unit = units[col[TIME]] if col[TIME] < len(units) else ""
        if unit not in US_PER:
            raise ValueError(f"unknown unit '{unit}' of {TIME}")
        metrics["time us"] *= US_PER[unit]
    stalls = {h[len(STALL):]: _number(vals[i]) or 0.0 for h, i in col.items()
              if h.startswith(STALL) and "not_issued" not in h}
    total = sum(stalls.values())
    shares = sorted(((k, v / total) for k, v in stalls.items() if v > 0), key=lambda kv: -kv[1]) if total else []
    return {"name": name, "metrics": metrics, "stalls": shares}


def opcode_mix(text, top):
    """From `ncu --import REP --page source --csv --print-source sass`: executed warp instructions
    per opcode (predicate and modifiers cut: `@!P0 IMAD.WIDE.U32 ...` counts as IMAD), the `top`
    largest, and the total."""
    rows = [r for r in csv.reader(io.StringIO(text)) if r]
    head_at = next((i for i, r in enumerate(rows) if "Source" in r and "Instructions Executed" in r), None)
    if head_at is None:
        raise ValueError("no SASS source table in the report (ncu --page source --print-source sass)")
    head = rows[head_at]
    i_src, i_ex = head.index("Source"), head.index("Instructions Executed")
    counts = {}
    for r in rows[head_at + 1:]:
        if len(r) <= max(i_src, i_ex):
            continue
        words = r[i_src].split()
        if words and words[0].startswith("@"):
            words = words[1:]
        n = _number(r[i_ex]) or 0.0
        if words and n:
            op = words[0].split(".")[0]
            counts[op] = counts.get(op, 0.0) + n
    total = sum(counts.values())
    return sorted(counts.items(), key=lambda kv: -kv[1])[:top], total


def print_summary(title, summary, mix):
    print(title)
    print(f"kernel: {summary['name']}")
    print("| metric | value |")
    print("| --- | --- |")
    for m, label, fmt, always in SUMMARY:
        v = summary["metrics"].get(label)
        if v is not None or always:
            print(f"| {label} | {fmt.format(v) if v is not None else '-'} |")
    print("\n| stall reason (PC samples) | share |")
    print("| --- | --- |")
    for reason, share in summary["stalls"]:
        if share >= 0.005:
            print(f"| {reason} | {100 * share:.1f}% |")
    if mix:
        ops, total = mix
        print("\n| opcode | warp instructions | share |")
        print("| --- | --- | --- |")
        for op, n in ops:
            print(f"| {op} | {n:,.0f} | {100 * n / total:.1f}% |")


def worker(args):
    """The calls ncu watches: RUNS forwards and backwards of the shape."""
    bench_attention.load_torch()
    torch = bench_attention.torch
    if not torch.cuda.is_available():
        sys.exit("profile_attention.py: no CUDA GPU visible to PyTorch")
    B, N, H, D, _ = args.shape
    lib = bench_attention.Ours(args.lib, args.kernel)
    torch.manual_seed(0)
    q, k, v, dout = (torch.randn(B, N, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    out = torch.empty_like(q)
    lse = torch.empty(B, H, N, device="cuda", dtype=torch.float32)
    p = bench_attention.with_dropout(lib.params(q, k, v, out, lse, not args.full), args.dropout)
    ws = lib.workspace(p)  # held while the calls run
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    for _ in range(RUNS):
        lib.forward(p)
        lib.backward(p, dout, dq, dk, dv)
    torch.cuda.synchronize()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", type=parse_shape, default="gpt2", help="gpt2, shakespeare_char or B,N,H,D")
    ap.add_argument("--full", action="store_true", help="no causal mask")
    ap.add_argument("--dropout", type=bench_attention.unit_fraction, default=None,
                    help="attention dropout probability (default: the named shape's, else 0)")
    ap.add_argument("--pass", dest="pass_", choices=("fwd", "bwd"), default="bwd", help="the kernel profiled")
    ap.add_argument("--lib", default=os.path.join(ROOT, "build", "libattention.so"))
    ap.add_argument("--kernel", choices=("auto", "sm90", "sm80"), default="auto",
                    help="kernel family of the attention context (attention.kernel)")
    ap.add_argument("--out", default="profile_attention", help="folder of the report")
    ap.add_argument("--ncu", default=shutil.which("ncu") or "/usr/local/cuda/bin/ncu")
    ap.add_argument("--mix", type=int, default=12, help="opcodes listed (0: none)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.dropout is None:
        args.dropout = args.shape[4] or 0.0
    if not os.path.isfile(args.lib):
        ap.error(f"--lib: no such file: '{args.lib}' (make libattention builds build/libattention.so)")
    if args.mix < 0:
        ap.error("--mix: expected 0 or more opcodes")
    if args.worker:
        worker(args)
        return 0
    if not (os.path.isfile(args.ncu) and os.access(args.ncu, os.X_OK)):
        ap.error(f"--ncu: Nsight Compute's ncu is not at '{args.ncu}' (install it or pass its path)")
    B, N, H, D, _ = args.shape
    name = f"{B}x{N}x{H}x{D}_{'full' if args.full else 'causal'}_{args.pass_}"
    os.makedirs(args.out, exist_ok=True)
    rep = os.path.join(args.out, name)
    me = [sys.executable, os.path.abspath(__file__), "--worker", "--shape", f"{B},{N},{H},{D}", "--lib", args.lib,
          "--kernel", args.kernel, "--dropout", str(args.dropout)]
    me += ["--full"] * args.full
    cmd = [args.ncu, "--kernel-name-base", "demangled", "--kernel-name", MAIN_KERNEL[args.pass_],
           "--launch-skip", str(RUNS - 1), "--launch-count", "1", "--set", "full",
           "--clock-control", "none", "--cache-control", "none", "-f", "-o", rep] + me
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stdout[-3000:] + p.stderr[-3000:])
        sys.exit(f"profile_attention.py: ncu failed (exit status {p.returncode})")
    raw = subprocess.run([args.ncu, "--import", rep + ".ncu-rep", "--page", "raw", "--csv"],
                         capture_output=True, text=True, check=True).stdout
    mix = None
    if args.mix:
        src = subprocess.run([args.ncu, "--import", rep + ".ncu-rep", "--page", "source", "--csv",
                              "--print-source", "sass"], capture_output=True, text=True, check=True).stdout
        mix = opcode_mix(src, args.mix)
    title = (f"{'forward' if args.pass_ == 'fwd' else 'backward'}, B {B} x N {N}, {H} heads of {D}, "
             f"{'full' if args.full else 'causal'}, dropout {args.dropout:g} (report: {rep}.ncu-rep)")
    try:
        summary = summarize_raw(raw)
    except ValueError as e:  # a report this script cannot read: say so, no traceback
        sys.exit(f"profile_attention.py: {rep}.ncu-rep: {e}")
    print_summary(title, summary, mix)
    return 0


if __name__ == "__main__":
    sys.exit(main())
