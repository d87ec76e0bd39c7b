"""The plain-data description of one model step that rank 0 sends to every rank."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SamplingRow:
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    seed: int | None  # already mixed with the row's output position


@dataclass
class StepInput:
    is_prefill: bool
    token_ids: list[int]  # new tokens of all sequences, packed
    query_lens: list[int]
    context_lens: list[int]  # cached prefix + new tokens, per sequence
    block_tables: list[list[int]]
    sample_seq_indices: list[int]  # sequences whose last new token's logits are sampled
    sampling: list[SamplingRow]
    # per sequence: the row of the previous step's samples that is its (not yet known) input token,
    # or -1 when token_ids holds it; None when every token is known
    prev_sample_rows: list[int] | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)
