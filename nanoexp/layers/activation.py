"""SwiGLU activation on a fused [gate | up] tensor."""

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from nanoexp.layers.compiled import compilable


@compilable
def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


class SiluAndMul(nn.Module):
    """`kernel` (bound by `bind_activation_kernel`) takes 2-D inputs; the rest take the torch op."""

    kernel: Callable[[torch.Tensor], torch.Tensor] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel is not None and x.dim() == 2:
            return self.kernel(x)
        return silu_and_mul(x)


def bind_activation_kernel(model: nn.Module, kernel: Callable[[torch.Tensor], torch.Tensor] | None) -> None:
    for module in model.modules():
        if isinstance(module, SiluAndMul):
            module.kernel = kernel
