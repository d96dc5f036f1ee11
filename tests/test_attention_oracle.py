"""The CPU attention reference (attention/attention.h, both impls) against PyTorch autograd in
float64: out, lse and dq/dk/dv over causal, sliding-window, GQA/MQA, ALiBi (slopes (NH) and per
batch row (B, NH)), soft-capping, document and dropout problems, T_q < T_k and causal T_q > T_k
(whose first T_q - T_k queries see no key: output 0, lse +inf, dq 0) included; and block-sparse
problems whose 128 x 128 block lists (and their transpose) are drawn here at random. The masks are rebuilt here from the rules written in attention.h, and
the dropout keep-mask from a numpy Philox-4x32-10 written from its paper, so neither shares code
with the C side.

The attention module and common/ are built as build/libattention.so with the project's Makefile
(NO_CUDA=1, into a temporary build directory) and driven through ctypes.

Tolerances (norm-wise relative, u = 2^-24 the fp32 unit roundoff): the forward's fp32 sums over
T_k keys and HS dimensions are recursive sums with random-walk error ~sqrt(T_k) u (4x margin, plus
a floor of 8 u for single roundings); gradients carry a few u of error magnified by the
cancellation in P * (dP - D), ~10x, so 64 u (measured: at most 9 u here).
"""
import ctypes
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
# The one ctypes mirror of attention.h's AttnParams (tests/test_python_api.py checks it field by field).
from flashgpt._lib import IMPL_FLASH, IMPL_NAIVE, AttnParams  # noqa: E402
from flashgpt._lib import AttnStrides as Strides  # noqa: E402

U = 2.0 ** -24
GRAD_TOL = 64 * U


def fwd_tol(T_k):
    return 4 * np.sqrt(T_k) * U + 8 * U


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    build = tmp_path_factory.mktemp("build")
    so = build / "libattention.so"
    r = subprocess.run(["make", "-s", "NO_CUDA=1", f"BUILD={build}", str(so)], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, f"building libattention.so failed:\n{r.stdout}\n{r.stderr}"
    lib = ctypes.CDLL(str(so))
    lib.attn_check.argtypes = [ctypes.POINTER(AttnParams), ctypes.c_int, ctypes.c_int, ctypes.c_char_p,
                               ctypes.c_size_t]
    lib.attn_check.restype = ctypes.c_int
    lib.attn_params_size.restype = ctypes.c_size_t
    lib.attn_forward_cpu.argtypes = [ctypes.POINTER(AttnParams)]
    lib.attn_backward_cpu.argtypes = [ctypes.POINTER(AttnParams)]
    return lib


# ------------------------------------------------------------------------------------------------
# Independent rules: the mask of attention.h and Philox-4x32-10 (Salmon et al., SC'11).

def explicit_mask(B, T_q, T_k, causal, wl, wr, cu):
    """(B, T_q, T_k) bool: key j visible to query i of row b."""
    i = np.arange(T_q)[:, None]
    j = np.arange(T_k)[None, :]
    pos = i + (T_k - T_q)
    m = np.ones((T_q, T_k), bool)
    if causal:
        m &= j <= pos
    if wl >= 0:
        m &= j >= pos - wl
    if wr >= 0:
        m &= j <= pos + wr
    m = np.broadcast_to(m, (B, T_q, T_k)).copy()
    if cu is not None:
        doc = np.searchsorted(cu, np.arange(B * T_q), side="right").reshape(B, T_q)
        m &= doc[:, :, None] == doc[:, None, :]
    return m


def dropout_threshold(p):
    """The smallest byte that keeps an element: round(256 p) of the fp32 rate, at most 255."""
    return min(int(float(np.float32(p)) * 256.0 + 0.5), 255)


def dropout_scale(p):
    """What survivors are multiplied by: the inverse of the rate at which bytes keep."""
    return 256.0 / (256 - dropout_threshold(p))


def philox_keep_mask(seed, offset, B, NH, T_q, T_k, p):
    """(B, NH, T_q, T_k) bool, one byte per element: each (b, h) matrix is cut into 16 x 16 tiles
    (tile n = ((b*NH + h)*ceil(T_q/16) + i//16)*ceil(T_k/16) + j//16); element (r, c) of a tile is
    byte 4w + k of Philox block 16n + 4((r//2) % 4) + (c//2) % 4 (counter (block, offset), key
    seed), w = 2(r % 2) + r//8, k = 2(c % 2) + c//8; kept when that byte >= round(256 p)."""
    M32 = np.uint64(0xFFFFFFFF)
    b, h, i, j = (x.astype(np.uint64).ravel() for x in np.meshgrid(
        np.arange(B), np.arange(NH), np.arange(T_q), np.arange(T_k), indexing="ij"))
    u = np.uint64
    tile = ((b * u(NH) + h) * u((T_q + 15) // 16) + i // u(16)) * u((T_k + 15) // 16) + j // u(16)
    blk = tile * u(16) + u(4) * ((i // u(2)) % u(4)) + (j // u(2)) % u(4)
    r, cc = i % u(16), j % u(16)
    byte = u(4) * (u(2) * (r % u(2)) + r // u(8)) + u(2) * (cc % u(2)) + cc // u(8)
    c = [blk & M32, blk >> np.uint64(32), np.full_like(blk, offset & 0xFFFFFFFF),
         np.full_like(blk, offset >> 32)]
    k0, k1 = np.uint64(seed & 0xFFFFFFFF), np.uint64(seed >> 32)
    for _ in range(10):
        p0 = np.uint64(0xD2511F53) * c[0]
        p1 = np.uint64(0xCD9E8D57) * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k0, p1 & M32, (p0 >> np.uint64(32)) ^ c[3] ^ k1, p0 & M32]
        k0 = (k0 + np.uint64(0x9E3779B9)) & M32
        k1 = (k1 + np.uint64(0xBB67AE85)) & M32
    words = np.stack(c)[(byte // u(4)).astype(np.int64), np.arange(blk.size)]
    draws = (words >> (u(8) * (byte % u(4)))) & u(0xFF)
    return (draws >= u(dropout_threshold(p))).reshape(B, NH, T_q, T_k)


def torch_reference(q, k, v, dout, scale, softcap, slopes, mask, keep, dropout):
    """float64 out (B, T_q, NH, HS), lse (B, NH, T_q) and dq, dk, dv by autograd. softcap 0 is
    off; slopes are (NH) or (B, NH); a row with no visible key gets output 0 and lse +inf."""
    q, k, v = (torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in (q, k, v))
    NH, NKV = q.shape[2], k.shape[2]
    kk = k.repeat_interleave(NH // NKV, dim=2)
    vv = v.repeat_interleave(NH // NKV, dim=2)
    s = torch.einsum("bihd,bjhd->bhij", q, kk) * float(scale)
    T_q, T_k = q.shape[1], k.shape[1]
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    if slopes is not None:
        pos = torch.arange(T_q)[:, None] + (T_k - T_q)
        dist = (pos - torch.arange(T_k)[None, :]).abs().double()
        sl = torch.tensor(slopes, dtype=torch.float64)
        sl = sl[None, :, None, None] if sl.dim() == 1 else sl[:, :, None, None]
        s = s - sl * dist
    m = torch.tensor(mask)[:, None]
    alive = m.any(dim=-1)  # (B, 1, T_q): rows with a visible key
    s = s.masked_fill(~m, float("-inf")).masked_fill(~alive[..., None], 0.0)
    lse = torch.logsumexp(s, dim=-1).masked_fill(~alive, float("inf"))
    p = torch.softmax(s, dim=-1) * alive[..., None]
    if keep is not None:
        p = p * torch.tensor(keep, dtype=torch.float64) * dropout_scale(dropout)
    out = torch.einsum("bhij,bjhd->bihd", p, vv)
    (out * torch.tensor(dout, dtype=torch.float64)).sum().backward()
    return out.detach().numpy(), lse.detach().numpy(), q.grad.numpy(), k.grad.numpy(), v.grad.numpy()


def rel_err(a, ref):
    return float(np.linalg.norm(a.astype(np.float64) - ref) / np.linalg.norm(ref))


def random_docs(rng, B, T):
    cu = [0]
    for b in range(B):
        t = 0
        while t < T:
            t = min(T, t + int(rng.integers(1, T // 3 + 2)))
            cu.append(b * T + t)
    return np.array(cu, dtype=np.int32)


# alibi: 0 none, 1 slopes (NH), 2 slopes (B, NH) with batch stride NH, 3 the same with a padded
# stride NH + 3 (every stride >= NH is accepted).
ALIBI_NONE, ALIBI_SHARED, ALIBI_PER_ROW, ALIBI_PER_ROW_PADDED = 0, 1, 2, 3

# (B, T_q, T_k, NH, NKV, HS, causal, window_left, window_right, alibi, docs, dropout, softcap)
CASES = [
    (2, 256, 256, 4, 2, 32, 1, -1, -1, 0, 0, 0.0, 0.0),
    (1, 97, 256, 4, 1, 16, 0, 30, 10, 0, 0, 0.0, 0.0),
    (3, 128, 128, 2, 2, 32, 1, -1, -1, 1, 1, 0.0, 0.0),
    (1, 300, 300, 2, 1, 64, 1, 50, -1, 0, 0, 0.0, 0.0),
    (2, 97, 97, 2, 1, 16, 1, -1, -1, 0, 0, 0.25, 0.0),
    (2, 1, 500, 4, 2, 32, 1, -1, -1, 1, 0, 0.0, 0.0),
    (1, 70, 70, 3, 3, 8, 0, 5, 5, 1, 1, 0.5, 0.0),
    # causal T_q > T_k: the first T_q - T_k queries see no key (whole 64-row tiles of them here)
    (2, 200, 77, 4, 2, 16, 1, -1, -1, 0, 0, 0.0, 0.0),
    (1, 161, 33, 6, 2, 24, 1, 12, -1, 0, 0, 0.0, 0.0),
    (2, 99, 70, 4, 1, 8, 1, 9, 3, 2, 0, 0.0, 0.0),
    (1, 131, 130, 2, 2, 16, 1, -1, -1, 0, 0, 0.3, 1.5),
    # per-batch-row ALiBi slopes
    (3, 65, 130, 4, 2, 16, 1, -1, -1, 2, 0, 0.0, 0.0),
    (2, 97, 97, 3, 1, 32, 0, 20, 20, 3, 0, 0.0, 0.0),
    (3, 80, 80, 2, 2, 16, 1, -1, -1, 2, 1, 0.0, 0.0),
    # soft-capping, with and without causal masking and ALiBi
    (2, 97, 150, 4, 2, 32, 0, -1, -1, 0, 0, 0.0, 1.5),
    (2, 129, 129, 4, 4, 16, 1, -1, -1, 0, 0, 0.0, 0.7),
    (1, 100, 100, 2, 1, 64, 1, -1, -1, 1, 0, 0.0, 3.0),
    (2, 70, 90, 3, 1, 8, 0, 10, 10, 3, 0, 0.0, 1.0),
]


@pytest.mark.parametrize("impl", [IMPL_FLASH, IMPL_NAIVE], ids=["flash", "naive"])
@pytest.mark.parametrize("case", CASES,
                         ids=lambda c: "B%d_Tq%d_Tk%d_NH%d_NKV%d_HS%d_c%d_w%d,%d_a%d_d%d_p%g_cap%g" % c)
def test_against_torch(lib, case, impl):
    B, T_q, T_k, NH, NKV, HS, causal, wl, wr, alibi, docs, dropout, softcap = case
    rng = np.random.default_rng(sum(case[:6]))
    q = rng.standard_normal((B, T_q, NH, HS)).astype(np.float32)
    k = rng.standard_normal((B, T_k, NKV, HS)).astype(np.float32)
    v = rng.standard_normal((B, T_k, NKV, HS)).astype(np.float32)
    dout = rng.standard_normal((B, T_q, NH, HS)).astype(np.float32)
    slopes = (2.0 ** (-8.0 * np.arange(1, NH + 1) / NH)).astype(np.float32) if alibi else None
    slope_stride = {ALIBI_PER_ROW: NH, ALIBI_PER_ROW_PADDED: NH + 3}.get(alibi, 0)
    if slope_stride:  # (B, NH) slopes, row b's scaled by a random factor, in rows of slope_stride
        table = np.full((B, slope_stride), np.nan, np.float32)
        table[:, :NH] = slopes[None, :] * rng.uniform(0.25, 4.0, (B, 1)).astype(np.float32)
        slopes = table[:, :NH].copy()
    cu = random_docs(rng, B, T_q) if docs else None
    seed, offset = 0x123456789ABC, 42

    out = np.full((B, T_q, NH, HS), np.nan, np.float32)
    lse = np.full((B, NH, T_q), np.nan, np.float32)
    dq, dk, dv = np.full_like(q, np.nan), np.full_like(k, np.nan), np.full_like(v, np.nan)

    def st(x):
        s = [n // 4 for n in x.strides]
        return Strides(s[0], s[1], s[2])

    p = AttnParams()
    p.q, p.k, p.v, p.out, p.lse = (x.ctypes.data for x in (q, k, v, out, lse))
    p.dout, p.dq, p.dk, p.dv = (x.ctypes.data for x in (dout, dq, dk, dv))
    p.q_st, p.k_st, p.v_st, p.o_st = st(q), st(k), st(v), st(out)
    p.do_st, p.dq_st, p.dk_st, p.dv_st = st(dout), st(dq), st(dk), st(dv)
    p.B, p.T_q, p.T_k, p.NH, p.NKV, p.HS = B, T_q, T_k, NH, NKV, HS
    p.scale = 1.0 / np.sqrt(HS)
    p.causal, p.window_left, p.window_right = causal, wl, wr
    p.alibi_slopes = (table if slope_stride else slopes).ctypes.data if alibi else None
    p.alibi_batch_stride = slope_stride
    p.softcap = softcap
    p.cu_seqlens = cu.ctypes.data if docs else None
    p.n_docs = len(cu) - 1 if docs else 0
    p.dropout_p, p.seed, p.offset = dropout, seed, offset
    p.impl = impl
    err = ctypes.create_string_buffer(256)
    assert lib.attn_check(ctypes.byref(p), 0, 1, err, 256) == 0, err.value.decode()
    lib.attn_forward_cpu(ctypes.byref(p))
    lib.attn_backward_cpu(ctypes.byref(p))

    mask = explicit_mask(B, T_q, T_k, causal, wl, wr, cu)
    check_against_torch(q, k, v, dout, out, lse, dq, dk, dv, p, mask, slopes, softcap, seed, offset, dropout,
                        empty_rows_at_start=causal and T_q > T_k and wr < 0 and not docs)


def check_against_torch(q, k, v, dout, out, lse, dq, dk, dv, p, mask, slopes, softcap, seed, offset, dropout,
                        empty_rows_at_start):
    """The C results against torch_reference on the explicit mask, within fwd_tol and GRAD_TOL;
    rows with no visible key must give out 0, dq 0 and lse +inf."""
    B, T_q, T_k, NH = p.B, p.T_q, p.T_k, p.NH
    keep = philox_keep_mask(seed, offset, B, NH, T_q, T_k, dropout) if dropout > 0 else None
    r_out, r_lse, r_dq, r_dk, r_dv = torch_reference(q, k, v, dout, np.float32(p.scale), float(np.float32(softcap)),
                                                     slopes, mask, keep, dropout)
    empty = ~mask.any(axis=2)  # (B, T_q): rows with no visible key
    if empty_rows_at_start:
        assert empty[:, :T_q - T_k].all() and not empty[:, T_q - T_k:].any()
    assert np.array_equal(np.isinf(lse), np.broadcast_to(empty[:, None], lse.shape)), "lse +inf rows"
    assert (out[empty] == 0).all() and (dq[empty] == 0).all(), "rows with no visible key: out and dq 0"
    tol = fwd_tol(T_k)
    assert rel_err(out, r_out) <= tol, f"out error {rel_err(out, r_out):.3g} > {tol:.3g}"
    seen = ~np.isinf(r_lse)
    assert rel_err(lse[seen], r_lse[seen]) <= tol, f"lse error {rel_err(lse[seen], r_lse[seen]):.3g} > {tol:.3g}"
    for name, a, ref in (("dq", dq, r_dq), ("dk", dk, r_dk), ("dv", dv, r_dv)):
        assert rel_err(a, ref) <= GRAD_TOL, f"{name} error {rel_err(a, ref):.3g} > {GRAD_TOL:.3g}"


BLOCK = 128  # ATTN_SPARSE_BLOCK

# (B, T_q, T_k, NH, NKV, HS, causal, window_left, docs, density)
SPARSE_CASES = [
    (1, 601, 601, 2, 1, 16, 1, -1, 0, 0.5),
    (2, 300, 700, 4, 2, 8, 0, -1, 0, 0.4),
    (1, 520, 520, 2, 2, 16, 1, 100, 0, 0.6),
    (2, 390, 390, 2, 1, 8, 1, -1, 1, 0.5),
]


@pytest.mark.parametrize("impl", [IMPL_FLASH, IMPL_NAIVE], ids=["flash", "naive"])
@pytest.mark.parametrize("case", SPARSE_CASES, ids=lambda c: "B%d_Tq%d_Tk%d_NH%d_NKV%d_HS%d_c%d_w%d_d%d_p%g" % c)
def test_block_sparse_against_torch(lib, case, impl):
    """Random block lists (each block present with probability `density`, some query blocks
    empty) handed in through the four sparse fields; the explicit mask is the rules' mask and
    the block mask together."""
    B, T_q, T_k, NH, NKV, HS, causal, wl, docs, density = case
    rng = np.random.default_rng(sum(case[:6]) + 7)
    n_qb, n_kb = -(-T_q // BLOCK), -(-T_k // BLOCK)
    present = rng.random((n_qb, n_kb)) < density
    present[rng.integers(n_qb)] = False  # a query block with no key block: masked rows
    q_offsets = np.concatenate([[0], np.cumsum(present.sum(axis=1))]).astype(np.int32)
    q_blocks = np.nonzero(present)[1].astype(np.int32)
    k_offsets = np.concatenate([[0], np.cumsum(present.sum(axis=0))]).astype(np.int32)
    k_blocks = np.nonzero(present.T)[1].astype(np.int32)
    q = rng.standard_normal((B, T_q, NH, HS)).astype(np.float32)
    k = rng.standard_normal((B, T_k, NKV, HS)).astype(np.float32)
    v = rng.standard_normal((B, T_k, NKV, HS)).astype(np.float32)
    dout = rng.standard_normal((B, T_q, NH, HS)).astype(np.float32)
    cu = random_docs(rng, B, T_q) if docs else None
    out = np.full((B, T_q, NH, HS), np.nan, np.float32)
    lse = np.full((B, NH, T_q), np.nan, np.float32)
    dq, dk, dv = np.full_like(q, np.nan), np.full_like(k, np.nan), np.full_like(v, np.nan)
    p = AttnParams()
    p.q, p.k, p.v, p.out, p.lse = (x.ctypes.data for x in (q, k, v, out, lse))
    p.dout, p.dq, p.dk, p.dv = (x.ctypes.data for x in (dout, dq, dk, dv))
    qs, ks = Strides(T_q * NH * HS, NH * HS, HS), Strides(T_k * NKV * HS, NKV * HS, HS)
    p.q_st = p.o_st = p.do_st = p.dq_st = qs
    p.k_st = p.v_st = p.dk_st = p.dv_st = ks
    p.B, p.T_q, p.T_k, p.NH, p.NKV, p.HS = B, T_q, T_k, NH, NKV, HS
    p.scale = 1.0 / np.sqrt(HS)
    p.causal, p.window_left, p.window_right = causal, wl, -1
    p.cu_seqlens = cu.ctypes.data if docs else None
    p.n_docs = len(cu) - 1 if docs else 0
    p.sparse_q_offsets, p.sparse_q_blocks = q_offsets.ctypes.data, q_blocks.ctypes.data
    p.sparse_k_offsets, p.sparse_k_blocks = k_offsets.ctypes.data, k_blocks.ctypes.data
    p.impl = impl
    err = ctypes.create_string_buffer(256)
    assert lib.attn_check(ctypes.byref(p), 0, 1, err, 256) == 0, err.value.decode()
    lib.attn_forward_cpu(ctypes.byref(p))
    lib.attn_backward_cpu(ctypes.byref(p))
    blocks = present[np.arange(T_q)[:, None] // BLOCK, np.arange(T_k)[None, :] // BLOCK]
    mask = explicit_mask(B, T_q, T_k, causal, wl, -1, cu) & blocks[None]
    check_against_torch(q, k, v, dout, out, lse, dq, dk, dv, p, mask, None, 0.0, 0, 0, 0.0, False)


def test_params_layout_matches_header(lib):
    """The ctypes mirror of AttnParams is laid out like the C struct: it has the struct's size,
    and attn_check reads fields at the ends of the struct back as this test set them."""
    assert ctypes.sizeof(AttnParams) == lib.attn_params_size()
    p = AttnParams()
    p.B, p.T_q, p.T_k, p.NH, p.NKV, p.HS, p.scale = 1, 4, 4, 6, 4, 8, 0.5
    err = ctypes.create_string_buffer(256)
    assert lib.attn_check(ctypes.byref(p), 0, 0, err, 256) == -1
    assert "6 query heads" in err.value.decode() and "4 key/value heads" in err.value.decode()
    p.NKV = 2
    p.dropout_p = 1.5
    assert lib.attn_check(ctypes.byref(p), 0, 0, err, 256) == -1
    assert "dropout 1.5" in err.value.decode()
    p.dropout_p = 0.0
    p.dtype = 1
    assert lib.attn_check(ctypes.byref(p), 0, 0, err, 256) == -1
    assert "bf16" in err.value.decode()
