"""Which GEMM runs a decode-sized linear layer: torch (cuBLAS) or the Triton skinny GEMM."""

from __future__ import annotations

import torch

from nanoexp.kernels.norm_first import NormFirst
from nanoexp.kernels.select import require_triton, triton_half_precision

# Where `auto` takes the Triton kernel (H200, bf16, vs cuBLAS): all of Qwen3-0.6B's layers; cuBLAS wins
# every Qwen3-8B shape but one tie (8B batch-1 TPOT 5.51 ms with the kernel, 4.95 without;
# experiments/kernels/runs/skinny_gemm_8b.md).
AUTO_MAX_ROWS = 16
AUTO_MAX_WEIGHT_BYTES = 12 * 2**20
MAX_ROWS = 256  # the kernel's limit (triton_gemm.MAX_ROWS); `triton` takes every size up to it


class SkinnyGemm:
    """Routes x [M, K] @ w[N, K]^T with M <= max_rows to the Triton kernel."""

    def __init__(self, max_rows: int, max_weight_bytes: int | None = None):
        from nanoexp.kernels.triton_gemm import skinny_gemm  # only once Triton is known to be there

        self.max_rows = max_rows
        self.max_weight_bytes = max_weight_bytes
        self.kernel = skinny_gemm

    def applies(self, x: torch.Tensor, weight: torch.Tensor) -> bool:
        fits = x.dim() == 2 and x.shape[0] <= self.max_rows and x.stride(-1) == 1 and weight.stride(-1) == 1
        limit = self.max_weight_bytes  # `fits` first: prefill-sized inputs leave there
        return fits and (limit is None or weight.numel() * weight.element_size() <= limit)

    def __call__(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, gated: bool = False,
        norm: NormFirst | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """x @ weight^T + bias; gated and norm as in triton_gemm.skinny_gemm."""
        return self.kernel(x, weight, bias, gated=gated, norm=norm)

    def describe(self) -> str:
        limit = f", weights up to {self.max_weight_bytes / 2**20:g} MiB" if self.max_weight_bytes else ""
        return f"triton up to {self.max_rows} rows{limit}"


def make_skinny_gemm(choice: str, device: torch.device, dtype: torch.dtype) -> SkinnyGemm | None:
    """`engine.gemm_backend`: torch: None; triton: up to 256 rows; auto: the measured range, or None."""
    if choice == "torch":
        return None
    if choice == "triton":
        require_triton("engine.gemm_backend", device)
        return SkinnyGemm(MAX_ROWS)
    return SkinnyGemm(AUTO_MAX_ROWS, AUTO_MAX_WEIGHT_BYTES) if triton_half_precision(device, dtype) else None
