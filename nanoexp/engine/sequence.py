"""One request's tokens, cache state and timings as the scheduler sees it."""

from __future__ import annotations

import time
from enum import Enum, auto

from nanoexp.config import SamplingParams

PLACEHOLDER = -1  # a sampled token that the host has not read yet


class Status(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


class Sequence:
    def __init__(self, seq_id: int, prompt: list[int], params: SamplingParams, arrival: float | None = None):
        self.seq_id = seq_id
        self.status = Status.WAITING
        self.token_ids = list(prompt)
        self.num_prompt_tokens = len(prompt)
        self.params = params
        self.num_computed_tokens = 0  # tokens whose K/V is in the cache
        self.num_cached_tokens = 0  # prompt tokens served by the prefix cache at first admission
        self.block_table: list[int] = []
        self.block_hashes: list[int] = []  # chained hashes of the full blocks published so far
        self.num_preemptions = 0
        self.finish_reason = ""
        self.error = ""  # why it ended with finish_reason "error"
        self.arrival_time = time.perf_counter() if arrival is None else arrival
        self.first_scheduled_time = 0.0
        self.token_times: list[float] = []
        self.finish_time = 0.0

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def in_prefill(self) -> bool:
        """A running sequence whose prompt (or recompute after preemption) is only partly done."""
        return self.num_uncomputed_tokens > 1
