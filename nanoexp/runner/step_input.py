"""The plain data between the control plane and the ranks: what rank 0 reports at start-up, and the
description of one model step that every rank receives."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class RunnerInfo:
    """What the control plane needs to know about the model and its KV cache (sent from a worker: plain)."""

    vocab_size: int
    max_model_len: int
    eos_token_ids: list[int]
    num_kv_blocks: int
    # the largest step with decodes that runs in a CUDA graph (a larger one would run eagerly); None: no cap
    max_mixed_step_tokens: int | None = None


@dataclass
class StepInput:
    has_prefill: bool
    token_ids: list[int]  # new tokens of all sequences, packed
    query_lens: list[int]
    context_lens: list[int]  # cached prefix + new tokens, per sequence
    block_tables: list[list[int]]
    sample_seq_indices: list[int]  # sequences whose last new token's logits are sampled
    # sampling settings, one entry per sampled sequence (in sample_seq_indices order)
    temperatures: list[float] = field(default_factory=list)  # 0 = greedy
    top_k: list[int] = field(default_factory=list)  # -1 = off
    top_p: list[float] = field(default_factory=list)
    min_p: list[float] = field(default_factory=list)
    seeds: list[int | None] = field(default_factory=list)  # already mixed with the output position
    # per token: the row of the previous step's samples that is this (not yet known) input token,
    # or -1 when token_ids holds it; None when every token is known
    prev_sample_rows: list[int] | None = None
    # a prefill step's leading sequences that are one-token decodes (a mixed step: they attend
    # through the decode kernel, the rest through the prefill kernel)
    num_decodes: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


def blockless_prefill(sequences: list[list[int]]) -> StepInput:
    """A prefill of whole sequences without cache blocks (nothing stored), each one's last token sampled."""
    lens = [len(s) for s in sequences]
    return StepInput(
        True,
        [t for s in sequences for t in s],
        lens,
        lens,
        [[] for _ in sequences],
        list(range(len(sequences))),
    )


class SampledTokens(list):
    """One step's sampled ids (a list), and the tokens its MoE layers routed to each expert
    (`expert_load` [moe layers, experts], None for a dense model or with the count off)."""

    expert_load: np.ndarray | None = None

    @classmethod
    def of(cls, ids: list[int], expert_load: np.ndarray | None) -> SampledTokens:
        out = cls(ids)
        out.expert_load = expert_load
        return out
