"""RMSNorm, optionally fused with the residual add that precedes it."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from nanoexp.layers.compiled import compilable


@compilable
def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


@compilable
def add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    summed = x.float() + residual.float()
    normed = summed * torch.rsqrt(summed.pow(2).mean(dim=-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype), summed.to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)

    def forward(self, x: Tensor, residual: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
        """Without residual: norm(x). With residual: (norm(x + residual), x + residual)."""
        if residual is None:
            return rms_norm(x, self.weight, self.eps)
        return add_rms_norm(x, residual, self.weight, self.eps)
