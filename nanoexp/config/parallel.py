"""Tensor parallelism: how many ranks, and which sizes a model can be split into."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from nanoexp.config.checks import KnobError, boolean, choice, integer

ALL_REDUCES = ("auto", "nccl", "symm_mem")


@dataclass
class ParallelConfig:
    section: ClassVar[str] = "parallel"

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


def kv_heads_fit(num_kv_heads: int, size: int) -> bool:
    """KV heads are split evenly, or replicated when the ranks are a multiple of them."""
    return num_kv_heads % size == 0 or size % num_kv_heads == 0


def fits(arch: Mapping[str, Any], size: int) -> bool:
    heads, inter = arch["num_attention_heads"], arch["intermediate_size"]
    return heads % size == 0 and inter % size == 0 and kv_heads_fit(arch["num_key_value_heads"], size)


def check_split(arch: Mapping[str, Any], size: int) -> None:
    """Raises naming the first dimension that `size` ranks cannot split, and the sizes that can."""
    if fits(arch, size):
        return
    allowed = [d for d in range(1, arch["num_attention_heads"] + 1) if fits(arch, d)]
    sizes = f"one of {', '.join(map(str, allowed))}"
    for dim in ("num_attention_heads", "intermediate_size", "num_key_value_heads"):
        n = arch[dim]
        if n % size and not (dim == "num_key_value_heads" and kv_heads_fit(n, size)):
            raise KnobError("parallel.tensor_parallel_size", size, f"{sizes} ({dim}={n} is not divisible)")
    raise KnobError("parallel.tensor_parallel_size", size, sizes)
