#!/usr/bin/env python3
"""Benchmark flashgpt's CUDA attention against PyTorch in the same process, on the same inputs.

Loads build/libattention.so (make libattention) through ctypes and calls attn_forward_cuda /
attn_backward_cuda on PyTorch tensors. First a correctness check against a float64 PyTorch
reference, then one table: shape, our forward/backward TFLOP/s, PyTorch SDPA's flash, efficient
and cuDNN backends, and our ratio to flash. FLOPs by the FlashAttention convention: forward
4*B*H*N*N*D (halved when causal), backward 2.5x forward. Then the memory/time table of one
GPT-2-small attention layer (B=8, 12 heads, head dim 64, causal), naive against flash.

usage: python3 scripts/bench_attention.py [--lib build/libattention.so] [--quick] [--no-memory] [--json OUT.json]
"""
import argparse
import ctypes as C
import json
import math
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

ATTN_BF16, ATTN_F16 = 1, 2
ATTN_IMPL_FLASH, ATTN_IMPL_NAIVE = 0, 1
ATTN_CUDA = 1


class Strides(C.Structure):
    _fields_ = [("batch", C.c_int64), ("row", C.c_int64), ("head", C.c_int64)]


class AttnParams(C.Structure):  # attention/attention.h, field for field
    _fields_ = [
        ("q", C.c_void_p), ("k", C.c_void_p), ("v", C.c_void_p), ("out", C.c_void_p), ("lse", C.c_void_p),
        ("q_st", Strides), ("k_st", Strides), ("v_st", Strides), ("o_st", Strides),
        ("dout", C.c_void_p), ("dq", C.c_void_p), ("dk", C.c_void_p), ("dv", C.c_void_p),
        ("do_st", Strides), ("dq_st", Strides), ("dk_st", Strides), ("dv_st", Strides),
        ("B", C.c_int), ("T_q", C.c_int), ("T_k", C.c_int), ("NH", C.c_int), ("NKV", C.c_int), ("HS", C.c_int),
        ("scale", C.c_float),
        ("causal", C.c_int), ("window_left", C.c_int), ("window_right", C.c_int),
        ("alibi_slopes", C.c_void_p), ("cu_seqlens", C.c_void_p), ("n_docs", C.c_int),
        ("dropout_p", C.c_float), ("seed", C.c_uint64), ("offset", C.c_uint64),
        ("dtype", C.c_int), ("impl", C.c_int), ("deterministic", C.c_int),
        ("stream", C.c_void_p), ("workspace", C.c_void_p), ("workspace_bytes", C.c_size_t),
    ]


def strides(t):  # (B, T, H, D) tensor -> element strides
    return Strides(t.stride(0), t.stride(1), t.stride(2))


class Ours:
    """Our kernels on (B, T, H, D) tensors; workspace allocated through PyTorch (counted in its peak)."""

    def __init__(self, lib_path):
        self.lib = C.CDLL(lib_path)
        self.lib.attn_workspace_bytes.restype = C.c_size_t
        self.lib.attn_workspace_bytes.argtypes = [C.POINTER(AttnParams), C.c_int]
        self.lib.attn_forward_cuda.argtypes = [C.POINTER(AttnParams)]
        self.lib.attn_backward_cuda.argtypes = [C.POINTER(AttnParams)]

    def params(self, q, k, v, out, lse, causal, impl=ATTN_IMPL_FLASH, deterministic=False):
        p = AttnParams()
        p.q, p.k, p.v, p.out, p.lse = q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr()
        p.q_st, p.k_st, p.v_st, p.o_st = strides(q), strides(k), strides(v), strides(out)
        p.B, p.T_q, p.NH, p.HS = q.shape[0], q.shape[1], q.shape[2], q.shape[3]
        p.T_k, p.NKV = k.shape[1], k.shape[2]
        p.scale = 1.0 / math.sqrt(p.HS)
        p.causal, p.window_left, p.window_right = int(causal), -1, -1
        p.dtype = ATTN_BF16 if q.dtype == torch.bfloat16 else ATTN_F16
        p.impl, p.deterministic = impl, int(deterministic)
        p.stream = torch.cuda.current_stream().cuda_stream
        return p

    def workspace(self, p):
        n = self.lib.attn_workspace_bytes(C.byref(p), ATTN_CUDA)
        ws = torch.empty(max(n, 16), dtype=torch.uint8, device="cuda")
        p.workspace, p.workspace_bytes = ws.data_ptr(), n
        return ws

    def forward(self, p):
        self.lib.attn_forward_cuda(C.byref(p))

    def backward(self, p, dout, dq, dk, dv):
        p.dout, p.dq, p.dk, p.dv = dout.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr()
        p.do_st, p.dq_st, p.dk_st, p.dv_st = strides(dout), strides(dq), strides(dk), strides(dv)
        self.lib.attn_backward_cuda(C.byref(p))


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


def sdpa(q, k, v, causal):  # (B, T, H, D) in, (B, T, H, D) out
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal,
                                       enable_gqa=q.shape[2] != k.shape[2])
    return o.transpose(1, 2)


def check_correctness(ours, dtype):
    """Ours and PyTorch flash against float64 on odd shapes; prints both errors."""
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
        out = torch.empty_like(q)
        lse = torch.empty(B, H, T, device="cuda", dtype=torch.float32)
        p = ours.params(q, k, v, out, lse, causal)
        ws = ours.workspace(p)
        ours.forward(p)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        ours.backward(p, dout, dq, dk, dv)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            of = sdpa(q, k, v, causal)
        gf = torch.autograd.grad(of, (q, k, v), dout)
        torch.cuda.synchronize()
        errs = [(rel_err(a, r), rel_err(b, r)) for a, b, r in zip((out, dq, dk, dv), (of,) + gf, (o64,) + g64)]
        line = " ".join(f"{n} {e0:.1e}|{e1:.1e}" for n, (e0, e1) in zip(("o", "dq", "dk", "dv"), errs))
        good = all(e0 <= 2 * e1 + 1e-4 for e0, e1 in errs)
        ok &= good
        print(f"  B={B} T={T} H={H}/{HKV} D={D} causal={int(causal)}: {line} {'ok' if good else 'FAIL'}")
        del ws
    return ok


def bench_speed(ours, dtype, seqs, reps):
    rows = []
    for D in (64, 128):
        H = 2048 // D
        for causal in (True, False):
            for N in seqs:
                B = max(1, 16384 // N)
                torch.manual_seed(0)
                q = torch.randn(B, N, H, D, device="cuda", dtype=dtype, requires_grad=True)
                k = torch.randn(B, N, H, D, device="cuda", dtype=dtype, requires_grad=True)
                v = torch.randn(B, N, H, D, device="cuda", dtype=dtype, requires_grad=True)
                dout = torch.randn(B, N, H, D, device="cuda", dtype=dtype)
                fwd_flops = 4 * B * H * N * N * D / (2 if causal else 1)
                tf = lambda ms, mult=1.0: fwd_flops * mult / (ms * 1e-3) / 1e12
                out = torch.empty_like(q)
                lse = torch.empty(B, H, N, device="cuda", dtype=torch.float32)
                p = ours.params(q, k, v, out, lse, causal)
                ws = ours.workspace(p)
                dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
                row = {"D": D, "causal": causal, "N": N, "B": B, "H": H}
                row["ours_fwd"] = tf(time_ms(lambda: ours.forward(p), reps))
                row["ours_bwd"] = tf(time_ms(lambda: ours.backward(p, dout, dq, dk, dv), reps), 2.5)
                for name, be in (("flash", SDPBackend.FLASH_ATTENTION), ("eff", SDPBackend.EFFICIENT_ATTENTION),
                                 ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                    try:
                        with sdpa_kernel(be):
                            row[name + "_fwd"] = tf(time_ms(lambda: sdpa(q, k, v, causal), reps))
                            o = sdpa(q, k, v, causal)
                            row[name + "_bwd"] = tf(time_ms(
                                lambda: torch.autograd.grad(o, (q, k, v), dout, retain_graph=True), reps), 2.5)
                            del o
                    except RuntimeError as e:
                        row[name + "_fwd"] = row[name + "_bwd"] = float("nan")
                        print(f"  {name} unavailable for D={D} N={N}: {str(e).splitlines()[0]}", file=sys.stderr)
                rows.append(row)
                del q, k, v, dout, out, lse, ws, dq, dk, dv
                torch.cuda.empty_cache()
    return rows


def bench_memory(ours, dtype, seqs):
    """One GPT-2-small attention layer: B=8, 12 heads, D=64, causal, forward + backward."""
    rows = []
    B, H, D = 8, 12, 64
    for N in seqs:
        for impl, name in ((ATTN_IMPL_FLASH, "flash"), (ATTN_IMPL_NAIVE, "naive")):
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


def seq_list(text):
    """argparse type of --seqs: positive integers separated by commas."""
    try:
        seqs = [int(x) for x in text.split(",")]
    except ValueError:
        seqs = []
    if not seqs or min(seqs) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas, got '{text}'")
    return seqs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", default="build/libattention.so")
    ap.add_argument("--quick", action="store_true", help="fewer sequence lengths")
    ap.add_argument("--seqs", type=seq_list, help="comma-separated sequence lengths for the speed table (overrides --quick)")
    ap.add_argument("--no-memory", action="store_true", help="skip the GPT-2-small memory/time table")
    ap.add_argument("--json", help="write the raw numbers here")
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    ours = Ours(args.lib)
    dtype = torch.bfloat16
    print(f"GPU: {torch.cuda.get_device_name()}, PyTorch {torch.__version__}, CUDA {torch.version.cuda}")
    ok = check_correctness(ours, dtype)
    seqs = [1024, 8192] if args.quick else [1024, 2048, 4096, 8192, 16384, 32768]
    if args.seqs:
        seqs = args.seqs
    speed = bench_speed(ours, dtype, seqs, args.reps)
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
    print("\nbf16, B*N = 16K tokens, H*D = 2048; TFLOP/s (fwd 4BHN^2D, /2 causal; bwd 2.5x):")
    print("| D | mask | N | ours fwd | flash | eff | cudnn | ours/flash | ours bwd | flash | eff | cudnn | ours/flash |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in speed:
        print(f"| {r['D']} | {'causal' if r['causal'] else 'full'} | {r['N']} | {r['ours_fwd']:.0f} | "
              f"{r['flash_fwd']:.0f} | {r['eff_fwd']:.0f} | {r['cudnn_fwd']:.0f} | {r['ours_fwd'] / r['flash_fwd']:.2f} | "
              f"{r['ours_bwd']:.0f} | {r['flash_bwd']:.0f} | {r['eff_bwd']:.0f} | {r['cudnn_bwd']:.0f} | "
              f"{r['ours_bwd'] / r['flash_bwd']:.2f} |")
    print(f"\ncorrectness: {'ok' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
