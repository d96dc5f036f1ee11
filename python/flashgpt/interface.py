"""flash_attn_func, flash_attn_qkvpacked_func and flash_attn_varlen_func: flash-attn 2's public
interface (argument names, shapes, defaults, semantics) over flashgpt's attention library.

Tensors are (batch, seqlen, nheads, headdim); K and V may have fewer heads than Q (GQA/MQA: the
key/value head count divides the query head count). CUDA tensors are bf16 or fp16 with head dim
32, 64, 96, 128 or 256 and run the flash kernels on the current stream; CPU tensors are fp32 (any
head dim up to 1024) and run the CPU reference, the same code the C tests check against float64. A
tensor whose last dimension is not contiguous (or, on CUDA, whose base or strides are not 16-byte
aligned) is copied; every other layout is handed to the kernels by its strides, so the views of a
packed QKV tensor are never copied. Backward runs the library's backward kernel from the saved
output and log-sum-exp.

Dropout draws its Philox seed and offset from PyTorch's default (CPU) generator, so
torch.manual_seed makes it reproducible (and torch.utils.checkpoint's recomputation, which
restores that generator, sees the same mask); backward regenerates the same mask from them.
"""
import contextlib
import math

import torch

from flashgpt import _lib

_DTYPES = {torch.float32: _lib.DTYPE_F32, torch.bfloat16: _lib.DTYPE_BF16, torch.float16: _lib.DTYPE_F16}
CUDA_DTYPES = (torch.bfloat16, torch.float16)
CUDA_HEAD_DIMS = (32, 64, 96, 128, 256)
CUDA_ALIGN = 16  # bytes: the CUDA kernels' vector loads need it for every base and stride


class Options:
    """The settings of one attention call besides q, k, v (validated by the public functions):
    window (left, right), softcap (0: off), alibi ((NH) or (B, NH) fp32) and cu_seqlens (int32)
    tensors on q's device or None; seed and offset are drawn by the forward when dropout_p > 0."""

    def __init__(self, scale, causal=False, window=(-1, -1), alibi=None, cu_seqlens=None, dropout_p=0.0,
                 deterministic=False, softcap=0.0):
        self.scale, self.causal, self.window, self.softcap = scale, causal, window, softcap
        self.alibi, self.cu_seqlens = alibi, cu_seqlens
        self.dropout_p, self.deterministic = dropout_p, deterministic
        self.seed = self.offset = 0


def _fail(msg):
    raise ValueError(f"flashgpt: {msg}")


def _check_tensors(q, k, v, ndim, layout):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != ndim:
            _fail(f"{name} must be a {ndim}-D tensor {layout}, got "
                  f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    if not (q.device == k.device == v.device):
        _fail(f"q, k and v must be on one device, got {q.device}, {k.device} and {v.device}")
    if not (q.dtype == k.dtype == v.dtype):
        _fail(f"q, k and v must have one dtype, got {q.dtype}, {k.dtype} and {v.dtype}")
    if q.device.type == "cpu":
        if q.dtype != torch.float32:
            _fail(f"CPU tensors run the fp32 reference: use float32, got {q.dtype}")
    elif q.device.type == "cuda":
        if q.dtype not in CUDA_DTYPES:
            _fail(f"CUDA tensors must be bfloat16 or float16, got {q.dtype}")
        if q.shape[-1] not in CUDA_HEAD_DIMS:
            _fail(f"head dim {q.shape[-1]} has no CUDA kernel: use 32, 64, 96, 128 or 256")
    else:
        _fail(f"tensors on {q.device.type} are not supported: use cuda (bf16, fp16) or cpu (fp32)")
    if k.shape != v.shape:
        _fail(f"k and v must have one shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if q.shape[-1] != k.shape[-1]:
        _fail(f"q and k must have one head dim, got {q.shape[-1]} and {k.shape[-1]}")
    if k.shape[-2] < 1 or q.shape[-2] % k.shape[-2] != 0:
        _fail(f"the {k.shape[-2]} key/value heads must divide the {q.shape[-2]} query heads (GQA)")


def _options(q, k, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
             return_attn_probs, attn_bias, cu_seqlens=None):
    if return_attn_probs:
        _fail("return_attn_probs=True is not supported: the kernels never form the attention "
              "probabilities; use return_attn_probs=False")
    if attn_bias is not None:
        _fail("attn_bias tensors are not supported: use causal, window_size, alibi_slopes, or "
              "flash_attn_varlen_func for packed documents")
    if not 0.0 <= float(dropout_p) < 1.0:
        _fail(f"dropout_p must be in [0, 1), got {dropout_p}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if softmax_scale is None else float(softmax_scale)
    if not math.isfinite(scale):
        _fail(f"softmax_scale must be finite, got {softmax_scale}")
    if (not isinstance(window_size, (tuple, list)) or len(window_size) != 2 or
            not all(isinstance(w, int) and w >= -1 for w in window_size)):
        _fail(f"window_size must be a pair of ints (left, right), each -1 (unbounded) or >= 0, got {window_size!r}")
    if not isinstance(softcap, (int, float)) or not math.isfinite(softcap) or softcap < 0:
        _fail(f"softcap must be 0.0 (off) or a finite number > 0, got {softcap!r}")
    if alibi_slopes is not None:
        NH, B = q.shape[-2], q.shape[0]
        # Slopes per batch row exist for flash_attn_func only: varlen's rows are its sequences,
        # by which the library does not index slopes.
        per_row = cu_seqlens is None
        if (not isinstance(alibi_slopes, torch.Tensor) or alibi_slopes.dtype != torch.float32 or
                alibi_slopes.device != q.device or
                tuple(alibi_slopes.shape) not in ([(NH,), (B, NH)] if per_row else [(NH,)])):
            want = (f"(nheads,) = ({NH},) or (batch, nheads) = ({B}, {NH})" if per_row else
                    f"(nheads,) = ({NH},) (varlen takes no per-sequence slopes)")
            _fail(f"alibi_slopes must be a float32 tensor of shape {want} on {q.device}, got "
                  f"{_describe(alibi_slopes)}")
        if alibi_slopes.dim() == 2 and q.device.type == "cpu":
            _fail("alibi_slopes per batch row (batch, nheads) run on CUDA only: the CPU reference "
                  "takes (nheads,)")
        alibi_slopes = alibi_slopes.contiguous()
    return Options(scale, bool(causal), (int(window_size[0]), int(window_size[1])), alibi_slopes,
                    cu_seqlens, float(dropout_p), bool(deterministic), float(softcap))


def _describe(t):
    if isinstance(t, torch.Tensor):
        return f"{t.dtype} {tuple(t.shape)} on {t.device}"
    return type(t).__name__


def _kernel_layout(t):
    """t, or a contiguous copy when the kernels cannot read it by its strides."""
    ok = t.stride(-1) == 1
    if ok and t.device.type == "cuda":
        eb = t.element_size()
        ok = t.data_ptr() % CUDA_ALIGN == 0 and all(s * eb % CUDA_ALIGN == 0 for s in t.stride()[:-1])
    return t if ok else t.clone(memory_format=torch.contiguous_format)


def _strides(t):  # a (B, T, H, D) tensor's element strides
    return _lib.AttnStrides(t.stride(0), t.stride(1), t.stride(2))


def _on_device(t):
    """A context manager that makes t's device current (the library launches there)."""
    return torch.cuda.device(t.device) if t.device.type == "cuda" else contextlib.nullcontext()


def _context(t):
    """The library, its device enum and the context of t's device and current stream; called
    with t's device current."""
    lib = _lib.default_library()
    if t.device.type == "cpu":
        return lib, _lib.DEVICE_CPU, lib.context(_lib.DEVICE_CPU)
    ctx = lib.context(_lib.DEVICE_CUDA, torch.cuda.current_device(), torch.cuda.current_stream().cuda_stream)
    return lib, _lib.DEVICE_CUDA, ctx


def attn_params(q, k, v, out, lse, o):
    """AttnParams of the forward of (B, T, H, D) tensors q, k, v into out and lse (B, H, T_q)."""
    p = _lib.AttnParams()
    p.q, p.k, p.v, p.out, p.lse = q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr()
    p.q_st, p.k_st, p.v_st, p.o_st = _strides(q), _strides(k), _strides(v), _strides(out)
    p.B, p.T_q, p.NH, p.HS = q.shape
    p.T_k, p.NKV = k.shape[1], k.shape[2]
    p.scale = o.scale
    p.causal = int(o.causal)
    p.window_left, p.window_right = o.window
    p.softcap = o.softcap
    if o.alibi is not None:
        p.alibi_slopes = o.alibi.data_ptr()
        p.alibi_batch_stride = o.alibi.stride(0) if o.alibi.dim() == 2 else 0
    if o.cu_seqlens is not None:
        p.cu_seqlens, p.n_docs = o.cu_seqlens.data_ptr(), o.cu_seqlens.numel() - 1
    p.dropout_p, p.seed, p.offset = o.dropout_p, o.seed, o.offset
    p.dtype = _DTYPES[q.dtype]
    p.impl = _lib.IMPL_FLASH
    p.deterministic = int(o.deterministic)
    return p


def set_grads(p, dout, dq, dk, dv):
    """The backward's tensors of p, (B, T, H, D) like out, q, k, v."""
    p.dout, p.dq, p.dk, p.dv = dout.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr()
    p.do_st, p.dq_st, p.dk_st, p.dv_st = _strides(dout), _strides(dq), _strides(dk), _strides(dv)


def workspace(lib, p, dev, device):
    """Scratch for this call from PyTorch's allocator (stream-ordered: freed after the launch,
    it is reused only by later work on the same stream); None when the problem needs none."""
    n = lib.workspace_bytes(p, dev)
    if n == 0:
        return None
    ws = torch.empty(n, dtype=torch.uint8, device=device)
    p.workspace, p.workspace_bytes = ws.data_ptr(), n
    return ws


def _forward(q, k, v, o):
    """out (B, T_q, NH, HS) and lse (B, NH, T_q) fp32 of the prepared q, k, v."""
    B, T_q, NH, _ = q.shape
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((B, NH, T_q), dtype=torch.float32, device=q.device)
    with _on_device(q):
        lib, dev, ctx = _context(q)
        p = attn_params(q, k, v, out, lse, o)
        ws = workspace(lib, p, dev, q.device)
        lib.forward(ctx, p)
        del ws
    return out, lse


def _backward(q, k, v, out, lse, dout, o):
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    with _on_device(q):
        lib, dev, ctx = _context(q)
        p = attn_params(q, k, v, out, lse, o)
        set_grads(p, dout, dq, dk, dv)
        ws = workspace(lib, p, dev, q.device)
        lib.backward(ctx, p)
        del ws
    return dq, dk, dv


class FlashAttnFunction(torch.autograd.Function):
    """out = attention(q, k, v) on (B, T, H, D) tensors; backward by the library's kernel from
    the saved out and log-sum-exp (and, with dropout, the saved seed and offset)."""

    @staticmethod
    def forward(ctx, q, k, v, o):
        q, k, v = (_kernel_layout(t) for t in (q, k, v))
        if o.dropout_p > 0.0:
            o.seed, o.offset = torch.randint(0, 2 ** 63 - 1, (2,), dtype=torch.int64).tolist()
        out, lse = _forward(q, k, v, o)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.options = o
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _backward(q, k, v, out, lse, _kernel_layout(dout), ctx.options)
        return dq, dk, dv, None


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                    softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False, *,
                    attn_bias=None):
    """Attention of q (batch, seqlen_q, nheads, headdim) over k, v (batch, seqlen_k,
    nheads_k, headdim); returns (batch, seqlen_q, nheads, headdim).

    softmax_scale defaults to 1/sqrt(headdim). With seqlen_q != seqlen_k, query i sits at key
    position i + seqlen_k - seqlen_q (bottom-right alignment): causal lets it see keys up to
    there (with seqlen_q > seqlen_k the first seqlen_q - seqlen_k queries see none),
    window_size (left, right) keeps keys within [pos - left, pos + right] (-1: unbounded),
    softcap > 0 turns each scaled score s into softcap * tanh(s / softcap) before the rest
    (0.0: off; where the library runs it: docs/python.md), alibi_slopes (nheads,) or (batch,
    nheads) fp32 adds
    -slope * |pos - j| to each score. A query that sees no key gets output 0. dropout_p applies
    to the attention probabilities (pass 0.0 in evaluation); deterministic makes the backward
    bitwise reproducible. return_attn_probs=True and attn_bias are not supported (ValueError)."""
    _check_tensors(q, k, v, 4, "(batch, seqlen, nheads, headdim)")
    if q.shape[0] != k.shape[0]:
        _fail(f"q and k must have one batch size, got {q.shape[0]} and {k.shape[0]}")
    o = _options(q, k, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                 return_attn_probs, attn_bias)
    return FlashAttnFunction.apply(q, k, v, o)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
                              window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                              return_attn_probs=False, *, attn_bias=None):
    """flash_attn_func on qkv (batch, seqlen, 3, nheads, headdim), read in place by its strides;
    the gradient comes back in the same packed shape."""
    if not isinstance(qkv, torch.Tensor) or qkv.dim() != 5 or qkv.shape[2] != 3:
        _fail(f"qkv must be a 5-D tensor (batch, seqlen, 3, nheads, headdim), got {_describe(qkv)}")
    q, k, v = qkv.unbind(2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs, attn_bias=attn_bias)


def _check_cu_seqlens(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, total, device):
    """The varlen bookkeeping: one int32 list of cumulative lengths for q and k, from 0 to the
    token count, never decreasing, its longest sequence within max_seqlen. Returns it contiguous."""
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if (not isinstance(cu, torch.Tensor) or cu.dtype != torch.int32 or cu.dim() != 1 or
                cu.numel() < 2 or cu.device != device):
            _fail(f"{name} must be an int32 tensor (batch + 1,) on {device}, got {_describe(cu)}")
    for name, m in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if not isinstance(m, int) or m < 0:
            _fail(f"{name} must be a non-negative int, got {m!r}")
    cu = cu_seqlens_q.tolist()
    if cu_seqlens_k is not cu_seqlens_q and cu_seqlens_k.tolist() != cu:
        _fail("cu_seqlens_q and cu_seqlens_k differ: only self-attention over packed sequences is "
              "supported (every sequence as long in q as in k, one cu_seqlens for both)")
    if max_seqlen_q != max_seqlen_k:
        _fail(f"max_seqlen_q ({max_seqlen_q}) and max_seqlen_k ({max_seqlen_k}) differ: only "
              "self-attention over packed sequences is supported")
    if cu[0] != 0 or cu[-1] != total:
        _fail(f"cu_seqlens must run from 0 to the {total} tokens of q, got {cu[0]} .. {cu[-1]}")
    lengths = [b - a for a, b in zip(cu, cu[1:])]
    if min(lengths) < 0:
        _fail(f"cu_seqlens decreases at index {lengths.index(min(lengths)) + 1}")
    if max(lengths) > max_seqlen_q:
        _fail(f"a sequence of {max(lengths)} tokens is longer than max_seqlen_q = {max_seqlen_q}")
    return cu_seqlens_q.contiguous()


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                           softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False, *,
                           attn_bias=None):
    """flash_attn_func over packed sequences: q, k, v are (total_tokens, nheads[_k], headdim),
    sequence s is tokens cu_seqlens[s] .. cu_seqlens[s+1] - 1 and attends only inside itself
    (causal, window_size, softcap and alibi_slopes apply within each sequence). Self-attention only: the
    q and k lists must be equal (and max_seqlen_q == max_seqlen_k). The list is read on the host
    to be checked (for CUDA tensors, one small device-to-host copy)."""
    _check_tensors(q, k, v, 3, "(total_tokens, nheads, headdim)")
    if q.shape[0] != k.shape[0]:
        _fail(f"q has {q.shape[0]} tokens and k {k.shape[0]}: only self-attention over packed "
              "sequences is supported (one token count, one cu_seqlens)")
    cu = _check_cu_seqlens(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, q.shape[0], q.device)
    o = _options(q, k, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                 return_attn_probs, attn_bias, cu)
    out = FlashAttnFunction.apply(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), o)
    return out.squeeze(0)
