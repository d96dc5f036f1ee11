"""MultiheadFlashAttention: a self-attention layer (fused QKV projection, optional rotary
position embedding, flashgpt's attention, output projection) on (batch, seqlen, embed_dim)."""
import torch

from flashgpt.interface import flash_attn_func


def rotary(x, base):
    """x (B, T, H, D) rotated by position t (RoPE, half-split convention as in flashgpt's model:
    dimension d < D/2 pairs with d + D/2 at angle t * base^(-2d/D)); computed in fp32."""
    T, D = x.shape[1], x.shape[3]
    half = D // 2
    inv_freq = base ** (-2.0 * torch.arange(half, device=x.device, dtype=torch.float32) / D)
    angle = torch.arange(T, device=x.device, dtype=torch.float32)[:, None] * inv_freq  # (T, D/2)
    cos, sin = angle.cos()[None, :, None, :], angle.sin()[None, :, None, :]
    x1, x2 = x.float()[..., :half], x.float()[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).to(x.dtype)


class MultiheadFlashAttention(torch.nn.Module):
    """Self-attention of x (B, T, embed_dim): one Linear makes q (num_heads heads) and k, v
    (num_kv_heads heads each, GQA when fewer), attention runs on their views of its output
    without copies (with rope=True q and k are rotated first), and out_proj maps the heads back
    to embed_dim. dropout applies to the attention probabilities while the module is training."""

    def __init__(self, embed_dim, num_heads, num_kv_heads=None, causal=True, rope=False,
                 rope_base=10000, bias=True, dropout=0.0, device=None, dtype=None):
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if num_heads < 1 or embed_dim % num_heads != 0:
            raise ValueError(f"flashgpt: embed_dim {embed_dim} must be a multiple of num_heads {num_heads}")
        if num_kv_heads < 1 or num_heads % num_kv_heads != 0:
            raise ValueError(f"flashgpt: num_kv_heads {num_kv_heads} must divide num_heads {num_heads}")
        self.head_dim = embed_dim // num_heads
        if rope and self.head_dim % 2 != 0:
            raise ValueError(f"flashgpt: rope needs an even head dim, got {self.head_dim}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"flashgpt: dropout must be in [0, 1), got {dropout}")
        self.embed_dim, self.num_heads, self.num_kv_heads = embed_dim, num_heads, num_kv_heads
        self.causal, self.rope, self.rope_base, self.dropout = causal, rope, rope_base, dropout
        factory = {"device": device, "dtype": dtype}
        self.Wqkv = torch.nn.Linear(embed_dim, (num_heads + 2 * num_kv_heads) * self.head_dim, bias=bias, **factory)
        self.out_proj = torch.nn.Linear(embed_dim, embed_dim, bias=bias, **factory)

    def forward(self, x):
        B, T, C = x.shape
        qkv = self.Wqkv(x).view(B, T, self.num_heads + 2 * self.num_kv_heads, self.head_dim)
        q, k, v = qkv.split([self.num_heads, self.num_kv_heads, self.num_kv_heads], dim=2)
        if self.rope:
            q, k = rotary(q, self.rope_base), rotary(k, self.rope_base)
        y = flash_attn_func(q, k, v, dropout_p=self.dropout if self.training else 0.0, causal=self.causal)
        return self.out_proj(y.reshape(B, T, C))
