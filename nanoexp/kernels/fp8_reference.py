"""The block-scaled FP8 format's arithmetic in torch: the published weight quantization rule, the
per-token-group activation quantization and the W8A8 product (DeepSeek-V3's scheme, as Qwen3's `-FP8`
checkpoints and transformers' FineGrainedFP8 use it). It runs on CPUs and is the Triton kernels' oracle.

A layout describes one rank's weight: its K columns sit at their offset inside the checkpoint's 128-wide
blocks, zero-padded to whole blocks, so activation groups and weight blocks are those of the whole
tensor; the scales are per 128 output rows, or per row where a rank's rows straddle a block."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

BLOCK = 128
FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8_DTYPE).max  # 448
ACT_EPS = 1e-10  # a group's amax floor, so an all-zero group quantizes to zeros


@dataclass(frozen=True)
class Fp8Layout:
    """One rank's weight [n, k_padded] (its k_local columns at k_offset) and scales [ceil(n / row_block),
    k_blocks]; k_start is the shard's first column in the checkpoint tensor."""

    n: int
    k_local: int
    k_start: int
    row_block: int

    @property
    def k_offset(self) -> int:
        return self.k_start % BLOCK

    @property
    def k_blocks(self) -> int:
        return -(-(self.k_offset + self.k_local) // BLOCK)

    @property
    def k_padded(self) -> int:
        return self.k_blocks * BLOCK

    @property
    def scale_rows(self) -> int:
        return -(-self.n // self.row_block)


@dataclass(frozen=True)
class ActivationFormat:
    """How an fp8 linear layer reads its input quantized: e4m3 [rows, layout.k_padded] and float32 scales
    [rows, layout.k_blocks], stored M-major (a transposed view, as cuBLAS's block-scaled GEMM reads them)
    or row-major (the Triton kernels'); rows >= the token count, the rows past it zeros (cuBLAS takes
    M-major scales of whole multiples of rows only)."""

    layout: Fp8Layout
    rows: int
    m_major: bool


@dataclass(frozen=True)
class QuantizedActivation:
    """An fp8 linear layer's input, quantized by its producer (a norm or SwiGLU kernel) in `fmt`: q, scales
    as ActivationFormat says; dtype and shape [..., k_local] those of the unquantized activation (the
    layer's output takes its dtype and leading dims)."""

    q: Tensor
    scales: Tensor
    fmt: ActivationFormat
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def tokens(self) -> int:
        return math.prod(self.shape[:-1])

    def row_major(self) -> tuple[Tensor, Tensor]:
        """(q, scales) of the tokens' rows, the scales row-major."""
        q, scales = self.q[: self.tokens], self.scales[: self.tokens]
        return q, scales.contiguous() if self.fmt.m_major else scales


def quantize_weight(w: Tensor) -> tuple[Tensor, Tensor]:
    """The published rule, per 128 x 128 block (ragged edge blocks included): scale = 448 / amax (1 for
    an all-zero block), weight = clamp(w * scale) in e4m3, weight_scale_inv = 1 / scale (float32)."""
    n, k = w.shape
    rows, cols = -(-n // BLOCK), -(-k // BLOCK)
    padded = torch.zeros(rows * BLOCK, cols * BLOCK, dtype=torch.float32, device=w.device)
    padded[:n, :k] = w
    blocks = padded.view(rows, BLOCK, cols, BLOCK)
    amax = blocks.abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, FP8_MAX / torch.where(amax > 0, amax, 1.0), 1.0)
    q = (blocks * scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q.view(rows * BLOCK, cols * BLOCK)[:n, :k].contiguous(), (1.0 / scale).float()


def padded_groups(x: Tensor, layout: Fp8Layout) -> Tensor:
    """x [M, k_local] as float32 [M, k_blocks, 128] at the layout's offset, zeros around."""
    m = x.shape[0]
    padded = x.new_zeros(m, layout.k_padded, dtype=torch.float32)
    padded[:, layout.k_offset : layout.k_offset + layout.k_local] = x
    return padded.view(m, layout.k_blocks, BLOCK)


def group_amax(x: Tensor, layout: Fp8Layout) -> Tensor:
    """Each token's max |x| per 128-group of the layout, float32 [M, k_blocks]."""
    return padded_groups(x, layout).abs().amax(-1)


def quantize_activation(x: Tensor, layout: Fp8Layout, amax: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """x [M, k_local] -> (e4m3 [M, k_padded] at the layout's offset, float32 scales [M, k_blocks]) per token
    and group of 128: scale = max(amax, eps) / 448, q = clamp(x / scale). `amax`: the groups' amax when
    given (a group that straddles TP ranks takes the max over all of them)."""
    m = x.shape[0]
    groups = padded_groups(x, layout)
    amax = groups.abs().amax(-1) if amax is None else amax
    # a tensor divisor: CUDA divides by a Python scalar as a product with its reciprocal, not IEEE division
    scale = amax.clamp_min(ACT_EPS) / torch.full_like(amax, FP8_MAX)
    q = (groups / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q.view(m, layout.k_padded), scale


def expand_scale(scale: Tensor, layout: Fp8Layout) -> Tensor:
    """Per-output-row scales [n, k_blocks], float32."""
    return scale.float().repeat_interleave(layout.row_block, 0)[: layout.n]


def w8a8_reference(
    x: Tensor | QuantizedActivation,
    weight: Tensor,
    scale: Tensor,
    layout: Fp8Layout,
    bias: Tensor | None = None,
    amax: Tensor | None = None,
) -> Tensor:
    """x [..., k_local] @ dequant(weight)^T in the W8A8 arithmetic: per-block products of the quantized
    operands times both scales, summed, rounded once to x's dtype, then + bias. x may come quantized (then
    `amax` is unused). The sum is float64's: a float32 GEMM sums in an order the BLAS picks for the shape,
    so a row's last bit would depend on the rows beside it (and a last bit moves the next layer's e4m3
    rounding now and then), where float64's order error stays far below the bits the rounding keeps: a
    token's result does not depend on the batch it runs in."""
    if isinstance(x, QuantizedActivation):
        (xq, xs), lead, dtype = x.row_major(), x.shape[:-1], x.dtype
    else:
        lead, dtype = x.shape[:-1], x.dtype
        xq, xs = quantize_activation(x.reshape(math.prod(lead), layout.k_local), layout, amax)
    m, kb = math.prod(lead), layout.k_blocks
    xd = (xq.double().view(m, kb, BLOCK) * xs.double()[..., None]).view(m, -1)
    wd = (weight.double().view(layout.n, kb, BLOCK) * expand_scale(scale, layout).double()[..., None]).view(
        layout.n, -1
    )
    y = (xd @ wd.T).to(dtype)
    if bias is not None:
        y = y + bias
    return y.view(*lead, layout.n)


Fp8Gemm = Callable[
    [Tensor | QuantizedActivation, Tensor, Tensor, Fp8Layout, Tensor | None, Tensor | None], Tensor
]


@dataclass(frozen=True)
class Fp8InputKernels:
    """The producers that hand an fp8 linear layer its input quantized (kernels/triton_fp8_inputs.py), and
    the format the bound GEMM reads for a token count and dtype."""

    activation_format: Callable[[Fp8Layout, int, torch.dtype], ActivationFormat]
    # (x, residual or None, norm weight, eps, format) -> (norm(x + residual) quantized, x + residual)
    rms_norm: Callable[
        [Tensor, Tensor | None, Tensor, float, ActivationFormat], tuple[QuantizedActivation, Tensor]
    ]
    # ([gate | up], format) -> silu(gate) * up quantized
    silu_and_mul: Callable[[Tensor, ActivationFormat], QuantizedActivation]
