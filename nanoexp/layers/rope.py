"""Rotary position embedding (NeoX style: rotate the two halves of each head)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from nanoexp.layers.compiled import compilable
from nanoexp.layers.norm import rms_norm


class RotaryEmbedding(nn.Module):
    cos_sin: Tensor  # [max_position, head_dim] float32: cos halves, then sin halves

    def __init__(self, head_dim: int, max_position: int, base: float):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        freqs = torch.outer(torch.arange(max_position, dtype=torch.float), inv_freq)
        cos_sin = torch.cat([freqs.cos(), freqs.sin()], dim=-1)
        self.register_buffer("cos_sin", cos_sin, persistent=False)  # apply_rope's table


@compilable
def apply_rope(positions: Tensor, q: Tensor, k: Tensor, cos_sin: Tensor) -> tuple[Tensor, Tensor]:
    cos, sin = cos_sin[positions].unsqueeze(1).chunk(2, dim=-1)
    return rotate(q, cos, sin), rotate(k, cos, sin)


@compilable
def qk_norm_rope(
    positions: Tensor, q: Tensor, k: Tensor, q_weight: Tensor, k_weight: Tensor, eps: float, cos_sin: Tensor
) -> tuple[Tensor, Tensor]:
    """Per-head RMSNorm of q and k, then RoPE (Qwen3), as one op."""
    q, k = rms_norm.__wrapped__(q, q_weight, eps), rms_norm.__wrapped__(k, k_weight, eps)
    return apply_rope.__wrapped__(positions, q, k, cos_sin)


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)
