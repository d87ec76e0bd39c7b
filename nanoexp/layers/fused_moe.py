"""A MoE layer's experts, sharded by tensor parallelism (each expert's intermediate dim) or by expert
parallelism (whole experts per rank). Hidden states are replicated on every rank after attention, so
either way each rank computes its share of every token's experts and one all-reduce (the caller's)
sums the partial outputs: no all-to-all."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from nanoexp.distributed import tp_rank, tp_size
from nanoexp.kernels.moe_ref import experts_reference, route
from nanoexp.layers.linear import rows

ExpertsKernel = Any  # kernels/triton_moe.TritonMoe: route(...) and experts(...)
SHARDS = ("gate", "up", "down")


class FusedMoE(nn.Module):
    """w13 [local experts, 2 * local inter, hidden] (gate rows, then up: as the dense MLP's gate_up_proj)
    and w2 [local experts, hidden, local inter]; the checkpoint's per-expert tensors load into them."""

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
        for param in (self.w13, self.w2):
            param.weight_loader = self.weight_loader  # type: ignore[attr-defined]  # read by the loader
        self.loaded: set[tuple[int, str]] = set()  # (expert, shard) pieces copied in, of this rank's experts

    def checkpoint_shape(self, shard: str) -> list[int]:
        """The shape of one expert's gate, up or down tensor in the checkpoint."""
        hidden = self.w13.shape[2]
        return [hidden, self.inter] if shard == "down" else [self.inter, hidden]

    def weight_loader(self, param: nn.Parameter, loaded, expert: int, shard: str) -> None:
        local = expert - self.first_expert
        if not 0 <= local < self.num_local:
            return  # another rank's expert
        size = self.local_inter
        start = 0 if self.expert_parallel else self.tp_rank * size
        if shard == "down":
            param.data[local].copy_(rows(loaded, start, size, dim=1))
        else:
            offset = 0 if shard == "gate" else size
            param.data[local].narrow(0, offset, size).copy_(rows(loaded, start, size))
        self.loaded.add((local, shard))

    def missing_pieces(self) -> list[str]:
        """The per-expert checkpoint tensors of this rank's experts that no file held."""
        names = {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}
        return [
            f"{self.first_expert + e}.{names[s]}.weight"
            for e in range(self.num_local)
            for s in SHARDS
            if (e, s) not in self.loaded
        ]

    def forward(self, x: Tensor, router_logits: Tensor, token_slots: Tensor | None = None) -> Tensor:
        """This rank's partial output (before the all-reduce). `token_slots` [T], the step's KV slot mapping,
        marks a graph's padding rows with -1: they are routed too, and `load_counts` does not count them.
        (Read as it is, not through a mask derived from it: a derived tensor made before a graph's capture
        would be replayed stale.)"""
        if self.kernel is not None:
            counts, first, num_local = self.load_counts, self.first_expert, self.num_local
            weights, ids = self.kernel.route(
                router_logits, self.top_k, self.renormalize, first, num_local, counts, token_slots
            )
            return self.kernel.experts(x, self.w13, self.w2, weights, ids, not self.expert_parallel)
        weights, ids = route(router_logits, self.top_k, self.renormalize)
        if self.load_counts is not None:
            real = torch.ones_like(ids[:, :1]) if token_slots is None else (token_slots >= 0)[:, None]
            self.load_counts.scatter_add_(0, ids.reshape(-1), real.int().expand_as(ids).reshape(-1))
        local = ids
        if self.expert_parallel:
            local = ids - self.first_expert
            local = torch.where((local < 0) | (local >= self.num_local), -1, local)
        return experts_reference(x, self.w13, self.w2, weights, local)


def moe_layers(model: nn.Module) -> list[FusedMoE]:
    return [m for m in model.modules() if isinstance(m, FusedMoE)]


def bind_moe_kernel(model: nn.Module, kernel: ExpertsKernel | None) -> None:
    """Every MoE layer of `model` computes its experts with `kernel` (None: the torch reference)."""
    for layer in moe_layers(model):
        layer.kernel = kernel
