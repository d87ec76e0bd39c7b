"""Continuous batching under one token budget per step, with preemption by recompute when the KV
cache runs out of blocks. Two policies: `mixed` (each step runs every running decode's token
first, then prefill chunks in the budget left) and `prefill_first` (a step is all prefill, chunked
when over budget, or all decode)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from nanoexp.config import SchedulerConfig
from nanoexp.engine.block_manager import BlockManager
from nanoexp.engine.sequence import PLACEHOLDER, Sequence, Status
from nanoexp.runner.step_input import StepInput


@dataclass
class ScheduledBatch:
    """The sequences of one step: `num_decodes` one-token decodes first, then prefill chunks.
    has_prefill: the step has prefill chunks (a mixed step when it also has decodes)."""

    has_prefill: bool
    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    num_preemptions: int = 0
    num_decodes: int = 0
    prefix_cache_queries: int = 0  # prompt tokens of the admitted requests looked up in the prefix cache
    prefix_cache_hits: int = 0  # of which served from the cache

    def add(self, seq: Sequence, num_tokens: int) -> None:
        self.seqs.append(seq)
        self.num_new_tokens.append(num_tokens)

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)

    def step_input(self, prev_rows: dict[int, int] | None = None) -> StepInput:
        """The step's plain-data description. A placeholder input token (a sample not read yet) is taken on
        the device from row prev_rows[seq_id] of the previous step's samples."""
        num_decodes = self.num_decodes if self.has_prefill else 0
        step = StepInput(self.has_prefill, [], [], [], [], [], num_decodes=num_decodes)
        token_ids = step.token_ids
        placeholders: list[tuple[int, int]] = []  # (token index, row of the previous step's samples)
        for i, (seq, n) in enumerate(zip(self.seqs, self.num_new_tokens)):
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + n
            token_ids += seq.token_ids[start:end]
            if token_ids[-1] == PLACEHOLDER:
                assert prev_rows is not None, "a placeholder input needs the previous step's rows"
                token_ids[-1] = 0
                placeholders.append((len(token_ids) - 1, prev_rows[seq.seq_id]))
            step.query_lens.append(n)
            step.context_lens.append(end)
            step.block_tables.append(seq.block_table)
            if end == len(seq):
                params = seq.params
                step.sample_seq_indices.append(i)
                step.temperatures.append(params.temperature)
                step.top_k.append(params.top_k)
                step.top_p.append(params.top_p)
                step.min_p.append(params.min_p)
                # the seed mixed with the output position: each position draws differently yet reproducibly
                seed = params.seed
                step.seeds.append(None if seed is None else (seed * 1000003 + seq.num_output_tokens) % 2**63)
        if placeholders:
            step.prev_sample_rows = [-1] * len(token_ids)
            for index, row in placeholders:
                step.prev_sample_rows[index] = row
        return step


class Scheduler:
    def __init__(
        self, block_manager: BlockManager, config: SchedulerConfig, max_mixed_step_tokens: int | None
    ):
        """max_mixed_step_tokens caps a step that carries decodes (the largest the runner runs in a CUDA
        graph): a larger one would run eagerly, each new shape compiling kernels while requests wait."""
        self.block_manager = block_manager
        self.mixed = config.batching == "mixed"
        self.max_num_seqs, budget = config.max_num_seqs, config.max_num_batched_tokens
        self.max_num_batched_tokens = budget
        self.max_mixed_step_tokens = min(budget, max_mixed_step_tokens or budget)
        self.enable_chunked_prefill = config.enable_chunked_prefill
        self._waiting: deque[Sequence] = deque()  # the scheduler's own: others go through the methods below
        self._running: deque[Sequence] = deque()

    def add(self, seq: Sequence) -> None:
        """Queues a new request behind the waiting ones."""
        self._waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self._waiting or self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._running)

    def waiting_seqs(self) -> tuple[Sequence, ...]:
        """The queued (or preempted) sequences, next to admit first; a copy."""
        return tuple(self._waiting)

    def running_seqs(self) -> tuple[Sequence, ...]:
        """The admitted sequences, oldest first; a copy."""
        return tuple(self._running)

    def schedule(self, skip: frozenset[int] = frozenset()) -> ScheduledBatch:
        """The next step; sequences in `skip` (ended by a token not read yet) get no decode. Mixed: every
        running decode's token first (vLLM V1's rule), then prefill chunks in the rest of the budget, so an
        arrival never stalls the running requests; prefill_first: prefill chunks if any, else decodes."""
        if not self.mixed:
            batch = ScheduledBatch(has_prefill=True)
            self.fill_prefill(batch, self.max_num_batched_tokens)
            return batch if batch.seqs else self.schedule_decode(skip)
        batch = self.schedule_decode(skip)
        budget = self.max_mixed_step_tokens if batch.seqs else self.max_num_batched_tokens
        self.fill_prefill(batch, max(0, budget - batch.num_tokens))
        batch.has_prefill = len(batch.seqs) > batch.num_decodes
        return batch

    def fill_prefill(self, batch: ScheduledBatch, budget: int) -> None:
        """Adds chunks of the running prefills, then admits waiting requests, within `budget`."""
        for seq in self._running:
            if seq.in_prefill and budget > 0:
                n = min(seq.num_uncomputed_tokens, budget)
                batch.add(seq, n)
                budget -= n
        while self._waiting and budget > 0 and len(self._running) < self.max_num_seqs:
            n = self.admit(self._waiting[0], budget, batch)
            if n == 0:
                break
            batch.add(self._waiting.popleft(), n)
            budget -= n

    def admit(self, seq: Sequence, budget: int, batch: ScheduledBatch) -> int:
        """Gives seq its blocks and returns how many of its tokens run now (0 = cannot admit)."""
        manager = self.block_manager
        cached = manager.cached_prefix(seq)
        remaining = len(seq) - len(cached) * manager.block_size
        if (remaining > budget and not self.enable_chunked_prefill) or not manager.can_allocate(seq, cached):
            return 0
        manager.allocate(seq, cached)
        batch.prefix_cache_queries += len(seq)
        batch.prefix_cache_hits += seq.num_computed_tokens
        if seq.num_preemptions == 0:
            seq.num_cached_tokens = seq.num_computed_tokens
        seq.status = Status.RUNNING
        self._running.append(seq)
        return min(remaining, budget)

    def schedule_decode(self, skip: frozenset[int] = frozenset()) -> ScheduledBatch:
        """One token for each running sequence (but those in `skip`), preempting if needed."""
        batch = ScheduledBatch(has_prefill=False)
        limit = min(self.max_num_seqs, self.max_num_batched_tokens)
        for seq in list(self._running):
            if len(batch.seqs) >= limit:
                break
            if seq.seq_id in skip:
                continue
            if seq.status is Status.RUNNING and not seq.in_prefill and self.make_room(seq, batch):
                batch.add(seq, 1)
        batch.num_decodes = len(batch.seqs)
        return batch

    def make_room(self, seq: Sequence, batch: ScheduledBatch) -> bool:
        """Grows seq by one token's block, preempting the newest unscheduled sequences if needed."""
        while not self.block_manager.grow(seq, len(seq)):
            victim = self._running.pop()
            self.block_manager.free_seq(victim)
            victim.status = Status.WAITING
            victim.num_preemptions += 1
            self._waiting.appendleft(victim)
            batch.num_preemptions += 1
            if victim is seq:
                return False
        return True

    def abort_all(self) -> None:
        """Drops every queued or running request, returning their blocks."""
        for seq in list(self._running):
            self.finish(seq)
        self._waiting.clear()

    def finish(self, seq: Sequence) -> None:
        if seq.status is Status.RUNNING:
            self._running.remove(seq)
            self.block_manager.free_seq(seq)
        else:  # preempted while its last token was still being sampled
            self._waiting.remove(seq)
        seq.status = Status.FINISHED
