"""flashgpt's attention kernels from PyTorch: flash-attn 2's functional interface
(flash_attn_func, flash_attn_qkvpacked_func, flash_attn_varlen_func) with autograd, and the
layer flashgpt.nn.MultiheadFlashAttention. Needs the library `make libattention` builds
(build/libattention.so of this checkout, or $FLASHGPT_LIBATTENTION); docs/python.md."""
from flashgpt import nn
from flashgpt.interface import flash_attn_func, flash_attn_qkvpacked_func, flash_attn_varlen_func

__all__ = ["nn", "flash_attn_func", "flash_attn_qkvpacked_func", "flash_attn_varlen_func"]
