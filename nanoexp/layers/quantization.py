"""Block-scaled FP8 weights (the format of Qwen3's `-FP8` checkpoints, DeepSeek-V3's scheme): each linear
holds `weight` in float8_e4m3fn and `weight_scale_inv`, one float32 per 128 x 128 block, with W8A8
arithmetic (activations quantized per token in groups of 128 along K at run time, fp32 accumulation).

A rank's shard need not be a multiple of 128. Along K (row-parallel layers) the shard is stored at its
offset inside the checkpoint's 128-wide blocks, zero-padded to whole blocks, so activation groups and
weight blocks stay those of the whole tensor. Along N (column-parallel, fused q/k/v and gate/up) the
scales are kept per 128 rows where every fused part is a multiple of 128, else one scale row per
output row (`Fp8Layout.row_block`), which follows any straddle or fused part.

Where the Triton (or cuBLAS) fp8 GEMMs are bound, a layer's input is quantized by the kernel that produces
it (the add + RMSNorm before qkv_proj and gate_up_proj, the SwiGLU before down_proj; `input_producer`) in
the layout its GEMM reads, so no quantization launch runs between them; a TP shard whose activation groups
straddle ranks quantizes its own input.

A MoE layer's experts (`Fp8Experts`) are laid out the same way per expert: w13 as a fused column-parallel
gate/up projection, w2 as a row-parallel one (its activation groups shared over the TP ranks they
straddle); under expert parallelism a rank's experts are whole. Routers stay dense."""

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
    ActivationFormat,
    Fp8Gemm,
    Fp8InputKernels,
    Fp8Layout,
    QuantizedActivation,
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


def is_fp8(loaded) -> bool:
    """Whether a checkpoint tensor (or a lazily read safetensors slice) holds e4m3 values."""
    dtype = getattr(loaded, "dtype", None) or loaded.get_dtype()
    return str(dtype) in ("F8_E4M3", "torch.float8_e4m3fn")


def copy_weight_rows(weight: Tensor, loaded, layout: Fp8Layout, rows: tuple[int, int, int]) -> None:
    """Copies an e4m3 checkpoint tensor's rows (local offset, size, checkpoint start) and this rank's
    columns into `weight` [n, k_padded], at the layout's offset."""
    (offset, size, start), k0, k = rows, layout.k_start, layout.k_local
    weight[offset : offset + size, layout.k_offset : layout.k_offset + k].copy_(
        loaded[start : start + size, k0 : k0 + k]
    )


def copy_scale_rows(scale: Tensor, loaded, layout: Fp8Layout, rows: tuple[int, int, int]) -> None:
    """Copies the checkpoint's scale blocks covering the same rows and columns into `scale`."""
    offset, size, start = rows
    local, ckpt_rows = scale_rows_index(layout, offset, size, start)
    first, last = int(ckpt_rows[0]), int(ckpt_rows[-1])
    col = layout.k_start // BLOCK
    block = loaded[first : last + 1, col : col + layout.k_blocks].to(scale.device, torch.float32)
    scale[local].copy_(block[(ckpt_rows - first).to(block.device)])


def quantized_dummy(
    layout: Fp8Layout, count: int, generator: torch.Generator, dtype: torch.dtype, device: torch.device
) -> tuple[Tensor, Tensor]:
    """`count` weights drawn at random as an unquantized layer draws them, each quantized in this rank's
    blocks: (e4m3 [count, n, k_padded], scales [count, scale_rows, k_blocks])."""
    n_padded = -(-layout.n // BLOCK) * BLOCK  # so that no 128-row block spans two weights
    dense = torch.empty(count, layout.n, layout.k_local, dtype=dtype, device=device)
    dense.uniform_(-0.02, 0.02, generator=generator)
    padded = torch.zeros(count, n_padded, layout.k_padded, dtype=torch.float32, device=device)
    padded[:, : layout.n, layout.k_offset : layout.k_offset + layout.k_local] = dense
    q, s = quantize_weight(padded.view(count * n_padded, layout.k_padded))
    rows = s.view(count, n_padded // BLOCK, layout.k_blocks).repeat_interleave(BLOCK, 1)
    return q.view(count, n_padded, -1)[:, : layout.n], rows[:, : layout.n : layout.row_block]


def straddles_ranks(layout: Fp8Layout, k_total: int) -> bool:
    """Whether a row-parallel shard's activation groups straddle ranks: then their amax is the max over
    the ranks (`shared_amax`), so every rank quantizes a group as one rank holding all of K would."""
    partial = layout.k_offset != 0 or (layout.k_offset + layout.k_local) % BLOCK != 0
    return partial and layout.k_local != k_total


def shared_amax(x: Tensor, layout: Fp8Layout, k_total: int) -> Tensor:
    """Per token and 128-group of this shard of x [..., k_local], the group's amax over every rank's part."""
    first = layout.k_start // BLOCK
    whole = x.new_zeros(x.shape[:-1].numel(), -(-k_total // BLOCK), dtype=torch.float32)
    whole[:, first : first + layout.k_blocks] = group_amax(x.reshape(-1, layout.k_local), layout)
    return all_reduce_max(whole)[:, first : first + layout.k_blocks].contiguous()


WEIGHT_CHECKPOINT_DTYPES = ("F8_E4M3", "F32", "F16", "BF16")  # unquantized ones are quantized at load
SCALE_CHECKPOINT_DTYPES = ("F32", "BF16")


def fp8_parameters(
    shape: tuple[int, ...], scale_shape: tuple[int, ...], logical_shape: list[int], device: torch.device
) -> tuple[nn.Parameter, nn.Parameter]:
    """An fp8 weight and its float32 scales (ones), with the attributes loader.py reads: logical_shape,
    what loader.checkpoint_shape scales to the checkpoint's; block_scale, the scales' checkpoint shape is
    the weight's in 128 blocks; the dtypes a checkpoint may hold."""
    weight = nn.Parameter(torch.zeros(shape, dtype=FP8_DTYPE, device=device), requires_grad=False)
    scale = nn.Parameter(torch.ones(scale_shape, dtype=torch.float32, device=device), requires_grad=False)
    set_loader_attrs(weight, logical_shape=logical_shape, checkpoint_dtypes=WEIGHT_CHECKPOINT_DTYPES)
    set_loader_attrs(
        scale, logical_shape=logical_shape, block_scale=True, checkpoint_dtypes=SCALE_CHECKPOINT_DTYPES
    )
    return weight, scale


class Fp8Weights:
    """What a linear layer (layers/linear.py) holds in fp8: its layout and GEMM, and its loaders."""

    scale_of = {"weight": "weight_scale_inv"}  # each fp8 parameter's scales (loader.init_dummy)

    def __init__(self, layer: nn.Module, layout: Fp8Layout, logical_shape: list[int], k_total: int):
        self.layout, self.k_total = layout, k_total
        self.sync_amax = straddles_ranks(layout, k_total)
        self.gemm: Fp8Gemm = w8a8_reference  # bound by bind_fp8_gemm
        self.input_kernels: Fp8InputKernels | None = None  # so is this (None: the layer quantizes its input)
        device = cast(Tensor, layer.weight).device
        layer.weight, layer.weight_scale_inv = fp8_parameters(
            (layout.n, layout.k_padded), (layout.scale_rows, layout.k_blocks), logical_shape, device
        )

    def load_weight(self, weight: Tensor, scale: Tensor, loaded, rows: tuple[int, int, int]) -> None:
        """Copies a checkpoint tensor's rows (local offset, size, checkpoint start) and this rank's columns;
        an unquantized one is quantized whole first (the published rule), with its scales."""
        if not is_fp8(loaded):
            q, s = quantize_weight(loaded[:].to(weight.device))
            set_loader_attrs(scale, quantized_here=True)  # the loader expects no checkpoint scales for it
            self.load_weight(weight, scale, q, rows)
            self.load_scale(scale, s, rows)
            return
        copy_weight_rows(weight.data, loaded, self.layout, rows)

    def load_scale(self, scale: Tensor, loaded, rows: tuple[int, int, int]) -> None:
        copy_scale_rows(scale.data, loaded, self.layout, rows)

    @torch.no_grad()
    def fill_dummy(
        self, name: str, weight: Tensor, scale: Tensor, generator: torch.Generator, dtype: torch.dtype
    ) -> None:
        """Random weights drawn as an unquantized layer draws them, quantized in this rank's blocks (`name`:
        which fp8 weight of the layer; a linear layer has one)."""
        q, s = quantized_dummy(self.layout, 1, generator, dtype, weight.device)
        weight.copy_(q[0])
        scale.copy_(s[0])

    def input_producer(self, x: Tensor) -> tuple[Fp8InputKernels, ActivationFormat] | None:
        """For a producer whose input is x [tokens, ...] (in this layer's input dtype): the kernels that may
        hand this layer its input quantized, and the format its GEMM reads; None: it takes it unquantized.
        A shard whose activation groups straddle TP ranks (sync_amax: the all-reduce(max) path; every shard
        at an offset inside a group is one) quantizes its own input: its groups' amax is not known to the
        producer."""
        kernels, layout = self.input_kernels, self.layout
        if kernels is None or self.sync_amax or x.dim() != 2:
            return None
        return kernels, kernels.activation_format(layout, x.shape[0], x.dtype)

    def forward(
        self, x: Tensor | QuantizedActivation, weight: Tensor, scale: Tensor, bias: Tensor | None
    ) -> Tensor:
        if isinstance(x, QuantizedActivation):  # quantized by its producer (input_producer)
            return self.gemm(x, weight, scale, self.layout, bias, None)
        amax = shared_amax(x, self.layout, self.k_total) if self.sync_amax else None
        return self.gemm(x, weight, scale, self.layout, bias, amax)


DUMMY_EXPERTS_AT_ONCE = 16


class Fp8Experts:
    """What a MoE layer's experts (layers/fused_moe.py) hold in fp8: per expert, w13 [2 * inter, hidden] laid
    out as a fused column-parallel gate/up projection and w2 [hidden, inter] as a row-parallel one (a TP
    shard of inter at its offset inside the checkpoint's 128-blocks), each with its block scales
    `w13_scale_inv` [experts, scale rows, K blocks] and `w2_scale_inv`."""

    scale_of = {"w13": "w13_scale_inv", "w2": "w2_scale_inv"}  # each fp8 parameter's scales

    def __init__(self, layer: nn.Module, hidden: int, inter: int, inter_start: int, inter_total: int):
        self.layouts = {
            "w13": layout_for(2 * inter, hidden, 0, [inter, inter]),
            "w2": layout_for(hidden, inter, inter_start, [hidden]),
        }
        self.inter_total = inter_total
        self.sync_amax = straddles_ranks(self.layouts["w2"], inter_total)
        experts, device = cast(Tensor, layer.w13).shape[0], cast(Tensor, layer.w13).device
        logical = {"w13": [2 * inter, hidden], "w2": [hidden, inter]}
        for name, layout in self.layouts.items():
            weight, scale = fp8_parameters(
                (experts, layout.n, layout.k_padded),
                (experts, layout.scale_rows, layout.k_blocks),
                logical[name],
                device,
            )
            setattr(layer, name, weight)
            setattr(layer, self.scale_of[name], scale)

    def load_weight(self, name: str, weight: Tensor, loaded, rows: tuple[int, int, int]) -> Tensor | None:
        """Copies one expert's checkpoint tensor (its rows and this rank's columns) into that expert's
        `weight` [n, k_padded]; an unquantized one is quantized whole first (the published rule): its
        scales, in the checkpoint's blocks, are returned for load_scale."""
        if is_fp8(loaded):
            copy_weight_rows(weight, loaded, self.layouts[name], rows)
            return None
        q, s = quantize_weight(loaded[:].to(weight.device))
        copy_weight_rows(weight, q, self.layouts[name], rows)
        return s

    def load_scale(self, name: str, scale: Tensor, loaded, rows: tuple[int, int, int]) -> None:
        copy_scale_rows(scale, loaded, self.layouts[name], rows)

    @torch.no_grad()
    def fill_dummy(
        self, name: str, weight: Tensor, scale: Tensor, generator: torch.Generator, dtype: torch.dtype
    ) -> None:
        """Each expert's random weights drawn and quantized as a linear layer's (a few experts at a time:
        the float32 copy of a layer's experts would take gigabytes)."""
        for first in range(0, weight.shape[0], DUMMY_EXPERTS_AT_ONCE):
            count = min(DUMMY_EXPERTS_AT_ONCE, weight.shape[0] - first)
            q, s = quantized_dummy(self.layouts[name], count, generator, dtype, weight.device)
            weight[first : first + count].copy_(q)
            scale[first : first + count].copy_(s)

    def down_amax(self, act: Tensor) -> Tensor | None:
        """The down projection's activation amax per slot and group, shared over the ranks where a TP
        shard's groups straddle them; None where each rank's groups are its own."""
        return shared_amax(act, self.layouts["w2"], self.inter_total) if self.sync_amax else None


def bind_fp8_gemm(model: nn.Module, gemm: Fp8Gemm, input_kernels: Fp8InputKernels | None = None) -> None:
    """Every fp8 linear layer of `model` runs `gemm` (the reference or the Triton kernels), its input
    quantized by its producer where `input_kernels` are given (and its groups are its own)."""
    for module in model.modules():
        fp8 = getattr(module, "fp8", None)
        if isinstance(fp8, Fp8Weights):
            fp8.gemm, fp8.input_kernels = gemm, input_kernels


def weight_quantization(model: nn.Module) -> tuple[str, str]:
    """(the weights' format, 'fp8' or 'none'; the fp8 GEMM bound: triton, triton+cublas, torch or ''). A MoE
    model's experts are fp8 whenever its linear layers are (their kernels: the runner's moe_kernel)."""
    fp8s = [fp8 for m in model.modules() if isinstance(fp8 := getattr(m, "fp8", None), Fp8Weights)]
    gemms = {fp8.gemm.__name__ for fp8 in fp8s}
    names = {"w8a8_reference": "torch", "fp8_linear": "triton", "cublas_fp8_linear": "triton+cublas"}
    return ("fp8", ",".join(sorted(names.get(g, g) for g in gemms))) if gemms else ("none", "")
