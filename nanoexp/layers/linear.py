"""Linear layers sharded for tensor parallelism; each loads its own slice of a checkpoint tensor."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nanoexp.distributed import all_reduce, tp_rank, tp_size
from nanoexp.kernels.base import NormFirst
from nanoexp.kernels.fp8_reference import ActivationFormat, Fp8InputKernels, QuantizedActivation
from nanoexp.kernels.select import SkinnyGemm
from nanoexp.layers.activation import SiluAndMul
from nanoexp.layers.norm import RMSNorm
from nanoexp.layers.quantization import Fp8Weights, building_method, layout_for, set_loader_attrs


def shape_of(loaded) -> list[int]:
    """Shape of a tensor or of a lazily read safetensors slice."""
    return list(loaded.shape) if isinstance(loaded, Tensor) else loaded.get_shape()


def rows(loaded, start: int, size: int, dim: int = 0) -> Tensor:
    """Reads only [start, start + size) along `dim` (a lazy slice reads just those bytes)."""
    return loaded[(slice(None),) * dim + (slice(start, start + size),)]


class LinearBase(nn.Module):
    """Holds a [out_local, in_local] weight (and bias); `tp_dim` is the sharded weight dim. Sharded
    sizes divide evenly: the model passed `config.parallel.check_split`."""

    quantizable = True  # built in fp8 under `quantization.building("fp8")`; False keeps it dense (a router)
    weight_scale_inv: Tensor  # fp8 layers only: set by Fp8Weights

    def __init__(self, in_features: int, out_features: int, bias: bool, tp_dim: int):
        super().__init__()
        self.tp_dim = tp_dim
        self.tp_rank, self.tp_size = tp_rank(), tp_size()
        self.skinny: SkinnyGemm | None = None  # bound by bind_gemm_backend
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.weight.weight_loader = self.weight_loader  # type: ignore[attr-defined]  # read by loader.py
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False)
            self.bias.weight_loader = self.weight_loader  # type: ignore[attr-defined]
        else:
            self.register_parameter("bias", None)
        self.fp8: Fp8Weights | None = None
        if building_method() == "fp8" and self.quantizable:
            self.use_fp8(in_features, out_features)

    def use_fp8(self, in_features: int, out_features: int) -> None:
        """Block-scaled fp8 weights (layers/quantization.py) in place of the dense ones."""
        k_start = self.tp_rank * in_features if self.tp_dim == 1 else 0
        layout = layout_for(out_features, in_features, k_start, self.local_part_sizes(out_features))
        k_total = in_features * self.tp_size if self.tp_dim == 1 else in_features
        self.fp8 = Fp8Weights(self, layout, [out_features, in_features], k_total)
        set_loader_attrs(self.weight, weight_loader=self.fp8_weight_loader)
        set_loader_attrs(self.weight_scale_inv, weight_loader=self.fp8_scale_loader)

    def local_part_sizes(self, out_features: int) -> list[int]:
        """This rank's rows of each checkpoint tensor fused into the weight."""
        return [out_features]

    def rows_of(self, shard_id=None) -> tuple[int, int, int]:
        """(first local row, rows, first checkpoint row) of the checkpoint tensor `shard_id`."""
        n = self.fp8.layout.n if self.fp8 else self.weight.shape[0]
        return (0, n, self.tp_rank * n) if self.tp_dim == 0 else (0, n, 0)

    def fp8_weight_loader(self, param: nn.Parameter, loaded, *shard) -> None:
        assert self.fp8 is not None  # bound by use_fp8
        self.fp8.load_weight(param, self.weight_scale_inv, loaded, self.rows_of(*shard))

    def fp8_scale_loader(self, param: nn.Parameter, loaded, *shard) -> None:
        assert self.fp8 is not None  # bound by use_fp8
        self.fp8.load_scale(param, loaded, self.rows_of(*shard))

    def shard_of(self, loaded, dim: int) -> Tensor:
        size = shape_of(loaded)[dim] // self.tp_size
        return rows(loaded, self.tp_rank * size, size, dim)

    def weight_loader(self, param: nn.Parameter, loaded) -> None:
        sharded = self.tp_dim < len(shape_of(loaded))  # a row-parallel layer's bias is whole
        param.data.copy_(self.shard_of(loaded, self.tp_dim) if sharded else loaded[:])

    def forward(self, x: Tensor | QuantizedActivation) -> Tensor:
        return self.linear(x, self.bias)

    def linear(self, x: Tensor | QuantizedActivation, bias: Tensor | None) -> Tensor:
        if self.fp8 is not None:
            return self.fp8.forward(x, self.weight, self.weight_scale_inv, bias)
        assert isinstance(x, Tensor), "only fp8 layers take quantized inputs (input_producer)"
        if self.skinny is not None and self.skinny.applies(x, self.weight):
            return self.skinny.kernel(x, self.weight, bias)
        return F.linear(x, self.weight, bias)

    def norm_linear(
        self, norm: RMSNorm, x: Tensor, residual: Tensor | None, act_fn: SiluAndMul | None = None
    ) -> tuple[Tensor, Tensor]:
        """(act_fn(self(norm(x + residual))), x + residual); one skinny-GEMM kernel where it applies,
        with silu(gate) * up as its epilogue when there is `act_fn`. An fp8 layer takes norm's output
        quantized by the norm (normed_input)."""
        skinny, gated = self.skinny, act_fn is not None
        fits = (residual is None or residual.stride() == x.stride()) and not (gated and self.bias is not None)
        if fits and skinny is not None and skinny.applies(x, self.weight):
            first = NormFirst(norm.weight, norm.eps, residual)
            return skinny.kernel(x, self.weight, self.bias, gated=gated, norm=first)
        normed, residual = self.normed_input(norm, x, residual)
        out = self(normed)
        return (out if act_fn is None else act_fn(out)), residual

    def norm_gated_linear(
        self, norm: RMSNorm, x: Tensor, residual: Tensor | None, act_fn: SiluAndMul, consumer: LinearBase
    ) -> tuple[Tensor | QuantizedActivation, Tensor]:
        """norm_linear's (act_fn(self(norm(x + residual))), x + residual), the first as `consumer`'s input:
        quantized by the SwiGLU kernel where an fp8 consumer takes it so (activated_input)."""
        if consumer.fp8 is None or self.skinny is not None:
            return self.norm_linear(norm, x, residual, act_fn)
        normed, residual = self.normed_input(norm, x, residual)
        return consumer.activated_input(act_fn, self(normed)), residual

    def input_producer(self, x: Tensor) -> tuple[Fp8InputKernels, ActivationFormat] | None:
        return self.fp8.input_producer(x) if self.fp8 is not None else None

    def normed_input(
        self, norm: RMSNorm, x: Tensor, residual: Tensor | None
    ) -> tuple[Tensor | QuantizedActivation, Tensor]:
        """(norm(x + residual), x + residual) as this layer's input: quantized by the norm where it takes it
        so (input_producer)."""
        producer = self.input_producer(x)
        if producer is not None:
            kernels, fmt = producer
            return kernels.rms_norm(x, residual, norm.weight, norm.eps, fmt)
        return (norm(x), x) if residual is None else norm(x, residual)

    def activated_input(self, act_fn: SiluAndMul, gate_up: Tensor) -> Tensor | QuantizedActivation:
        """act_fn(gate_up) as this layer's input: quantized by the SwiGLU kernel where it takes it so."""
        producer = self.input_producer(gate_up)
        if producer is not None:
            kernels, fmt = producer
            return kernels.silu_and_mul(gate_up, fmt)
        return act_fn(gate_up)


class ReplicatedLinear(LinearBase):
    """The whole weight on every rank (a MoE router): no split, no communication; never fp8 (FP8
    checkpoints keep their routers in bf16, and a quantized router would move the experts' choices)."""

    quantizable = False

    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__(in_features, out_features, bias, tp_dim=2)  # dim 2: past the weight's dims


class MergedColumnParallelLinear(LinearBase):
    """Column-parallel outputs (split across ranks, no communication), several (e.g. gate and up)
    stored side by side per rank."""

    def __init__(self, in_features: int, output_sizes: list[int], bias: bool = False):
        self.output_sizes = output_sizes
        super().__init__(in_features, sum(output_sizes) // tp_size(), bias, 0)

    def local_part_sizes(self, out_features: int) -> list[int]:
        return [size // self.tp_size for size in self.output_sizes]

    def rows_of(self, shard_id=None) -> tuple[int, int, int]:
        size = self.output_sizes[shard_id] // self.tp_size
        return sum(self.output_sizes[:shard_id]) // self.tp_size, size, self.tp_rank * size

    def weight_loader(self, param: nn.Parameter, loaded, shard_id: int) -> None:  # type: ignore[override]
        offset, size, start = self.rows_of(shard_id)
        param.data.narrow(0, offset, size).copy_(rows(loaded, start, size))


class QKVParallelLinear(LinearBase):
    """Fused q/k/v projection, column-parallel: each rank holds its query heads and KV heads
    (replicated when there are fewer KV heads than ranks)."""

    def __init__(self, hidden: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool):
        size = tp_size()
        self.head_dim = head_dim
        self.num_heads = num_heads // size
        self.num_kv_heads = max(1, num_kv_heads // size)
        self.total_kv_heads = num_kv_heads
        super().__init__(hidden, (self.num_heads + 2 * self.num_kv_heads) * head_dim, bias, 0)

    def local_part_sizes(self, out_features: int) -> list[int]:
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return [q_size, kv_size, kv_size]

    def rows_of(self, shard_id=None) -> tuple[int, int, int]:
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        offset, size = {"q": (0, q_size), "k": (q_size, kv_size), "v": (q_size + kv_size, kv_size)}[shard_id]
        heads = self.num_heads * self.tp_size if shard_id == "q" else self.total_kv_heads
        first_head = self.tp_rank * heads // self.tp_size  # replicated KV heads: ranks share one
        return offset, size, first_head * self.head_dim

    def weight_loader(self, param: nn.Parameter, loaded, shard_id: str) -> None:  # type: ignore[override]
        offset, size, start = self.rows_of(shard_id)
        param.data.narrow(0, offset, size).copy_(rows(loaded, start, size))


class RowParallelLinear(LinearBase):
    """Splits input features across ranks and all-reduces the partial outputs."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__(in_features // tp_size(), out_features, bias, 1)

    def forward(self, x: Tensor | QuantizedActivation) -> Tensor:
        bias = self.bias if self.tp_rank == 0 else None
        return all_reduce(self.linear(x, bias))


def bind_gemm_backend(model: nn.Module, skinny: SkinnyGemm | None) -> None:
    """Every linear layer of `model` sends decode-sized inputs to `skinny` (None: torch only)."""
    for module in model.modules():
        if isinstance(module, LinearBase):
            module.skinny = None if module.fp8 is not None else skinny
