"""Block-scaled FP8 weights (the format of Qwen3's `-FP8` checkpoints, DeepSeek-V3's scheme): each linear
holds `weight` in float8_e4m3fn and `weight_scale_inv`, one float32 per 128 x 128 block, with W8A8
arithmetic (activations quantized per token in groups of 128 along K at run time, fp32 accumulation).

A rank's shard need not be a multiple of 128. Along K (row-parallel layers) the shard is stored at its
offset inside the checkpoint's 128-wide blocks, zero-padded to whole blocks, so activation groups and
weight blocks stay those of the whole tensor. Along N (column-parallel, fused q/k/v and gate/up) the
scales are kept per 128 rows where every fused part is a multiple of 128, else one scale row per
output row (`Fp8Layout.row_block`), which follows any straddle or fused part."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import cast

import torch
from torch import Tensor, nn

from nanoexp.config.checkpoint_files import CheckpointError
from nanoexp.distributed import all_reduce_max
from nanoexp.kernels.fp8_reference import (
    BLOCK,
    FP8_DTYPE,
    Fp8Gemm,
    Fp8Layout,
    group_amax,
    quantize_weight,
    w8a8_reference,
)

CHECKPOINT_FIELDS = {"fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [BLOCK, BLOCK]}

_building: str = "none"  # the method linear layers built now take (set by `building`)


class QuantizationError(CheckpointError):
    """A checkpoint's quantization_config that the engine cannot run."""


@contextlib.contextmanager
def building(method: str) -> Iterator[None]:
    """Linear layers constructed inside take `method`'s weight format."""
    global _building
    previous, _building = _building, method
    try:
        yield
    finally:
        _building = previous


def building_method() -> str:
    return _building


def checkpoint_method(quantization_config: dict | None, source: str) -> str:
    """'fp8' for a checkpoint in the block-scaled FP8 format, 'none' without quantization_config; any
    other format is one line naming quant_method (or the field) and what is supported."""
    if not quantization_config:
        return "none"
    method = quantization_config.get("quant_method")
    if method != "fp8":
        raise QuantizationError(
            f"{source}: quantization_config quant_method={method!r} is not supported; supported: 'fp8' "
            f"with {CHECKPOINT_FIELDS} (block-scaled FP8), or an unquantized checkpoint"
        )
    for key, want in CHECKPOINT_FIELDS.items():
        value = quantization_config.get(key, want)
        if (list(value) if isinstance(value, (list, tuple)) else value) != want:
            raise QuantizationError(
                f"{source}: quantization_config {key}={value!r} is not supported with quant_method='fp8'; "
                f"supported: {want!r}"
            )
    return "fp8"


# ---------------------------------------------------------------- a rank's shard


def layout_for(n: int, k_local: int, k_start: int, part_sizes: list[int]) -> Fp8Layout:
    aligned = all(size % BLOCK == 0 for size in part_sizes)
    return Fp8Layout(n, k_local, k_start, BLOCK if aligned else 1)


def scale_rows_index(
    layout: Fp8Layout, local_offset: int, size: int, ckpt_start: int
) -> tuple[slice, Tensor]:
    """For local rows [local_offset, +size) taken from checkpoint rows [ckpt_start, +size): the local
    scale rows they fill and, for each, the checkpoint scale row it takes."""
    ckpt_rows = torch.arange(ckpt_start, ckpt_start + size) // BLOCK
    step = layout.row_block
    return slice(local_offset // step, (local_offset + size) // step), ckpt_rows[::step]


# ---------------------------------------------------------------- a linear layer's fp8 weights


def set_loader_attrs(param: Tensor | nn.Module, **attrs: object) -> None:
    """Sets the attributes loader.py reads from a parameter (weight_loader, logical_shape, block_scale,
    checkpoint_dtypes, quantized_here): run-time attributes that a Tensor's type does not declare."""
    for name, value in attrs.items():
        setattr(param, name, value)


class Fp8Weights:
    """What a linear layer (layers/linear.py) holds in fp8: its layout and GEMM, and its loaders."""

    def __init__(self, layer: nn.Module, layout: Fp8Layout, logical_shape: list[int], k_total: int):
        self.layout = layout
        # a row-parallel shard whose activation groups straddle ranks: their amax is the max over the ranks,
        # so every rank quantizes a group as one rank holding all of K would
        self.groups = -(-k_total // BLOCK)
        straddles = layout.k_offset != 0 or (layout.k_offset + layout.k_local) % BLOCK != 0
        self.sync_amax = straddles and layout.k_local != k_total
        self.gemm: Fp8Gemm = w8a8_reference  # bound by bind_fp8_gemm
        device = cast(Tensor, layer.weight).device
        weight = torch.zeros(layout.n, layout.k_padded, dtype=FP8_DTYPE, device=device)
        scale = torch.ones(layout.scale_rows, layout.k_blocks, dtype=torch.float32, device=device)
        layer.weight = nn.Parameter(weight, requires_grad=False)
        layer.weight_scale_inv = nn.Parameter(scale, requires_grad=False)
        # logical_shape: what loader.checkpoint_shape scales to the checkpoint's; unquantized: quantized here
        set_loader_attrs(
            layer.weight, logical_shape=logical_shape, checkpoint_dtypes=("F8_E4M3", "F32", "F16", "BF16")
        )
        # block_scale: its checkpoint shape is the weight's in 128 blocks
        set_loader_attrs(
            layer.weight_scale_inv,
            logical_shape=logical_shape,
            block_scale=True,
            checkpoint_dtypes=("F32", "BF16"),
        )

    def load_weight(self, weight: Tensor, scale: Tensor, loaded, rows: tuple[int, int, int]) -> None:
        """Copies a checkpoint tensor's rows (local offset, size, checkpoint start) and this rank's columns;
        an unquantized one is quantized whole first (the published rule), with its scales."""
        if str(getattr(loaded, "dtype", None) or loaded.get_dtype()) not in (
            "F8_E4M3",
            "torch.float8_e4m3fn",
        ):
            q, s = quantize_weight(loaded[:].to(weight.device))
            set_loader_attrs(scale, quantized_here=True)  # the loader expects no checkpoint scales for it
            self.load_weight(weight, scale, q, rows)
            self.load_scale(scale, s, rows)
            return
        layout, (offset, size, start) = self.layout, rows
        k0, k = layout.k_start, layout.k_local
        weight.data[offset : offset + size, layout.k_offset : layout.k_offset + k].copy_(
            loaded[start : start + size, k0 : k0 + k]
        )

    def load_scale(self, scale: Tensor, loaded, rows: tuple[int, int, int]) -> None:
        layout, (offset, size, start) = self.layout, rows
        local, ckpt_rows = scale_rows_index(layout, offset, size, start)
        first, last = int(ckpt_rows[0]), int(ckpt_rows[-1])
        col = layout.k_start // BLOCK
        block = loaded[first : last + 1, col : col + layout.k_blocks].to(scale.device, torch.float32)
        scale.data[local].copy_(block[(ckpt_rows - first).to(block.device)])

    @torch.no_grad()
    def fill_dummy(
        self, weight: Tensor, scale: Tensor, generator: torch.Generator, dtype: torch.dtype
    ) -> None:
        """Random weights drawn as an unquantized layer draws them, quantized in this rank's blocks."""
        layout = self.layout
        dense = torch.empty(layout.n, layout.k_local, dtype=dtype, device=weight.device)
        dense.uniform_(-0.02, 0.02, generator=generator)
        padded = torch.zeros(layout.n, layout.k_padded, dtype=torch.float32, device=weight.device)
        padded[:, layout.k_offset : layout.k_offset + layout.k_local] = dense
        q, s = quantize_weight(padded)
        weight.copy_(q)
        scale.copy_(s.repeat_interleave(BLOCK, 0)[: layout.n : layout.row_block])

    def forward(self, x: Tensor, weight: Tensor, scale: Tensor, bias: Tensor | None) -> Tensor:
        amax = self.shared_amax(x) if self.sync_amax else None
        return self.gemm(x, weight, scale, self.layout, bias, amax)

    def shared_amax(self, x: Tensor) -> Tensor:
        """Per token and 128-group of this shard, the group's amax over every rank's part of it."""
        layout, first = self.layout, self.layout.k_start // BLOCK
        whole = x.new_zeros(x.shape[:-1].numel(), self.groups, dtype=torch.float32)
        whole[:, first : first + layout.k_blocks] = group_amax(x.reshape(-1, layout.k_local), layout)
        return all_reduce_max(whole)[:, first : first + layout.k_blocks].contiguous()


def bind_fp8_gemm(model: nn.Module, gemm: Fp8Gemm) -> None:
    """Every fp8 linear layer of `model` runs `gemm` (the reference or the Triton kernels)."""
    for module in model.modules():
        fp8 = getattr(module, "fp8", None)
        if isinstance(fp8, Fp8Weights):
            fp8.gemm = gemm


def weight_quantization(model: nn.Module) -> tuple[str, str]:
    """(the weights' format, 'fp8' or 'none'; the fp8 GEMM bound: triton, triton+cublas, torch or '')."""
    fp8s = [fp8 for m in model.modules() if isinstance(fp8 := getattr(m, "fp8", None), Fp8Weights)]
    gemms = {fp8.gemm.__name__ for fp8 in fp8s}
    names = {"w8a8_reference": "torch", "fp8_linear": "triton", "cublas_fp8_linear": "triton+cublas"}
    return ("fp8", ",".join(sorted(names.get(g, g) for g in gemms))) if gemms else ("none", "")
