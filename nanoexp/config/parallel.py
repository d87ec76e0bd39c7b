"""Tensor parallelism: how many ranks, and which sizes a model can be split into."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nanoexp.config.checks import KnobError, boolean, choice, integer

ALL_REDUCES = ("auto", "nccl", "symm_mem")


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1
    # auto: symmetric memory for the message sizes where it beats NCCL (CUDA), NCCL above (gloo on
    # CPU); nccl; symm_mem: symmetric memory for every message its buffer takes (CUDA only)
    all_reduce: str = "auto"
    # greedy and one-pass-kernel steps drawn from each rank's vocabulary shard (one all-gather of
    # the winners) instead of gathering the full logits on rank 0 and broadcasting the tokens
    sharded_sampling: bool = True
    # MoE models: each rank holds num_experts / tensor_parallel_size whole experts (vLLM's
    # --enable-expert-parallel) instead of a slice of every expert's intermediate dim
    expert_parallel: bool = False

    def __post_init__(self) -> None:
        integer("parallel.tensor_parallel_size", self.tensor_parallel_size, 1)
        choice("parallel.all_reduce", self.all_reduce, ALL_REDUCES)
        boolean("parallel.sharded_sampling", self.sharded_sampling)
        boolean("parallel.expert_parallel", self.expert_parallel)


def split_dims(arch: Mapping[str, Any], expert_parallel: bool) -> tuple[str, ...]:
    """The dimensions tensor parallelism splits: a MoE model's experts whole (expert parallel) or each
    expert's intermediate dim."""
    dims = ("num_attention_heads", "intermediate_size", "num_key_value_heads")
    experts = experts_key(arch)
    if experts is None:
        return dims
    return (*dims, experts if expert_parallel else "moe_intermediate_size")


def experts_key(arch: Mapping[str, Any]) -> str | None:
    """A MoE config's key for its expert count (config.json says num_experts; transformers' to_dict
    num_local_experts), None for a dense model."""
    return next((k for k in ("num_experts", "num_local_experts") if arch.get(k)), None)


def unsplit_dim(arch: Mapping[str, Any], size: int, expert_parallel: bool = False) -> str | None:
    """The first dimension `size` ranks cannot split, or None; KV heads split evenly, or are replicated
    when the ranks are a multiple of them."""
    for dim in split_dims(arch, expert_parallel):
        n = arch[dim]
        if n % size and not (dim == "num_key_value_heads" and size % n == 0):
            return dim
    return None


def check_split(arch: Mapping[str, Any], size: int, expert_parallel: bool = False) -> None:
    """Raises naming the first dimension that `size` ranks cannot split, and the sizes that can."""
    dim = unsplit_dim(arch, size, expert_parallel)
    if dim is None:
        return
    heads = arch["num_attention_heads"]
    allowed = [d for d in range(1, heads + 1) if unsplit_dim(arch, d, expert_parallel) is None]
    sizes = f"one of {', '.join(map(str, allowed))}"
    mode = f" with parallel.expert_parallel={expert_parallel}" if experts_key(arch) else ""
    raise KnobError(
        "parallel.tensor_parallel_size", size, f"{sizes}{mode} ({dim}={arch[dim]} is not divisible)"
    )
