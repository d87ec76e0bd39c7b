"""What the engine hands back: finished requests and per-step statistics."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class RequestOutput:
    """One finished request. Supports `out["text"]` and `out["token_ids"]` like nano-vLLM."""

    request_id: int
    prompt_token_ids: list[int]
    token_ids: list[int]
    finish_reason: str  # "stop" (eos or stop token), "length", or "error" (then `error` says why)
    arrival_time: float
    first_scheduled_time: float
    first_token_time: float
    token_times: list[float]
    finish_time: float
    num_cached_tokens: int
    num_preemptions: int
    text: str = ""
    error: str = ""  # with finish_reason "error": what went wrong, e.g. non-finite logits at a step

    def __getitem__(self, key: str):
        return getattr(self, key)

    @property
    def ttft(self) -> float:
        return self.first_token_time - self.arrival_time

    @property
    def e2e_latency(self) -> float:
        return self.finish_time - self.arrival_time

    @property
    def inter_token_latencies(self) -> list[float]:
        return [b - a for a, b in zip(self.token_times, self.token_times[1:])]

    @property
    def tpot(self) -> float:
        """Mean time per output token after the first (0 for one-token outputs)."""
        n = len(self.token_times)
        return (self.token_times[-1] - self.token_times[0]) / (n - 1) if n > 1 else 0.0


@dataclass
class StepStats:
    """What one `LLMEngine.step()` did."""

    phase: str  # "prefill", "decode" or "mixed" (decodes and prefill chunks in one step)
    num_seqs: int
    num_tokens: int  # tokens run through the model
    num_output_tokens: int  # tokens sampled
    step_time_s: float
    kv_blocks_used: int
    num_kv_blocks: int
    prefix_cache_queries: int  # prompt tokens looked up in the prefix cache this step
    prefix_cache_hits: int  # of which served from the cache
    num_preemptions: int
    num_running: int
    num_waiting: int
    num_finished: int = 0
    num_decode_tokens: int = 0  # of num_tokens: one-token decodes
    num_prefill_tokens: int = 0  # of num_tokens: prompt (or recompute) chunks
    # MoE models (engine.expert_load_stats): tokens routed to the busiest expert and the mean per expert,
    # in the layer where their ratio is highest; with expert parallelism the busiest rank's share of a
    # layer's routed tokens (worst layer); `expert_load` holds the step's [moe layers, experts] counts
    expert_load_max: int | None = None
    expert_load_mean: float | None = None
    expert_load_rank_share_max: float | None = None
    expert_load: np.ndarray | None = field(default=None, repr=False)
