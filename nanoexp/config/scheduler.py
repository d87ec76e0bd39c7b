"""Continuous batching limits, chunked prefill, CUDA graphs and step overlap."""

from __future__ import annotations

from dataclasses import dataclass

from nanoexp.config.checks import KnobError, boolean, choice, integer

BATCHING = ("mixed", "prefill_first")


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 256  # sequences per step
    max_num_batched_tokens: int = 16384  # tokens per step
    max_model_len: int | None = None  # prompt + output tokens of one request; None = the model's limit
    enable_chunked_prefill: bool = True  # split long prompts across steps
    # mixed: every step runs each running decode's token, then prefill chunks up to the token budget
    # (stall-free, as vLLM V1 and Sarathi-Serve); prefill_first: a step is all prefill or all decode
    # (nano-vLLM's rule), so each arrival stalls the running requests for one prefill step
    batching: str = "mixed"
    enforce_eager: bool = False  # no CUDA graphs
    # Schedule step n+1 while step n runs, at every TP size (Qwen3-8B on two H200s: +11% at TP=1,
    # +28% at TP=2).
    async_scheduling: bool = True

    def __post_init__(self) -> None:
        integer("scheduler.max_num_seqs", self.max_num_seqs, 1)
        integer("scheduler.max_num_batched_tokens", self.max_num_batched_tokens, 1)
        if self.max_model_len is not None:
            integer("scheduler.max_model_len", self.max_model_len, 1)
        boolean("scheduler.enable_chunked_prefill", self.enable_chunked_prefill)
        choice("scheduler.batching", self.batching, BATCHING)
        boolean("scheduler.enforce_eager", self.enforce_eager)
        boolean("scheduler.async_scheduling", self.async_scheduling)

    def model_len(self, max_position_embeddings: int) -> int:
        """The longest request: the model's limit unless set lower (longer is an error); without
        chunked prefill one step must fit a whole prompt of that length."""
        limit = max_position_embeddings if self.max_model_len is None else self.max_model_len
        if limit > max_position_embeddings:
            allowed = f"<= {max_position_embeddings} (the model's max_position_embeddings)"
            raise KnobError("scheduler.max_model_len", limit, allowed)
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < limit:
            allowed = f">= max_model_len={limit} without chunked prefill "
            allowed += "(or set scheduler.enable_chunked_prefill=true)"
            raise KnobError("scheduler.max_num_batched_tokens", self.max_num_batched_tokens, allowed)
        return limit
