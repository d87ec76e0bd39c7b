"""A MoE layer's experts, sharded by tensor parallelism (each expert's intermediate dim) or by expert
parallelism (whole experts per rank). Hidden states are replicated on every rank after attention, so
either way each rank computes its share of every token's experts and one all-reduce (the caller's)
sums the partial outputs: no all-to-all. Under fp8 weights the experts are block-scaled e4m3 with the
W8A8 arithmetic of the fp8 linear layers (layers/quantization.Fp8Experts)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from nanoexp.distributed import tp_rank, tp_size
from nanoexp.kernels.moe_ref import Fp8ExpertScales, experts_reference, route
from nanoexp.layers.linear import rows
from nanoexp.layers.quantization import Fp8Experts, building_method, set_loader_attrs

ExpertsKernel = Any  # kernels/triton_moe.TritonMoe: moe(...), routing and experts
SHARDS = ("gate", "up", "down")
CHECKPOINT_NAMES = {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}


class FusedMoE(nn.Module):
    """w13 [local experts, 2 * local inter, hidden] (gate rows, then up: as the dense MLP's gate_up_proj)
    and w2 [local experts, hidden, local inter]; the checkpoint's per-expert tensors load into them. Built
    under `quantization.building("fp8")`: e4m3 weights (K padded to whole 128-blocks) with block scales
    w13_scale_inv and w2_scale_inv."""

    w13_scale_inv: Tensor  # fp8 experts only: set by Fp8Experts
    w2_scale_inv: Tensor

    def __init__(
        self,
        num_experts: int,
        top_k: int,
        hidden: int,
        inter: int,
        renormalize: bool,
        expert_parallel: bool = False,
    ):
        super().__init__()
        size, rank = tp_size(), tp_rank()
        self.num_experts, self.top_k, self.renormalize = num_experts, top_k, renormalize
        self.expert_parallel = expert_parallel and size > 1
        self.num_local = num_experts // size if self.expert_parallel else num_experts
        self.first_expert = rank * self.num_local if self.expert_parallel else 0
        self.inter = inter
        self.local_inter = inter if self.expert_parallel else inter // size
        self.tp_rank, self.tp_size = rank, size
        self.kernel: ExpertsKernel | None = None  # bound by bind_moe_kernel; None: the torch reference
        self.load_counts: Tensor | None = None  # [num_experts] int32, filled per step when bound
        self.w13 = nn.Parameter(
            torch.empty(self.num_local, 2 * self.local_inter, hidden), requires_grad=False
        )
        self.w2 = nn.Parameter(torch.empty(self.num_local, hidden, self.local_inter), requires_grad=False)
        self.hidden = hidden
        self.fp8: Fp8Experts | None = None
        if building_method() == "fp8":
            self.fp8 = Fp8Experts(self, hidden, self.local_inter, self.inter_start, inter)
            set_loader_attrs(self.w13_scale_inv, weight_loader=self.scale_loader)
            set_loader_attrs(self.w2_scale_inv, weight_loader=self.scale_loader)
        for param in (self.w13, self.w2):
            param.weight_loader = self.weight_loader  # type: ignore[attr-defined]  # read by the loader
        self.loaded: set[tuple[int, str]] = set()  # (expert, piece) copied in, of this rank's experts

    @property
    def inter_start(self) -> int:
        """This rank's first intermediate row of each expert in the checkpoint."""
        return 0 if self.expert_parallel else self.tp_rank * self.local_inter

    def checkpoint_shape(self, shard: str) -> list[int]:
        """The shape of one expert's gate, up or down tensor in the checkpoint."""
        return [self.hidden, self.inter] if shard == "down" else [self.inter, self.hidden]

    def rows_of(self, shard: str) -> tuple[int, int, int]:
        """(first local row, rows, first checkpoint row) of an expert's gate, up or down tensor in its fused
        weight; down's columns are this rank's intermediate rows (`inter_start`)."""
        if shard == "down":
            return 0, self.hidden, 0
        return (0 if shard == "gate" else self.local_inter), self.local_inter, self.inter_start

    def local_expert(self, expert: int) -> int | None:
        local = expert - self.first_expert
        return local if 0 <= local < self.num_local else None  # None: another rank's expert

    def weight_loader(self, param: nn.Parameter, loaded, expert: int, shard: str) -> None:
        local = self.local_expert(expert)
        if local is None:
            return
        if self.fp8 is not None:
            self.load_fp8_weight(param, loaded, local, shard)
        elif shard == "down":
            param.data[local].copy_(rows(loaded, self.inter_start, self.local_inter, dim=1))
        else:
            offset, size, start = self.rows_of(shard)
            param.data[local].narrow(0, offset, size).copy_(rows(loaded, start, size))
        self.loaded.add((local, shard))

    def load_fp8_weight(self, param: nn.Parameter, loaded, local: int, shard: str) -> None:
        """An e4m3 expert tensor copied in; an unquantized one quantized first, with its scales."""
        assert self.fp8 is not None
        name, span = ("w2" if shard == "down" else "w13"), self.rows_of(shard)
        scales = self.fp8.load_weight(name, param.data[local], loaded, span)
        if scales is not None:
            scale = getattr(self, self.fp8.scale_of[name])
            self.fp8.load_scale(name, scale.data[local], scales, span)
            set_loader_attrs(scale, quantized_here=True)  # the loader expects no checkpoint scales for it
            self.loaded.add((local, f"{shard}_scale"))

    def scale_loader(self, param: nn.Parameter, loaded, expert: int, shard: str) -> None:
        local = self.local_expert(expert)
        if local is None:
            return
        assert self.fp8 is not None  # scale parameters exist only with fp8 experts
        name = "w2" if shard == "down" else "w13"
        self.fp8.load_scale(name, param.data[local], loaded, self.rows_of(shard))
        self.loaded.add((local, f"{shard}_scale"))

    def missing_pieces(self) -> list[str]:
        """The per-expert checkpoint tensors of this rank's experts that no file held."""
        pieces = [(s, f"{CHECKPOINT_NAMES[s]}.weight") for s in SHARDS]
        if self.fp8 is not None:
            pieces += [(f"{s}_scale", f"{CHECKPOINT_NAMES[s]}.weight_scale_inv") for s in SHARDS]
        return [
            f"{self.first_expert + e}.{name}"
            for e in range(self.num_local)
            for piece, name in pieces
            if (e, piece) not in self.loaded
        ]

    def fp8_scales(self) -> Fp8ExpertScales | None:
        """What the expert kernels take besides w13 and w2 when those are fp8."""
        if self.fp8 is None:
            return None
        layouts, amax = self.fp8.layouts, self.fp8.down_amax if self.fp8.sync_amax else None
        return Fp8ExpertScales(self.w13_scale_inv, self.w2_scale_inv, layouts["w13"], layouts["w2"], amax)

    def forward(self, x: Tensor, router_logits: Tensor, token_slots: Tensor | None = None) -> Tensor:
        """This rank's partial output (before the all-reduce). `token_slots` [T], the step's KV slot mapping,
        marks a graph's padding rows with -1: they are routed too, and `load_counts` does not count them.
        (Read as it is, not through a mask derived from it: a derived tensor made before a graph's capture
        would be replayed stale.)"""
        if self.kernel is not None:
            return self.kernel.moe(
                x,
                router_logits,
                self.w13,
                self.w2,
                self.top_k,
                self.renormalize,
                self.first_expert,
                self.load_counts,
                token_slots,
                not self.expert_parallel,
                self.fp8_scales(),
            )
        weights, ids = route(router_logits, self.top_k, self.renormalize)
        if self.load_counts is not None:
            real = torch.ones_like(ids[:, :1]) if token_slots is None else (token_slots >= 0)[:, None]
            self.load_counts.scatter_add_(0, ids.reshape(-1), real.int().expand_as(ids).reshape(-1))
        local = ids
        if self.expert_parallel:
            local = ids - self.first_expert
            local = torch.where((local < 0) | (local >= self.num_local), -1, local)
        return experts_reference(x, self.w13, self.w2, weights, local, self.fp8_scales())


def moe_layers(model: nn.Module) -> list[FusedMoE]:
    return [m for m in model.modules() if isinstance(m, FusedMoE)]


def bind_moe_kernel(model: nn.Module, kernel: ExpertsKernel | None) -> None:
    """Every MoE layer of `model` computes its experts with `kernel` (None: the torch reference)."""
    for layer in moe_layers(model):
        layer.kernel = kernel
