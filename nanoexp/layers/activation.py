"""SwiGLU activation on a fused [gate | up] tensor."""

import torch
import torch.nn.functional as F
from torch import nn

from nanoexp.layers.fusion import fusable


@fusable
def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


class SiluAndMul(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return silu_and_mul(x)
