"""The RMSNorm a skinny GEMM applies to its input first."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class NormFirst:
    """RMSNorm(x + residual) * weight before the product; residual None: RMSNorm(x) * weight."""

    weight: torch.Tensor
    eps: float
    residual: torch.Tensor | None = None
