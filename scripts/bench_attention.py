#!/usr/bin/env python3
"""Benchmark flashgpt's CUDA attention against PyTorch in the same process, on the same inputs.

Loads build/libattention.so (make libattention) through the package's ctypes layer
(python/flashgpt/_lib.py) and calls attn_forward / attn_backward directly on an attention context
of the current CUDA stream, on PyTorch tensors (scripts/bench_flash_attn_func.py times the public
flash_attn_func instead, Python overhead included). First a correctness check against a float64 PyTorch
reference, then one table: shape, our forward/backward TFLOP/s, PyTorch SDPA's flash, efficient
and cuDNN backends, and our ratio to flash. FLOPs by the FlashAttention convention: forward
4*B*H*N*N*D (halved when causal), backward 2.5x forward. Then the memory/time table of one
GPT-2-small attention layer (B=8, 12 heads, head dim 64, causal), naive against flash.

The shapes: for every head dim D of --heads (default 64,128; the flash kernels have 32, 64, 96,
128 and 256), causal and full, every length N of --seqs, with B*N = 16K tokens and 2048 // D
heads; then the rows --shapes names, causal, each exactly one model's training attention:
  gpt2              GPT-2 124M: B 16 x 1024, 12 heads of 64
  shakespeare_char  nanoGPT's shakespeare_char: B 64 x 256, 6 heads of 64, dropout 0.2

A/B mode (--ab OTHER.so): two builds of the library, loaded side by side in this process, timed
on the same inputs in interleaved rounds: in round r each shape is timed with library A (--lib)
and library B (--ab) back to back, A first where r plus the shape's index is even and B first
where it is odd, so neither library is always the one timed on a GPU that has just been busy;
each time is the median of --reps CUDA-event timings after two warm-up calls. After --rounds
rounds it prints, per shape, the median over rounds of A's and B's TFLOP/s, the ratio B/A (the
median of the per-round ratios: each ratio pairs A and B measured back to back, so a slow drift
of the GPU's clock cancels) and the lowest and highest per-round ratio (the spread); an even
number of rounds gives each library the first place equally often for every shape. PyTorch's backends and the memory table are not timed in this mode.
Both libraries must take this checkout's AttnParams layout (attention/attention.h, mirrored by
the package); a build from before attention contexts is refused with a message.
To measure a change, build the commit before it in a worktree and pass that build as A, the
changed one as B (B/A > 1: the change made it faster):

    git worktree add ../base HEAD~1 && make -C ../base libattention && make libattention
    python3 scripts/bench_attention.py --lib ../base/build/libattention.so \\
        --ab build/libattention.so --seqs 8192,32768

Arguments (and that both files exist) are checked before PyTorch is imported or a GPU is needed.

Feature-cost mode (--softcap CAP, --dropout P, --alibi, any of them): the same interleaved
rounds and table, A being --lib as it is and B the same library with those features set on every
call (ALiBi: the usual 2^(-8 (h + 1) / H) slopes), so B/A < 1 is what they cost. A named
shape's own dropout (shakespeare_char's 0.2) is left off in this mode, so A runs no feature at
any row and that row's B/A is the cost of --dropout P alone:

    python3 scripts/bench_attention.py --softcap 50 --seqs 2048,8192 --rounds 3

With --ab OTHER.so as well, the A/B of the two builds with those features set on both.

usage: python3 scripts/bench_attention.py [--lib build/libattention.so] [--quick] [--seqs N,N,...]
           [--heads D,D,...] [--shapes NAME,...] [--no-memory] [--json OUT.json] [--reps 10]
           [--ab OTHER.so [--rounds 5]] [--softcap CAP] [--dropout P] [--alibi]
           [--kernel auto|sm90|sm80]
"""
import argparse
import json
import math
import os
import statistics
import sys

# The package (python/flashgpt), beside PyTorch, is imported by load_torch() once the arguments
# are checked.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
torch = F = SDPBackend = sdpa_kernel = _lib = interface = None

FLASH_HEAD_DIMS = (32, 64, 96, 128, 256)   # the head dims with flash kernels
SWEEP_TOKENS, SWEEP_WIDTH = 16384, 2048    # the D sweep: B*N tokens, about H*D = 2048
# --shapes: (B, N, H, D, dropout) of a model's training attention, causal.
NAMED_SHAPES = {
    "gpt2": (16, 1024, 12, 64, 0.0),
    "shakespeare_char": (64, 256, 6, 64, 0.2),
}


def speed_shapes(heads, seqs, names=(), own_dropout=True):
    """The rows of the speed and A/B tables: the D sweep over heads x (causal, full) x seqs, then
    the named shapes. Each a dict of name (None in the sweep), D, causal, N, B, H, dropout (a
    named shape's own, or 0 without own_dropout)."""
    rows = [{"name": None, "D": D, "causal": causal, "N": N, "B": max(1, SWEEP_TOKENS // N),
             "H": max(1, SWEEP_WIDTH // D), "dropout": 0.0}
            for D in heads for causal in (True, False) for N in seqs]
    for name in names:
        B, N, H, D, drop = NAMED_SHAPES[name]
        rows.append({"name": name, "D": D, "causal": True, "N": N, "B": B, "H": H,
                     "dropout": drop if own_dropout else 0.0})
    return rows


def mask_text(sh):
    """The table's mask cell: causal or full, and a named shape's name and dropout."""
    text = "causal" if sh["causal"] else "full"
    extra = [sh["name"]] * (sh["name"] is not None) + [f"dropout {sh['dropout']:g}"] * (sh["dropout"] > 0)
    return f"{text} ({', '.join(extra)})" if extra else text


def fwd_flops(sh):
    """The forward's FLOPs of a shape (FlashAttention's convention; backward: 2.5x)."""
    return 4 * sh["B"] * sh["H"] * sh["N"] * sh["N"] * sh["D"] / (2 if sh["causal"] else 1)


class Ours:
    """One build of our library on (B, T, H, D) CUDA tensors; workspace allocated through
    PyTorch (counted in its peak)."""

    def __init__(self, lib_path, kernel="auto"):
        self.path = lib_path
        self.lib = _lib.Library(lib_path)
        family = {"auto": _lib.KERNEL_AUTO, "sm90": _lib.KERNEL_SM90, "sm80": _lib.KERNEL_SM80}[kernel]
        self.ctx = self.lib.context(_lib.DEVICE_CUDA, torch.cuda.current_device(),
                                    torch.cuda.current_stream().cuda_stream, family)

    def params(self, q, k, v, out, lse, causal, impl=None):
        """The problem's AttnParams; impl None: the flash kernels."""
        p = interface.attn_params(q, k, v, out, lse, interface.Options(1.0 / math.sqrt(q.shape[3]), causal))
        if impl is not None:
            p.impl = impl
        return p

    def workspace(self, p):
        return interface.workspace(self.lib, p, _lib.DEVICE_CUDA, "cuda")

    def forward(self, p):
        self.lib.forward(self.ctx, p)

    def backward(self, p, dout, dq, dk, dv):
        interface.set_grads(p, dout, dq, dk, dv)
        self.lib.backward(self.ctx, p)

    def run(self, q, k, v, dout, causal):
        """out, dq, dk, dv of one forward and backward."""
        out = torch.empty_like(q)
        lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], device="cuda", dtype=torch.float32)
        p = self.params(q, k, v, out, lse, causal)
        ws = self.workspace(p)
        self.forward(p)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        self.backward(p, dout, dq, dk, dv)
        del ws
        return out, dq, dk, dv

    def timings(self, q, k, v, dout, causal, reps, dropout=0.0):
        """Forward and backward times (ms) of the kernels alone, on preallocated buffers."""
        out = torch.empty_like(q)
        lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], device="cuda", dtype=torch.float32)
        p = with_dropout(self.params(q, k, v, out, lse, causal), dropout)
        ws = self.workspace(p)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        fwd = time_ms(lambda: self.forward(p), reps)
        bwd = time_ms(lambda: self.backward(p, dout, dq, dk, dv), reps)
        del ws
        return fwd, bwd


class WithFeatures:
    """A library (Ours) with soft-capping, dropout and/or ALiBi set on every call's params: B of
    the feature-cost mode, timed against the library as it is."""

    def __init__(self, base, softcap, dropout_p, alibi):
        self.base, self.softcap, self.dropout_p, self.alibi = base, softcap, dropout_p, alibi
        names = [f"softcap {softcap:g}"] * (softcap > 0) + [f"dropout {dropout_p:g}"] * (dropout_p > 0)
        self.path = f"{base.path} with {', '.join(names + ['ALiBi'] * alibi)}"
        self.slopes = {}  # per head count: (H) fp32 slopes on the GPU, kept alive across calls

    def params(self, q, k, v, out, lse, causal, impl=None):
        p = self.base.params(q, k, v, out, lse, causal, impl)
        p.softcap = self.softcap
        p.dropout_p, p.seed, p.offset = self.dropout_p, 1234, 0
        if self.alibi:
            H = q.shape[2]
            if H not in self.slopes:
                self.slopes[H] = torch.tensor([2.0 ** (-8.0 * (h + 1) / H) for h in range(H)], device="cuda")
            p.alibi_slopes = self.slopes[H].data_ptr()
        return p

    def workspace(self, p):
        return self.base.workspace(p)

    def forward(self, p):
        self.base.forward(p)

    def backward(self, p, dout, dq, dk, dv):
        self.base.backward(p, dout, dq, dk, dv)


def with_dropout(p, dropout):
    """p with a shape's attention dropout, unless the feature-cost mode set one already."""
    if dropout > 0 and not p.dropout_p:
        p.dropout_p, p.seed, p.offset = dropout, 1234, 0
    return p


def time_ms(fn, reps):
    """Median of `reps` CUDA-event timings after two warm-up calls."""
    fn()
    fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def rel_err(a, ref):
    return ((a.double() - ref).norm() / ref.norm()).item()


def sdpa(q, k, v, causal, dropout=0.0):  # (B, T, H, D) in, (B, T, H, D) out
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal,
                                       dropout_p=dropout, enable_gqa=q.shape[2] != k.shape[2])
    return o.transpose(1, 2)


def check_correctness(run, dtype):
    """Ours (run(q, k, v, dout, causal) -> out, dq, dk, dv) and PyTorch flash against float64 on
    odd shapes; prints both errors."""
    print("correctness vs float64 (rel. error; ours | torch flash):")
    ok = True
    for (B, T, H, HKV, D, causal) in [(2, 257, 4, 4, 64, True), (1, 1000, 4, 2, 128, False), (2, 97, 2, 1, 128, True)]:
        torch.manual_seed(0)
        q = torch.randn(B, T, H, D, device="cuda", dtype=dtype, requires_grad=True)
        k = torch.randn(B, T, HKV, D, device="cuda", dtype=dtype, requires_grad=True)
        v = torch.randn(B, T, HKV, D, device="cuda", dtype=dtype, requires_grad=True)
        dout = torch.randn(B, T, H, D, device="cuda", dtype=dtype)
        q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
        with sdpa_kernel(SDPBackend.MATH):
            o64 = sdpa(q64, k64, v64, causal)
        g64 = torch.autograd.grad(o64, (q64, k64, v64), dout.double())
        out, dq, dk, dv = run(q, k, v, dout, causal)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            of = sdpa(q, k, v, causal)
        gf = torch.autograd.grad(of, (q, k, v), dout)
        torch.cuda.synchronize()
        errs = [(rel_err(a, r), rel_err(b, r)) for a, b, r in zip((out, dq, dk, dv), (of,) + gf, (o64,) + g64)]
        line = " ".join(f"{n} {e0:.1e}|{e1:.1e}" for n, (e0, e1) in zip(("o", "dq", "dk", "dv"), errs))
        good = all(e0 <= 2 * e1 + 1e-4 for e0, e1 in errs)
        ok &= good
        print(f"  B={B} T={T} H={H}/{HKV} D={D} causal={int(causal)}: {line} {'ok' if good else 'FAIL'}")
    return ok


def bench_speed(timings, dtype, shapes, reps):
    """The speed table's rows, one per shape (speed_shapes): ours (timings(q, k, v, dout, causal,
    reps, dropout) -> forward and backward ms) beside PyTorch SDPA's flash, efficient and cuDNN
    backends."""
    rows = []
    for sh in shapes:
        B, N, H, D, causal, drop = sh["B"], sh["N"], sh["H"], sh["D"], sh["causal"], sh["dropout"]
        torch.manual_seed(0)
        q = torch.randn(B, N, H, D, device="cuda", dtype=dtype, requires_grad=True)
        k = torch.randn(B, N, H, D, device="cuda", dtype=dtype, requires_grad=True)
        v = torch.randn(B, N, H, D, device="cuda", dtype=dtype, requires_grad=True)
        dout = torch.randn(B, N, H, D, device="cuda", dtype=dtype)
        tf = lambda ms, mult=1.0: fwd_flops(sh) * mult / (ms * 1e-3) / 1e12
        row = dict(sh)
        ms_f, ms_b = timings(q, k, v, dout, causal, reps, drop)
        row["ours_fwd"], row["ours_bwd"] = tf(ms_f), tf(ms_b, 2.5)
        for name, be in (("flash", SDPBackend.FLASH_ATTENTION), ("eff", SDPBackend.EFFICIENT_ATTENTION),
                         ("cudnn", SDPBackend.CUDNN_ATTENTION)):
            try:
                with sdpa_kernel(be):
                    row[name + "_fwd"] = tf(time_ms(lambda: sdpa(q, k, v, causal, drop), reps))
                    o = sdpa(q, k, v, causal, drop)
                    row[name + "_bwd"] = tf(time_ms(
                        lambda: torch.autograd.grad(o, (q, k, v), dout, retain_graph=True), reps), 2.5)
                    del o
            except RuntimeError as e:
                row[name + "_fwd"] = row[name + "_bwd"] = float("nan")
                print(f"  {name} unavailable for D={D} N={N}: {str(e).splitlines()[0]}", file=sys.stderr)
        rows.append(row)
        del q, k, v, dout
        torch.cuda.empty_cache()
    return rows


def print_speed(speed, dtype_name):
    print(f"\n{dtype_name}, TFLOP/s (fwd 4BHN^2D, /2 causal; bwd 2.5x); the D sweep at B*N = 16K tokens "
          f"and 2048 // D heads:")
    print("| D | mask | B x N | H | ours fwd | flash | eff | cudnn | ours/flash | ours bwd | flash | eff | cudnn | "
          "ours/flash |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in speed:
        print(f"| {r['D']} | {mask_text(r)} | {r['B']} x {r['N']} | {r['H']} | {r['ours_fwd']:.0f} | "
              f"{r['flash_fwd']:.0f} | {r['eff_fwd']:.0f} | {r['cudnn_fwd']:.0f} | {r['ours_fwd'] / r['flash_fwd']:.2f} | "
              f"{r['ours_bwd']:.0f} | {r['flash_bwd']:.0f} | {r['eff_bwd']:.0f} | {r['cudnn_bwd']:.0f} | "
              f"{r['ours_bwd'] / r['flash_bwd']:.2f} |")


def bench_memory(ours, dtype, seqs):
    """One GPT-2-small attention layer: B=8, 12 heads, D=64, causal, forward + backward."""
    rows = []
    B, H, D = 8, 12, 64
    for N in seqs:
        for impl, name in ((_lib.IMPL_FLASH, "flash"), (_lib.IMPL_NAIVE, "naive")):
            torch.cuda.empty_cache()
            q, k, v, dout = (torch.randn(B, N, H, D, device="cuda", dtype=dtype) for _ in range(4))
            out, dq, dk, dv = (torch.empty_like(q) for _ in range(4))
            lse = torch.empty(B, H, N, device="cuda", dtype=torch.float32)
            p = ours.params(q, k, v, out, lse, True, impl=impl)
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            try:
                def step():
                    ws = ours.workspace(p)
                    ours.forward(p)
                    ours.backward(p, dout, dq, dk, dv)
                    del ws
                ms = time_ms(step, 3)
                extra = (torch.cuda.max_memory_allocated() - base) / 2**30
                rows.append({"N": N, "impl": name, "ms": ms, "extra_gib": extra})
            except torch.OutOfMemoryError:
                rows.append({"N": N, "impl": name, "ms": float("nan"), "extra_gib": float("inf")})
            del q, k, v, dout, out, dq, dk, dv, lse
    return rows


def bench_ab(libs, dtype, shapes, reps, rounds):
    """Interleaved A/B of two builds (or of one without and with features): each round times
    every shape (speed_shapes) with both libraries back to back, libs[0] first where the round
    plus the shape's index is even, libs[1] first where it is odd.

    Every (round, library, shape) gets fresh inputs from the same seed, its own workspace, two
    warm-up calls and the median of `reps` timings, forward first (the backward needs its out
    and lse). Returns one dict per shape: the shape, and per pass each library's median and
    per-round TFLOP/s and the median, lowest and highest of the per-round ratios B/A."""
    res = [{"fwd": ([], []), "bwd": ([], [])} for _ in shapes]
    for r in range(rounds):
        for si, sh in enumerate(shapes):
            for li in ((0, 1) if (r + si) % 2 == 0 else (1, 0)):
                lib = libs[li]
                B, N, H, D = sh["B"], sh["N"], sh["H"], sh["D"]
                torch.manual_seed(0)
                q, k, v, dout = (torch.randn(B, N, H, D, device="cuda", dtype=dtype) for _ in range(4))
                out, dq, dk, dv = (torch.empty_like(q) for _ in range(4))
                lse = torch.empty(B, H, N, device="cuda", dtype=torch.float32)
                p = with_dropout(lib.params(q, k, v, out, lse, sh["causal"]), sh["dropout"])
                ws = lib.workspace(p)
                ms_f = time_ms(lambda: lib.forward(p), reps)
                ms_b = time_ms(lambda: lib.backward(p, dout, dq, dk, dv), reps)
                res[si]["fwd"][li].append(fwd_flops(sh) / (ms_f * 1e-3) / 1e12)
                res[si]["bwd"][li].append(2.5 * fwd_flops(sh) / (ms_b * 1e-3) / 1e12)
                del q, k, v, dout, out, dq, dk, dv, lse, ws
                torch.cuda.empty_cache()
        print(f"  round {r + 1}/{rounds} done", file=sys.stderr, flush=True)
    rows = []
    for sh, got in zip(shapes, res):
        row = dict(sh)
        for pas in ("fwd", "bwd"):
            a, b = got[pas]
            per_round = [y / x for x, y in zip(a, b)]
            row[pas] = {"tflops_a": statistics.median(a), "tflops_b": statistics.median(b),
                        "b_over_a": statistics.median(per_round),
                        "b_over_a_min": min(per_round), "b_over_a_max": max(per_round),
                        "rounds_a": a, "rounds_b": b}
        rows.append(row)
    return rows


def print_ab(rows, lib_a, lib_b, rounds, reps):
    print(f"\nA: {lib_a}\nB: {lib_b}")
    print(f"bf16, the D sweep at B*N = 16K tokens and 2048 // D heads; TFLOP/s, median of {rounds} "
          f"interleaved rounds (each the median of {reps} timings); B/A and spread: median and range of "
          f"the per-round B/A")
    print("| D | mask | B x N | H | fwd A | fwd B | B/A | spread | bwd A | bwd B | B/A | spread |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        cells = []
        for pas in ("fwd", "bwd"):
            x = r[pas]
            cells.append(f"{x['tflops_a']:.0f} | {x['tflops_b']:.0f} | {x['b_over_a']:.3f} | "
                         f"{x['b_over_a_min']:.3f}-{x['b_over_a_max']:.3f}")
        print(f"| {r['D']} | {mask_text(r)} | {r['B']} x {r['N']} | {r['H']} | {cells[0]} | {cells[1]} |")


def seq_list(text):
    """argparse type of --seqs: positive integers separated by commas."""
    try:
        seqs = [int(x) for x in text.split(",")]
    except ValueError:
        seqs = []
    if not seqs or min(seqs) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas, got '{text}'")
    return seqs


def head_list(text):
    """argparse type of --heads: head dims with flash kernels, separated by commas."""
    try:
        heads = [int(x) for x in text.split(",")]
    except ValueError:
        heads = []
    if not heads or any(D not in FLASH_HEAD_DIMS for D in heads):
        raise argparse.ArgumentTypeError(f"expected head dims among {', '.join(map(str, FLASH_HEAD_DIMS))} "
                                         f"separated by commas, got '{text}'")
    return heads


def shape_list(text):
    """argparse type of --shapes: names of NAMED_SHAPES separated by commas."""
    names = text.split(",")
    if not all(n in NAMED_SHAPES for n in names):
        raise argparse.ArgumentTypeError(f"expected names among {', '.join(NAMED_SHAPES)} separated by commas, "
                                         f"got '{text}'")
    return names


def checked(cast, ok, expected):
    """An argparse type: the text cast to a number that must satisfy ok."""
    def parse(text):
        try:
            x = cast(text)
        except ValueError:
            x = None
        if x is None or not ok(x):
            raise argparse.ArgumentTypeError(f"expected {expected}, got '{text}'")
        return x
    return parse


positive_int = checked(int, lambda n: n >= 1, "a positive integer")  # --reps, --rounds
positive_float = checked(float, lambda x: x > 0 and math.isfinite(x), "a finite number > 0")  # --softcap
unit_fraction = checked(float, lambda x: 0 <= x < 1, "a probability in [0, 1)")  # --dropout


def load_torch():
    """Import PyTorch (after the arguments are checked, so that they fail first without it)."""
    global torch, F, SDPBackend, sdpa_kernel, _lib, interface
    try:
        import torch as _torch
        import torch.nn.functional as _F
        from torch.nn.attention import SDPBackend as _B, sdpa_kernel as _k
    except ImportError as e:
        sys.exit(f"bench_attention.py: needs PyTorch 2.5 or later with CUDA ({e})")
    from flashgpt import _lib as _l, interface as _i
    torch, F, SDPBackend, sdpa_kernel, _lib, interface = _torch, _F, _B, _k, _l, _i


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", default="build/libattention.so", help="our library (A in --ab mode)")
    ap.add_argument("--quick", action="store_true", help="fewer sequence lengths")
    ap.add_argument("--seqs", type=seq_list, help="comma-separated sequence lengths for the speed table (overrides --quick)")
    ap.add_argument("--heads", type=head_list, default=[64, 128],
                    help="comma-separated head dims of the speed table's sweep (default 64,128)")
    ap.add_argument("--shapes", type=shape_list, default=[],
                    help=f"comma-separated model shapes added to the speed table: {', '.join(NAMED_SHAPES)}")
    ap.add_argument("--no-memory", action="store_true", help="skip the GPT-2-small memory/time table")
    ap.add_argument("--json", help="write the raw numbers here")
    ap.add_argument("--reps", type=positive_int, default=10, help="timings per measurement (median)")
    ap.add_argument("--ab", metavar="OTHER.so", help="A/B mode: time --lib (A) against this other build "
                    "of libattention.so (B) in interleaved rounds")
    ap.add_argument("--rounds", type=positive_int, help="rounds of the A/B mode (default 5)")
    ap.add_argument("--softcap", type=positive_float, default=0.0, help="feature-cost mode: soft-capping at CAP")
    ap.add_argument("--dropout", type=unit_fraction, default=0.0, help="feature-cost mode: dropout probability P")
    ap.add_argument("--alibi", action="store_true", help="feature-cost mode: ALiBi slopes")
    ap.add_argument("--kernel", choices=("auto", "sm90", "sm80"), default="auto",
                    help="kernel family of every library's context (attention.kernel)")
    args = ap.parse_args()
    features = args.softcap > 0 or args.dropout > 0 or args.alibi
    for opt, path in (("--lib", args.lib), ("--ab", args.ab)):
        if path is not None and not os.path.isfile(path):
            ap.error(f"{opt}: no such file: '{path}' (make libattention builds build/libattention.so)")
    if args.rounds is not None and not (args.ab or features):
        ap.error("--rounds applies to the A/B and feature-cost modes only (--ab OTHER.so, --softcap, ...)")
    rounds = args.rounds or 5
    load_torch()
    if not torch.cuda.is_available():
        sys.exit("bench_attention.py: no CUDA GPU visible to PyTorch")
    libs = []
    for opt, path in (("--lib", args.lib), ("--ab", args.ab)):
        if path is None:
            continue
        try:
            libs.append(Ours(path, args.kernel))
        except (OSError, RuntimeError) as e:
            ap.error(f"{opt}: cannot load '{path}' as flashgpt's attention library: {e}")
    if args.ab and os.path.samefile(args.lib, args.ab):
        print("note: --lib and --ab are the same file: one library timed against itself (an A/A run)")
    plain = list(libs)
    if features and args.ab:
        libs = [WithFeatures(lib, args.softcap, args.dropout, args.alibi) for lib in plain]
    elif features:
        libs.append(WithFeatures(plain[0], args.softcap, args.dropout, args.alibi))
    dtype = torch.bfloat16
    print(f"GPU: {torch.cuda.get_device_name()}, PyTorch {torch.__version__}, CUDA {torch.version.cuda}")
    ok = True
    for lib in plain:  # the features change the result: PyTorch checks the libraries as they are
        if len(libs) > 1:
            print(f"{'A' if lib is plain[0] else 'B'}: {lib.path}")
        ok &= check_correctness(lib.run, dtype)
    seqs = [1024, 8192] if args.quick else [1024, 2048, 4096, 8192, 16384, 32768]
    if args.seqs:
        seqs = args.seqs
    shapes = speed_shapes(args.heads, seqs, args.shapes, own_dropout=not features or bool(args.ab))
    if len(libs) > 1:
        rows = bench_ab(libs, dtype, shapes, args.reps, rounds)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"lib_a": args.lib, "lib_b": libs[1].path, "rounds": rounds, "reps": args.reps,
                           "ab": rows, "correct": ok}, f, indent=1)
        print_ab(rows, args.lib, libs[1].path, rounds, args.reps)
        print(f"\ncorrectness: {'ok' if ok else 'FAIL'}")
        return 0 if ok else 1
    ours = plain[0]
    speed = bench_speed(ours.timings, dtype, shapes, args.reps)
    mem = [] if args.no_memory else bench_memory(ours, dtype, [2048, 8192] if args.quick else [2048, 8192, 32768])
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"speed": speed, "memory": mem, "correct": ok}, f, indent=1)
    if mem:
        print("\nGPT-2-small attention layer (B=8, H=12, D=64, causal), forward+backward:")
        print("| seq | flash ms | flash extra GiB | naive ms | naive extra GiB |")
        print("| --- | --- | --- | --- | --- |")
    for N in sorted({r["N"] for r in mem}):
        f = next(r for r in mem if r["N"] == N and r["impl"] == "flash")
        n = next(r for r in mem if r["N"] == N and r["impl"] == "naive")
        nv = "OOM" if math.isinf(n["extra_gib"]) else f"{n['ms']:.1f} | {n['extra_gib']:.2f}"
        print(f"| {N} | {f['ms']:.2f} | {f['extra_gib']:.2f} | {nv if nv != 'OOM' else 'OOM | OOM'} |")
    print_speed(speed, "bf16")
    print(f"\ncorrectness: {'ok' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
