"""The Python package (python/flashgpt) on the CPU: its ctypes mirror of AttnParams against
attention/attention.h (through a C program compiled here), argument validation, the varlen
bookkeeping, and flash_attn_func / qkvpacked / varlen / MultiheadFlashAttention outputs and
gradients on the CPU reference against PyTorch autograd in float64 (explicit math: the
reference, masks and the Philox dropout mask are test_attention_oracle.py's, written from the
rules of attention.h and not sharing code with the C side).

Tolerances are test_attention_oracle.py's (u = 2^-24): forward 4 sqrt(T_k) u + 8 u norm-wise
relative (random-walk error of fp32 sums over T_k keys), gradients 64 u (a few u magnified by
the cancellation in P * (dP - D)). The layer adds fp32 matmuls over C inputs around the
attention: the same random-walk bound over the longest sum, 4 sqrt(C + T) u + 8 u, and 64 u plus
that for its gradients.
"""
import ctypes
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

import test_attention_oracle as oracle

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
import flashgpt  # noqa: E402
from flashgpt import _lib, flash_attn_func, flash_attn_qkvpacked_func, flash_attn_varlen_func  # noqa: E402
from flashgpt.nn import MultiheadFlashAttention  # noqa: E402

U = 2.0 ** -24


@pytest.fixture(scope="module", autouse=True)
def library():
    """The package's library: $FLASHGPT_LIBATTENTION (make test sets it), else this checkout's
    build/libattention.so, made up to date here."""
    if not os.environ.get(_lib.ENV_PATH):
        r = subprocess.run(["make", "-s", "libattention"], cwd=ROOT, capture_output=True, text=True)
        assert r.returncode == 0, f"make libattention failed:\n{r.stdout}\n{r.stderr}"
    return _lib.default_library()


# ------------------------------------------------------------------------------------------------
# The mirror: every field of attention.h's AttnParams and AttnStrides, in order, at the offset,
# with the size and the float-ness the C compiler gives it; and the enum values.

def header_fields(struct):
    """Field names of `typedef struct { ... } struct;` in attention/attention.h, in order."""
    text = open(os.path.join(ROOT, "attention", "attention.h")).read()
    text = re.sub(r"//[^\n]*|/\*.*?\*/", "", text, flags=re.S)
    body = re.search(r"typedef struct\s*\{([^{}]*)\}\s*" + struct + r"\s*;", text)
    assert body, f"no typedef struct {struct} in attention/attention.h"
    names = []
    for decl in body.group(1).split(";"):
        if decl.strip():
            names += [re.findall(r"\w+", part)[-1] for part in decl.split(",")]
    return names


def c_layout(tmp_path, structs):
    """{struct: [(name, offset, size, is_float)]} and the enum values, from a compiled program."""
    lines = []
    for struct, names in structs.items():
        for n in names:
            lines.append(f'printf("{struct} {n} %zu %zu %d\\n", offsetof({struct}, {n}), '
                         f'sizeof(((const {struct} *)0)->{n}), '
                         f'_Generic(((const {struct} *)0)->{n}, float: 1, double: 1, default: 0));')
        lines.append(f'printf("{struct} sizeof %zu 0 0\\n", sizeof({struct}));')
    enums = ["DTYPE_F32", "DTYPE_BF16", "DTYPE_F16", "DEVICE_CPU", "DEVICE_CUDA", "ATTN_IMPL_FLASH",
             "ATTN_IMPL_NAIVE", "ATTN_KERNEL_AUTO", "ATTN_KERNEL_SM90", "ATTN_KERNEL_SM80"]
    lines += [f'printf("enum {e} %d 0 0\\n", (int){e});' for e in enums]
    src = tmp_path / "layout.c"
    src.write_text('#include <stdio.h>\n#include <stddef.h>\n#include "attention/attention.h"\n'
                   "int main(void) {\n" + "\n".join(lines) + "\nreturn 0;\n}\n")
    exe = tmp_path / "layout"
    r = subprocess.run([os.environ.get("CC", "cc"), "-std=gnu11", "-I", ROOT, str(src), "-o", str(exe)],
                       capture_output=True, text=True)
    assert r.returncode == 0, f"compiling the layout program failed:\n{r.stderr}"
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split("\n")
    layout = {}
    for line in filter(None, out):
        kind, name, a, b, c = line.split()
        layout.setdefault(kind, []).append((name, int(a), int(b), int(c)))
    return layout


def test_params_mirror_matches_attention_h(tmp_path):
    structs = {"AttnParams": header_fields("AttnParams"), "AttnStrides": header_fields("AttnStrides")}
    layout = c_layout(tmp_path, structs)
    for struct, cls in (("AttnParams", _lib.AttnParams), ("AttnStrides", _lib.AttnStrides)):
        mirror = [name for name, _ in cls._fields_]
        assert mirror == structs[struct], (
            f"python/flashgpt/_lib.py's {struct} does not list attention.h's fields:\n"
            f"  attention.h: {structs[struct]}\n  _lib.py:     {mirror}")
        for name, offset, size, is_float in layout[struct][:-1]:
            f = getattr(cls, name)
            ctype = dict(cls._fields_)[name]
            assert (f.offset, f.size) == (offset, size), f"{struct}.{name}: C offset {offset} size {size}, " \
                                                         f"_lib.py offset {f.offset} size {f.size}"
            assert (ctype in (ctypes.c_float, ctypes.c_double)) == bool(is_float), \
                f"{struct}.{name}: C says {'a' if is_float else 'no'} floating type, _lib.py says {ctype.__name__}"
        assert layout[struct][-1][1] == ctypes.sizeof(cls), f"sizeof({struct})"
    enums = {name: value for name, value, _, _ in layout["enum"]}
    assert enums == {"DTYPE_F32": _lib.DTYPE_F32, "DTYPE_BF16": _lib.DTYPE_BF16, "DTYPE_F16": _lib.DTYPE_F16,
                     "DEVICE_CPU": _lib.DEVICE_CPU, "DEVICE_CUDA": _lib.DEVICE_CUDA,
                     "ATTN_IMPL_FLASH": _lib.IMPL_FLASH, "ATTN_IMPL_NAIVE": _lib.IMPL_NAIVE,
                     "ATTN_KERNEL_AUTO": _lib.KERNEL_AUTO, "ATTN_KERNEL_SM90": _lib.KERNEL_SM90,
                     "ATTN_KERNEL_SM80": _lib.KERNEL_SM80}


def test_one_context_per_device_and_stream(library):
    assert library.context(_lib.DEVICE_CPU) == library.context(_lib.DEVICE_CPU)
    assert library.context(_lib.DEVICE_CPU) != library.context(_lib.DEVICE_CPU, 0, 1)


def test_missing_library_names_the_fix(monkeypatch, tmp_path):
    monkeypatch.setenv(_lib.ENV_PATH, str(tmp_path / "nothing.so"))
    _lib.default_library.cache_clear()
    try:
        with pytest.raises(OSError, match="make libattention"):
            _lib.default_library()
    finally:
        monkeypatch.undo()
        _lib.default_library.cache_clear()


def test_a_library_without_the_context_api_is_refused(tmp_path):
    src = tmp_path / "old.c"
    src.write_text("int attn_forward_cuda(void *p) { return 0; }\n")
    so = tmp_path / "libold.so"
    subprocess.run([os.environ.get("CC", "cc"), "-shared", "-fPIC", str(src), "-o", str(so)], check=True)
    with pytest.raises(OSError, match="rebuild it"):
        _lib.Library(str(so))


# ------------------------------------------------------------------------------------------------
# Outputs and gradients against float64 autograd.

def rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def slopes_for(NH):
    return (2.0 ** (-8.0 * np.arange(1, NH + 1) / NH)).astype(np.float32)


def drawn_seed_offset(torch_seed):
    """The Philox seed and offset flash_attn_func draws after torch.manual_seed(torch_seed), as
    interface.py documents: two int64 from PyTorch's default generator."""
    torch.manual_seed(torch_seed)
    return torch.randint(0, 2 ** 63 - 1, (2,), dtype=torch.int64).tolist()


def run_ours(fn, arrays, dout, torch_seed=0, **kw):
    """fn on float32 tensors made from arrays; returns out and the gradients as numpy."""
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    torch.manual_seed(torch_seed)
    out = fn(*ts, **kw)
    out.backward(torch.tensor(dout))
    return [out.detach().numpy()] + [t.grad.numpy() for t in ts]


def assert_close(ours, ref, T_k, what):
    names = ["out", "dq", "dk", "dv"]
    for name, a, r in zip(names, ours, ref):
        tol = oracle.fwd_tol(T_k) if name == "out" else oracle.GRAD_TOL
        e = oracle.rel_err(a, r)
        assert e <= tol, f"{what}: {name} rel. error {e:.2e} > {tol:.2e} ({e / U:.1f} u)"


# (B, T_q, T_k, NH, NKV, HS, causal, window, alibi, dropout, softmax_scale)
CASES = [
    (2, 37, 37, 4, 4, 16, True, (-1, -1), False, 0.0, None),
    (1, 1, 50, 4, 2, 32, True, (-1, -1), True, 0.0, None),
    (2, 97, 130, 6, 2, 24, False, (20, 5), False, 0.0, None),
    (1, 64, 64, 2, 1, 64, True, (16, -1), True, 0.0, 0.3),
    (2, 33, 33, 4, 2, 8, True, (-1, -1), False, 0.3, None),
    (1, 20, 45, 2, 2, 8, False, (-1, 3), True, 0.5, None),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "B%d_Tq%d_Tk%d_NH%d_NKV%d_HS%d_c%d_w%s_a%d_p%g_s%s" % c)
def test_flash_attn_func_against_float64(case):
    B, T_q, T_k, NH, NKV, HS, causal, window, alibi, dropout, scale = case
    rng = np.random.default_rng(sum(case[:6]))
    q, k, v = rand(rng, B, T_q, NH, HS), rand(rng, B, T_k, NKV, HS), rand(rng, B, T_k, NKV, HS)
    dout = rand(rng, B, T_q, NH, HS)
    slopes = slopes_for(NH) if alibi else None
    ours = run_ours(flash_attn_func, (q, k, v), dout, torch_seed=7, dropout_p=dropout, softmax_scale=scale,
                    causal=causal, window_size=window,
                    alibi_slopes=torch.tensor(slopes) if alibi else None)
    mask = oracle.explicit_mask(B, T_q, T_k, causal, window[0], window[1], None)
    keep = None
    if dropout:
        seed, offset = drawn_seed_offset(7)
        keep = oracle.philox_keep_mask(seed, offset, B, NH, T_q, T_k, dropout)
    ref_scale = 1.0 / math.sqrt(HS) if scale is None else np.float32(scale)
    out, _, dq, dk, dv = oracle.torch_reference(q, k, v, dout, ref_scale, 0.0, slopes, mask, keep, dropout)
    assert_close(ours, (out, dq, dk, dv), T_k, "flash_attn_func")


# (B, T_q, T_k, NH, NKV, HS, causal, window, alibi, softcap)
SOFTCAP_CASES = [
    (2, 37, 37, 4, 2, 16, True, (-1, -1), False, 1.5),
    (1, 20, 45, 2, 1, 32, False, (10, 3), True, 0.7),
    (1, 50, 29, 2, 2, 8, True, (-1, -1), False, 30.0),   # causal T_q > T_k: 21 rows see no key
]


@pytest.mark.parametrize("case", SOFTCAP_CASES, ids=lambda c: "B%d_Tq%d_Tk%d_NH%d_NKV%d_HS%d_c%d_w%s_a%d_cap%g" % c)
def test_softcap_against_float64(case):
    """softcap (flash-attn 2.6's argument, after window_size) in flash_attn_func, the packed and
    the varlen form: scores capped by softcap * tanh(s / softcap) before ALiBi and the masks."""
    B, T_q, T_k, NH, NKV, HS, causal, window, alibi, cap = case
    rng = np.random.default_rng(sum(case[:6]))
    q, k, v = (3 * rand(rng, B, T_q, NH, HS), 3 * rand(rng, B, T_k, NKV, HS), rand(rng, B, T_k, NKV, HS))
    dout = rand(rng, B, T_q, NH, HS)
    slopes = slopes_for(NH) if alibi else None
    ours = run_ours(flash_attn_func, (q, k, v), dout, causal=causal, window_size=window, softcap=cap,
                    alibi_slopes=torch.tensor(slopes) if alibi else None)
    mask = oracle.explicit_mask(B, T_q, T_k, causal, window[0], window[1], None)
    out, _, dq, dk, dv = oracle.torch_reference(q, k, v, dout, 1.0 / math.sqrt(HS), cap, slopes, mask, None, 0.0)
    assert_close(ours, (out, dq, dk, dv), T_k, "flash_attn_func softcap")
    # The same argument position as flash-attn 2.6: (..., window_size, softcap, alibi_slopes, ...).
    positional = flash_attn_func(*(torch.tensor(a) for a in (q, k, v)), 0.0, None, causal, window, cap,
                                 torch.tensor(slopes) if alibi else None)
    assert np.array_equal(positional.numpy(), ours[0])
    if T_q == T_k and NH == NKV:
        qkv = torch.tensor(np.stack([q, k, v], axis=2))
        packed = flash_attn_qkvpacked_func(qkv, causal=causal, window_size=window, softcap=cap,
                                           alibi_slopes=torch.tensor(slopes) if alibi else None)
        assert np.array_equal(packed.numpy(), ours[0])
    if B == 1 and T_q == T_k:
        cu = torch.tensor([0, T_q], dtype=torch.int32)
        packed = flash_attn_varlen_func(*(torch.tensor(a[0]) for a in (q, k, v)), cu, cu, T_q, T_q,
                                        causal=causal, window_size=window, softcap=cap,
                                        alibi_slopes=torch.tensor(slopes) if alibi else None)
        assert oracle.rel_err(packed.numpy()[None], out) <= oracle.fwd_tol(T_k)


def test_dropout_is_reproducible_and_backward_uses_the_forwards_mask():
    rng = np.random.default_rng(3)
    q, k, v, dout = (rand(rng, 2, 40, 2, 16) for _ in range(4))
    a = run_ours(flash_attn_func, (q, k, v), dout, torch_seed=11, dropout_p=0.2, causal=True)
    b = run_ours(flash_attn_func, (q, k, v), dout, torch_seed=11, dropout_p=0.2, causal=True)
    c = run_ours(flash_attn_func, (q, k, v), dout, torch_seed=12, dropout_p=0.2, causal=True)
    for x, y in zip(a, b):
        assert np.array_equal(x, y), "the same torch seed gave different results"
    assert not np.array_equal(a[0], c[0]), "another torch seed gave the same dropout mask"
    # Between forward and backward the generator moves on: backward must not draw again.
    ts = [torch.tensor(x, requires_grad=True) for x in (q, k, v)]
    torch.manual_seed(11)
    out = flash_attn_func(*ts, dropout_p=0.2, causal=True)
    torch.rand(100)
    out.backward(torch.tensor(dout))
    for x, t in zip(a[1:], ts):
        assert np.array_equal(x, t.grad.numpy()), "backward did not use the forward's seed and offset"


def test_fully_masked_rows_give_zero():
    # T_q = 5 over T_k = 3 keys, window (0, 0): query i sees key i - 2 only, queries 0 and 1 none.
    rng = np.random.default_rng(5)
    q, dout = rand(rng, 1, 5, 2, 8), rand(rng, 1, 5, 2, 8)
    k, v = rand(rng, 1, 3, 2, 8), rand(rng, 1, 3, 2, 8)
    out, dq, dk, dv = run_ours(flash_attn_func, (q, k, v), dout, window_size=(0, 0))
    assert np.array_equal(out[:, :2], np.zeros_like(out[:, :2]))
    assert np.allclose(out[:, 2:], v, rtol=0, atol=4 * U), "one visible key: out is its value"
    assert np.array_equal(dq[:, :2], np.zeros_like(dq[:, :2])), "no key seen: no gradient"
    # A softmax over one key has no gradient: dS = P (dP - D) with P = 1 and D = dP, each rounded
    # to a few u of |dP| <= |dout| |v|; dq = scale dS k and dk = scale dS q.
    norm = np.linalg.norm
    ds_bound = 8 * U * norm(dout[:, 2:], axis=-1) * norm(v, axis=-1) / np.sqrt(8)
    assert np.all(norm(dq[:, 2:], axis=-1) <= ds_bound * norm(k, axis=-1))
    assert np.all(norm(dk, axis=-1) <= ds_bound * norm(q[:, 2:], axis=-1))
    assert np.allclose(dv, dout[:, 2:], rtol=0, atol=4 * U)


@pytest.mark.parametrize("layout", ["packed_views", "last_dim_strided"])
def test_layouts_by_stride_or_copy(layout):
    """Views of one fused QKV buffer are read in place; a last dimension with a stride is copied.
    Both give the contiguous inputs' results bitwise."""
    B, T, NH, NKV, HS = 2, 29, 4, 2, 16
    rng = np.random.default_rng(8)
    qkv = rand(rng, B, T, NH + 2 * NKV, HS)
    dout = rand(rng, B, T, NH, HS)
    parts = np.split(qkv, [NH, NH + NKV], axis=2)
    ref = run_ours(flash_attn_func, [np.ascontiguousarray(x) for x in parts], dout, causal=True)
    if layout == "packed_views":
        buf = torch.tensor(qkv, requires_grad=True)
        q, k, v = buf.split([NH, NKV, NKV], dim=2)
        assert all(flashgpt.interface._kernel_layout(t) is t for t in (q, k, v))
    else:
        buf = torch.tensor(np.ascontiguousarray(qkv.transpose(0, 1, 3, 2)), requires_grad=True)
        q, k, v = buf.transpose(2, 3).split([NH, NKV, NKV], dim=2)
        assert all(flashgpt.interface._kernel_layout(t) is not t for t in (q, k, v))
    out = flash_attn_func(q, k, v, causal=True)
    out.backward(torch.tensor(dout))
    grad = buf.grad if layout == "packed_views" else buf.grad.transpose(2, 3)
    assert np.array_equal(out.detach().numpy(), ref[0])
    assert np.array_equal(grad.numpy(), np.concatenate(ref[1:], axis=2))


def test_qkvpacked_matches_flash_attn_func():
    B, T, NH, HS = 2, 31, 3, 16
    rng = np.random.default_rng(9)
    qkv, dout = rand(rng, B, T, 3, NH, HS), rand(rng, B, T, NH, HS)
    slopes = torch.tensor(slopes_for(NH))
    packed = run_ours(flash_attn_qkvpacked_func, (qkv,), dout, causal=True, alibi_slopes=slopes)
    split = run_ours(flash_attn_func, [np.ascontiguousarray(qkv[:, :, i]) for i in range(3)], dout,
                     causal=True, alibi_slopes=slopes)
    assert np.array_equal(packed[0], split[0])
    assert np.array_equal(packed[1], np.stack(split[1:], axis=2))


@pytest.mark.parametrize("causal,window,alibi", [(True, (-1, -1), False), (False, (7, 2), True)])
def test_varlen_against_float64_and_per_sequence_calls(causal, window, alibi):
    NH, NKV, HS = 4, 2, 16
    lengths = [13, 1, 0, 40, 22]
    cu_list = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    total = int(cu_list[-1])
    rng = np.random.default_rng(10)
    q, k, v = rand(rng, total, NH, HS), rand(rng, total, NKV, HS), rand(rng, total, NKV, HS)
    dout = rand(rng, total, NH, HS)
    slopes = slopes_for(NH) if alibi else None
    kw = dict(causal=causal, window_size=window, alibi_slopes=torch.tensor(slopes) if alibi else None)
    cu = torch.tensor(cu_list)
    ours = run_ours(lambda q, k, v, **a: flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths), **a),
                    (q, k, v), dout, **kw)
    mask = oracle.explicit_mask(1, total, total, causal, window[0], window[1], cu_list)
    out, _, dq, dk, dv = oracle.torch_reference(q[None], k[None], v[None], dout[None], 1.0 / math.sqrt(HS),
                                                0.0, slopes, mask, None, 0.0)
    assert_close(ours, (out[0], dq[0], dk[0], dv[0]), max(lengths), "flash_attn_varlen_func")
    # Each sequence alone through flash_attn_func: the same numbers up to fp32 rounding.
    for s, (a, b) in enumerate(zip(cu_list, cu_list[1:])):
        if a == b:
            continue
        one = run_ours(flash_attn_func, (q[None, a:b], k[None, a:b], v[None, a:b]), dout[None, a:b], **kw)
        for x, y in zip(ours, one):
            assert np.allclose(x[a:b], y[0], rtol=0, atol=oracle.fwd_tol(b - a) * 8), f"sequence {s}"


def test_multihead_flash_attention_against_float64():
    C, NH, NKV, B, T = 48, 4, 2, 2, 19
    torch.manual_seed(4)
    m = MultiheadFlashAttention(C, NH, NKV, causal=True, rope=True, rope_base=500)
    x = torch.randn(B, T, C, requires_grad=True)
    y = m(x)
    g = torch.randn_like(y)
    y.backward(g)
    HS = C // NH
    # The reference: the same weights in float64, RoPE as a complex rotation, explicit attention.
    W, bW = m.Wqkv.weight.detach().double(), m.Wqkv.bias.detach().double()
    P, bP = m.out_proj.weight.detach().double(), m.out_proj.bias.detach().double()
    W, bW, P, bP = (t.requires_grad_() for t in (W, bW, P, bP))
    x64 = x.detach().double().requires_grad_()
    qkv = (x64 @ W.T + bW).view(B, T, NH + 2 * NKV, HS)
    q, k, v = qkv[:, :, :NH], qkv[:, :, NH:NH + NKV], qkv[:, :, NH + NKV:]
    theta = torch.arange(T, dtype=torch.float64)[:, None] * 500.0 ** (-2.0 * torch.arange(HS // 2) / HS)
    rot = torch.polar(torch.ones_like(theta), theta)[None, :, None, :]

    def rope(t):
        z = torch.complex(t[..., :HS // 2], t[..., HS // 2:]) * rot
        return torch.cat((z.real, z.imag), dim=-1)

    q, k = rope(q), rope(k)
    k, v = k.repeat_interleave(NH // NKV, dim=2), v.repeat_interleave(NH // NKV, dim=2)
    s = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(HS)
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    ref = torch.einsum("bhij,bjhd->bihd", s.softmax(-1), v).reshape(B, T, C) @ P.T + bP
    ref.backward(g.double())
    tol = 4 * math.sqrt(C + T) * U + 8 * U
    for name, a, r in (("y", y, ref), ("dx", x.grad, x64.grad), ("dWqkv", m.Wqkv.weight.grad, W.grad),
                       ("dbqkv", m.Wqkv.bias.grad, bW.grad), ("dWout", m.out_proj.weight.grad, P.grad)):
        e = oracle.rel_err(a.detach().numpy(), r.detach().numpy())
        bound = tol if name == "y" else oracle.GRAD_TOL + tol
        assert e <= bound, f"{name}: rel. error {e:.2e} > {bound:.2e}"


def test_multihead_flash_attention_dropout_only_while_training():
    torch.manual_seed(2)
    m = MultiheadFlashAttention(32, 2, dropout=0.5)
    x = torch.randn(1, 12, 32)
    m.eval()
    assert torch.equal(m(x), m(x))
    m.train()
    torch.manual_seed(1)
    a = m(x)
    torch.manual_seed(2)
    assert not torch.equal(a, m(x))


# ------------------------------------------------------------------------------------------------
# Arguments the package refuses, each with a message that says what is supported.

def t(*shape, dtype=torch.float32):
    return torch.zeros(shape, dtype=dtype)


BAD_CALLS = [
    ("return_attn_probs", lambda: flash_attn_func(t(1, 4, 2, 8), t(1, 4, 2, 8), t(1, 4, 2, 8), return_attn_probs=True),
     "return_attn_probs=False"),
    ("attn_bias", lambda: flash_attn_func(t(1, 4, 2, 8), t(1, 4, 2, 8), t(1, 4, 2, 8), attn_bias=t(1, 2, 4, 4)),
     "attn_bias tensors are not supported: use causal, window_size, alibi_slopes"),
    ("float64", lambda: flash_attn_func(*(t(1, 4, 2, 8, dtype=torch.float64),) * 3), "use float32"),
    ("bfloat16_cpu", lambda: flash_attn_func(*(t(1, 4, 2, 8, dtype=torch.bfloat16),) * 3), "use float32"),
    ("mixed_dtypes", lambda: flash_attn_func(t(1, 4, 2, 8), t(1, 4, 2, 8, dtype=torch.float16), t(1, 4, 2, 8)),
     "one dtype"),
    ("3d_q", lambda: flash_attn_func(t(4, 2, 8), t(1, 4, 2, 8), t(1, 4, 2, 8)), "4-D tensor"),
    ("k_v_shapes", lambda: flash_attn_func(t(1, 4, 2, 8), t(1, 4, 2, 8), t(1, 5, 2, 8)), "k and v must have one shape"),
    ("head_dims", lambda: flash_attn_func(t(1, 4, 2, 8), t(1, 4, 2, 4), t(1, 4, 2, 4)), "one head dim"),
    ("gqa_heads", lambda: flash_attn_func(t(1, 4, 3, 8), t(1, 4, 2, 8), t(1, 4, 2, 8)), "must divide"),
    ("batch", lambda: flash_attn_func(t(1, 4, 2, 8), t(2, 4, 2, 8), t(2, 4, 2, 8)), "one batch size"),
    ("dropout", lambda: flash_attn_func(*(t(1, 4, 2, 8),) * 3, dropout_p=1.0), r"dropout_p must be in \[0, 1\)"),
    ("scale", lambda: flash_attn_func(*(t(1, 4, 2, 8),) * 3, softmax_scale=float("inf")), "finite"),
    ("window_value", lambda: flash_attn_func(*(t(1, 4, 2, 8),) * 3, window_size=(-2, 0)), "-1 \\(unbounded\\) or >= 0"),
    ("window_shape", lambda: flash_attn_func(*(t(1, 4, 2, 8),) * 3, window_size=5), "pair of ints"),
    ("alibi_shape", lambda: flash_attn_func(*(t(1, 4, 2, 8),) * 3, alibi_slopes=t(3)), r"shape \(nheads,\) = \(2,\)"),
    ("alibi_dtype", lambda: flash_attn_func(*(t(1, 4, 2, 8),) * 3, alibi_slopes=t(2, dtype=torch.float64)),
     "float32 tensor"),
    ("softcap_negative", lambda: flash_attn_func(*(t(1, 4, 2, 8),) * 3, softcap=-1.0), r"softcap must be 0.0 \(off\)"),
    ("softcap_nan", lambda: flash_attn_func(*(t(1, 4, 2, 8),) * 3, softcap=float("nan")), "finite number > 0"),
    ("alibi_per_row_cpu", lambda: flash_attn_func(*(t(1, 4, 2, 8),) * 3, alibi_slopes=t(1, 2)), "run on CUDA only"),
    ("head_dim_cpu", lambda: flash_attn_func(*(t(1, 2, 1, 1025),) * 3), "use 1..1024"),
    ("qkvpacked_shape", lambda: flash_attn_qkvpacked_func(t(1, 4, 2, 2, 8)), r"\(batch, seqlen, 3, nheads, headdim\)"),
]


def varlen(cu_q, cu_k=None, max_q=4, max_k=None, total=6, total_k=None):
    q = t(total, 2, 8)
    k = t(total if total_k is None else total_k, 2, 8)
    cu_k = cu_q if cu_k is None else cu_k
    return lambda: flash_attn_varlen_func(q, k, k, cu_q, cu_k, max_q, max_q if max_k is None else max_k)


def cu(*xs, dtype=torch.int32):
    return torch.tensor(xs, dtype=dtype)


BAD_VARLEN = [
    ("int64", varlen(cu(0, 2, 6, dtype=torch.int64)), "int32 tensor"),
    ("2d", varlen(cu(0, 2, 6)[None]), r"int32 tensor \(batch \+ 1,\)"),
    ("short", varlen(cu(0)), r"int32 tensor \(batch \+ 1,\)"),
    ("start", varlen(cu(1, 2, 6)), "from 0 to the 6 tokens"),
    ("end", varlen(cu(0, 2, 5)), "from 0 to the 6 tokens"),
    ("decreasing", varlen(cu(0, 4, 2, 6)), "decreases at index 2"),
    ("max_seqlen", varlen(cu(0, 1, 6), max_q=4), "5 tokens is longer than max_seqlen_q = 4"),
    ("max_seqlen_type", varlen(cu(0, 2, 6), max_q=4.0), "non-negative int"),
    ("cross", varlen(cu(0, 2, 6), cu(0, 3, 6)), "cu_seqlens_q and cu_seqlens_k differ: only self-attention"),
    ("max_differ", varlen(cu(0, 2, 6), max_q=4, max_k=5), "max_seqlen_q .4. and max_seqlen_k .5. differ"),
    ("tokens", varlen(cu(0, 2, 6), total_k=7), "q has 6 tokens and k 7: only self-attention"),
    ("alibi_per_sequence", lambda: flash_attn_varlen_func(t(6, 2, 8), t(6, 2, 8), t(6, 2, 8), cu(0, 2, 6), cu(0, 2, 6),
                                                          4, 4, alibi_slopes=t(2, 2)), "varlen takes no per-sequence"),
]


@pytest.mark.parametrize("name,call,message", BAD_CALLS + BAD_VARLEN, ids=[c[0] for c in BAD_CALLS + BAD_VARLEN])
def test_unsupported_arguments_raise_value_error(name, call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("kw,message", [
    (dict(embed_dim=30, num_heads=4), "multiple of num_heads"),
    (dict(embed_dim=32, num_heads=4, num_kv_heads=3), "must divide num_heads"),
    (dict(embed_dim=36, num_heads=4, rope=True), "even head dim"),
    (dict(embed_dim=32, num_heads=4, dropout=1.0), r"dropout must be in \[0, 1\)"),
])
def test_multihead_flash_attention_refuses_bad_shapes(kw, message):
    with pytest.raises(ValueError, match=message):
        MultiheadFlashAttention(**kw)
