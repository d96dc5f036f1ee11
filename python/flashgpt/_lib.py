"""The ctypes side of flashgpt: attention/attention.h's AttnParams and enums mirrored field for
field (tests/test_python_api.py compares them with the header through a compiled C program), and
Library, one loaded build of libattention.so (`make libattention`) with its attention contexts.
No PyTorch here: callers hand in raw pointers, strides and stream handles."""
import ctypes as C
import functools
import os
import threading

# common/dtype.h's DType and Device, attention/attention.h's AttnImpl and AttnKernel.
DTYPE_F32, DTYPE_BF16, DTYPE_F16 = 0, 1, 2
DEVICE_CPU, DEVICE_CUDA = 0, 1
IMPL_FLASH, IMPL_NAIVE = 0, 1
KERNEL_AUTO, KERNEL_SM90, KERNEL_SM80 = 0, 1, 2

# Where `make libattention` puts the library, seen from this file in a checkout (python/flashgpt/).
DEFAULT_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "build",
                            "libattention.so")
ENV_PATH = "FLASHGPT_LIBATTENTION"
ERRLEN = 1024


class AttnStrides(C.Structure):
    _fields_ = [("batch", C.c_int64), ("row", C.c_int64), ("head", C.c_int64)]


class AttnParams(C.Structure):
    _fields_ = [
        ("q", C.c_void_p), ("k", C.c_void_p), ("v", C.c_void_p), ("out", C.c_void_p), ("lse", C.c_void_p),
        ("lse_batch_stride", C.c_int64), ("lse_head_stride", C.c_int64),
        ("q_st", AttnStrides), ("k_st", AttnStrides), ("v_st", AttnStrides), ("o_st", AttnStrides),
        ("dout", C.c_void_p), ("dq", C.c_void_p), ("dk", C.c_void_p), ("dv", C.c_void_p),
        ("do_st", AttnStrides), ("dq_st", AttnStrides), ("dk_st", AttnStrides), ("dv_st", AttnStrides),
        ("accumulate", C.c_int),
        ("B", C.c_int), ("T_q", C.c_int), ("T_k", C.c_int), ("NH", C.c_int), ("NKV", C.c_int), ("HS", C.c_int),
        ("scale", C.c_float),
        ("causal", C.c_int), ("pos_explicit", C.c_int), ("q_pos0", C.c_int64), ("k_pos0", C.c_int64),
        ("window_left", C.c_int), ("window_right", C.c_int),
        ("alibi_slopes", C.c_void_p),
        ("cu_seqlens", C.c_void_p), ("n_docs", C.c_int),
        ("dropout_p", C.c_float), ("seed", C.c_uint64), ("offset", C.c_uint64),
        ("dtype", C.c_int), ("impl", C.c_int), ("deterministic", C.c_int),
        ("stream", C.c_void_p), ("workspace", C.c_void_p), ("workspace_bytes", C.c_size_t),
        ("alibi_batch_stride", C.c_int64), ("softcap", C.c_float),
        ("sparse_q_offsets", C.c_void_p), ("sparse_q_blocks", C.c_void_p),
        ("sparse_k_offsets", C.c_void_p), ("sparse_k_blocks", C.c_void_p),
        ("offset_dev", C.c_void_p),
        ("dsum", C.c_void_p), ("dsum_ready", C.c_int), ("dq_accum", C.c_void_p),
    ]


class Library:
    """One build of libattention.so and its attention contexts, one per (device, device index,
    stream), made on first use and kept for the life of the process. Errors of a call come back
    as ValueError (the library refused the problem: its message names the parameter and what is
    accepted) or RuntimeError (no context for the device)."""

    def __init__(self, path):
        self.path = os.path.abspath(path)
        # RTLD_LOCAL: a second build loaded beside this one (bench_attention.py --ab) keeps its
        # own symbols.
        self.lib = C.CDLL(self.path, mode=os.RTLD_LOCAL)
        if not hasattr(self.lib, "attn_context_create") or not hasattr(self.lib, "attn_merge"):
            raise OSError(f"{self.path} is a libattention.so from before attention contexts and "
                          "context parallelism, with another AttnParams layout: rebuild it "
                          "(make libattention)")
        lib = self.lib
        lib.attn_context_create.restype = C.c_void_p
        lib.attn_context_create.argtypes = [C.c_int, C.c_void_p, C.c_int, C.c_char_p, C.c_size_t]
        for name in ("attn_forward", "attn_backward"):
            getattr(lib, name).restype = C.c_int
            getattr(lib, name).argtypes = [C.c_void_p, C.POINTER(AttnParams), C.c_char_p, C.c_size_t]
        lib.attn_workspace_bytes.restype = C.c_size_t
        lib.attn_workspace_bytes.argtypes = [C.POINTER(AttnParams), C.c_int]
        self._contexts = {}
        self._lock = threading.Lock()

    def context(self, device, index=0, stream=None, kernel=KERNEL_AUTO):
        """The context of (device, index, stream) with kernel family `kernel` (KERNEL_AUTO,
        KERNEL_SM90, KERNEL_SM80); for CUDA, call it with that device current."""
        key = (device, index, stream, kernel)
        with self._lock:
            ctx = self._contexts.get(key)
            if ctx is None:
                err = C.create_string_buffer(ERRLEN)
                ctx = self.lib.attn_context_create(device, stream, kernel, err, ERRLEN)
                if not ctx:
                    raise RuntimeError(f"flashgpt: {err.value.decode()}")
                self._contexts[key] = ctx
        return ctx

    def workspace_bytes(self, p, device):
        return self.lib.attn_workspace_bytes(C.byref(p), device)

    def forward(self, ctx, p):
        self._run(self.lib.attn_forward, ctx, p)

    def backward(self, ctx, p):
        self._run(self.lib.attn_backward, ctx, p)

    @staticmethod
    def _run(fn, ctx, p):
        err = C.create_string_buffer(ERRLEN)
        if fn(ctx, C.byref(p), err, ERRLEN) != 0:
            raise ValueError(f"flashgpt: {err.value.decode()}")


@functools.lru_cache(maxsize=None)
def default_library():
    """The library the package uses: $FLASHGPT_LIBATTENTION, else build/libattention.so of the
    checkout this package lives in; loaded once."""
    path = os.environ.get(ENV_PATH) or DEFAULT_PATH
    if not os.path.isfile(path):
        raise OSError(f"flashgpt: no attention library at {os.path.abspath(path)}: run `make "
                      f"libattention` in the repository, or set {ENV_PATH} to a libattention.so")
    return Library(path)
