"""The control plane: requests in, scheduled steps through the executor, finished outputs out."""

from __future__ import annotations

import itertools
import time

from nanoexp.engine.block_manager import BlockManager
from nanoexp.engine.config import EngineConfig
from nanoexp.engine.outputs import RequestOutput, StepStats
from nanoexp.engine.scheduler import ScheduledBatch, Scheduler
from nanoexp.engine.sequence import Sequence
from nanoexp.runner.executor import make_executor
from nanoexp.runner.step_input import SamplingRow, StepInput
from nanoexp.sampling_params import SamplingParams


class LLMEngine:
    def __init__(self, config: EngineConfig, executor=None):
        self.config = config
        self.executor = executor or make_executor(config)
        info = self.executor.info
        self.vocab_size = info["vocab_size"]
        self.max_model_len = info["max_model_len"]
        self.eos_token_ids = set(info["eos_token_ids"])
        self.block_manager = BlockManager(
            info["num_kv_blocks"], config.kvcache_block_size, config.enable_prefix_caching
        )
        self.scheduler = Scheduler(
            self.block_manager, config.max_num_seqs, config.max_num_batched_tokens,
            config.enable_chunked_prefill,
        )
        self.ids = itertools.count()

    def add_request(
        self, prompt_token_ids: list[int], params: SamplingParams, arrival_time: float | None = None
    ) -> int:
        """Queues one request; raises ValueError (and queues nothing) if it can never run."""
        seq_id = next(self.ids)
        self.check_request(seq_id, list(prompt_token_ids), params)
        self.scheduler.add(Sequence(seq_id, prompt_token_ids, params, arrival_time))
        return seq_id

    def check_request(self, seq_id: int, prompt: list[int], params: SamplingParams) -> None:
        if not isinstance(params, SamplingParams):
            raise TypeError(f"request {seq_id}: sampling_params must be a SamplingParams")
        if not prompt:
            raise ValueError(f"request {seq_id}: the prompt is empty")
        bad = [t for t in prompt if not (isinstance(t, int) and 0 <= t < self.vocab_size)]
        if bad:
            raise ValueError(
                f"request {seq_id}: token id {bad[0]!r} is outside the vocabulary [0, {self.vocab_size})"
            )
        total = len(prompt) + params.max_tokens
        if total > self.max_model_len:
            raise ValueError(
                f"request {seq_id}: prompt ({len(prompt)} tokens) + max_tokens ({params.max_tokens}) "
                f"= {total} exceeds max_model_len={self.max_model_len}"
            )
        capacity = self.block_manager.num_blocks * self.block_manager.block_size
        if total > capacity:
            raise ValueError(
                f"request {seq_id}: prompt + max_tokens = {total} tokens exceeds the whole KV cache "
                f"({capacity} tokens); raise num_kvcache_blocks or the memory budget"
            )

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> tuple[list[RequestOutput], StepStats]:
        start = time.perf_counter()
        queries, hits = self.block_manager.queries, self.block_manager.hits
        batch = self.scheduler.schedule()
        sampled = self.executor.run(step_input_from(batch)) if batch.seqs else []
        now = time.perf_counter()
        finished = self.postprocess(batch, sampled, start, now)
        return finished, self.step_stats(batch, finished, now - start, queries, hits, len(sampled))

    def postprocess(
        self, batch: ScheduledBatch, sampled: list[int], scheduled_at: float, now: float
    ) -> list[RequestOutput]:
        tokens = iter(sampled)
        finished = []
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            seq.num_computed_tokens += n
            self.block_manager.register_full_blocks(seq)
            seq.first_scheduled_time = seq.first_scheduled_time or scheduled_at
            if seq.num_computed_tokens < len(seq):
                continue
            seq.token_ids.append(next(tokens))
            seq.token_times.append(now)
            reason = self.finish_reason(seq)
            if reason:
                seq.finish_reason, seq.finish_time = reason, now
                self.scheduler.finish(seq)
                finished.append(self.output_of(seq))
        return finished

    def finish_reason(self, seq: Sequence) -> str:
        last = seq.token_ids[-1]
        if last in seq.params.stop_token_ids or (not seq.params.ignore_eos and last in self.eos_token_ids):
            return "stop"
        if seq.num_output_tokens >= seq.params.max_tokens or len(seq) >= self.max_model_len:
            return "length"
        return ""

    def output_of(self, seq: Sequence) -> RequestOutput:
        return RequestOutput(
            request_id=seq.seq_id,
            prompt_token_ids=seq.token_ids[: seq.num_prompt_tokens],
            token_ids=seq.output_token_ids,
            finish_reason=seq.finish_reason,
            arrival_time=seq.arrival_time,
            first_scheduled_time=seq.first_scheduled_time,
            first_token_time=seq.token_times[0],
            token_times=list(seq.token_times),
            finish_time=seq.finish_time,
            num_cached_tokens=seq.num_cached_tokens,
            num_preemptions=seq.num_preemptions,
        )

    def step_stats(self, batch, finished, elapsed, queries, hits, num_sampled) -> StepStats:
        return StepStats(
            phase="prefill" if batch.is_prefill else "decode",
            num_seqs=len(batch.seqs),
            num_tokens=batch.num_tokens,
            num_output_tokens=num_sampled,
            step_time_s=elapsed,
            kv_blocks_used=self.block_manager.num_used,
            kv_blocks_total=self.block_manager.num_blocks,
            prefix_cache_queries=self.block_manager.queries - queries,
            prefix_cache_hits=self.block_manager.hits - hits,
            num_preemptions=batch.num_preemptions,
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            num_finished=len(finished),
        )

    def stats(self) -> dict:
        return self.executor.stats()

    def close(self) -> None:
        self.executor.close()


def step_input_from(batch: ScheduledBatch) -> StepInput:
    token_ids, query_lens, context_lens, tables, sample_idx, sampling = [], [], [], [], [], []
    for i, (seq, n) in enumerate(zip(batch.seqs, batch.num_new_tokens)):
        start, end = seq.num_computed_tokens, seq.num_computed_tokens + n
        token_ids.extend(seq.token_ids[start:end])
        query_lens.append(n)
        context_lens.append(end)
        tables.append(seq.block_table)
        if end == len(seq):
            sample_idx.append(i)
            sampling.append(sampling_row(seq.params, seq.num_output_tokens))
    return StepInput(batch.is_prefill, token_ids, query_lens, context_lens, tables, sample_idx, sampling)


def sampling_row(params: SamplingParams, output_position: int) -> SamplingRow:
    seed = None
    if params.seed is not None:
        seed = (params.seed * 1_000_003 + output_position) % (2**63)
    return SamplingRow(params.temperature, params.top_k, params.top_p, params.min_p, seed)
