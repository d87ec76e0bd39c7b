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

    def __post_init__(self) -> None:
        integer("parallel.tensor_parallel_size", self.tensor_parallel_size, 1)
        choice("parallel.all_reduce", self.all_reduce, ALL_REDUCES)
        boolean("parallel.sharded_sampling", self.sharded_sampling)


def unsplit_dim(arch: Mapping[str, Any], size: int) -> str | None:
    """The first dimension `size` ranks cannot split, or None; KV heads split evenly, or are replicated
    when the ranks are a multiple of them."""
    for dim in ("num_attention_heads", "intermediate_size", "num_key_value_heads"):
        n = arch[dim]
        if n % size and not (dim == "num_key_value_heads" and size % n == 0):
            return dim
    return None


def check_split(arch: Mapping[str, Any], size: int) -> None:
    """Raises naming the first dimension that `size` ranks cannot split, and the sizes that can."""
    dim = unsplit_dim(arch, size)
    if dim is None:
        return
    allowed = [d for d in range(1, arch["num_attention_heads"] + 1) if unsplit_dim(arch, d) is None]
    sizes = f"one of {', '.join(map(str, allowed))}"
    raise KnobError("parallel.tensor_parallel_size", size, f"{sizes} ({dim}={arch[dim]} is not divisible)")
