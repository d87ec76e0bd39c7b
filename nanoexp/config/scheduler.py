"""Continuous batching limits, chunked prefill, CUDA graphs and step overlap."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from nanoexp.config.checks import KnobError, boolean, integer


@dataclass
class SchedulerConfig:
    section: ClassVar[str] = "scheduler"

    max_num_seqs: int = 256  # sequences per step
    max_num_batched_tokens: int = 16384  # tokens per step
    max_model_len: int = 4096  # prompt + output tokens of one request
    enable_chunked_prefill: bool = True  # split long prompts across steps
    enforce_eager: bool = False  # no CUDA graphs
    async_scheduling: bool | None = None  # schedule step n+1 while step n runs; None = on with one rank

    def __post_init__(self) -> None:
        integer("scheduler.max_num_seqs", self.max_num_seqs, 1)
        integer("scheduler.max_num_batched_tokens", self.max_num_batched_tokens, 1)
        integer("scheduler.max_model_len", self.max_model_len, 1)
        boolean("scheduler.enable_chunked_prefill", self.enable_chunked_prefill)
        boolean("scheduler.enforce_eager", self.enforce_eager)
        boolean("scheduler.async_scheduling", self.async_scheduling, optional=True)


def check_model_len(max_model_len: int, max_position_embeddings: int) -> None:
    """A request may not be longer than the model's positions reach."""
    if max_model_len > max_position_embeddings:
        raise KnobError(
            "scheduler.max_model_len", max_model_len,
            f"<= {max_position_embeddings} (the model's max_position_embeddings)",
        )
