"""Continuous batching: prefill-first steps (chunked when over budget), decode steps with
preemption by recompute when the KV cache runs out of blocks."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from nanoexp.engine.block_manager import BlockManager
from nanoexp.engine.sequence import Sequence, Status


@dataclass
class ScheduledBatch:
    is_prefill: bool
    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    num_preemptions: int = 0

    def add(self, seq: Sequence, num_tokens: int) -> None:
        self.seqs.append(seq)
        self.num_new_tokens.append(num_tokens)

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        enable_chunked_prefill: bool,
    ):
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.enable_chunked_prefill = enable_chunked_prefill
        self.waiting: deque[Sequence] = deque()
        self.running: deque[Sequence] = deque()

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch:
        batch = self.schedule_prefill()
        return batch if batch.seqs else self.schedule_decode()

    def schedule_prefill(self) -> ScheduledBatch:
        batch, budget = ScheduledBatch(is_prefill=True), self.max_num_batched_tokens
        for seq in self.running:
            if seq.in_prefill and budget > 0:
                n = min(seq.num_uncomputed_tokens, budget)
                batch.add(seq, n)
                budget -= n
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            n = self.admit(self.waiting[0], budget)
            if n == 0:
                break
            batch.add(self.waiting.popleft(), n)
            budget -= n
        return batch

    def admit(self, seq: Sequence, budget: int) -> int:
        """Gives seq its blocks and returns how many of its tokens run now (0 = cannot admit)."""
        manager = self.block_manager
        cached = manager.cached_prefix(seq)
        remaining = len(seq) - len(cached) * manager.block_size
        if remaining > budget and not self.enable_chunked_prefill:
            return 0
        if not manager.can_allocate(seq, cached):
            return 0
        manager.allocate(seq, cached)
        if seq.num_preemptions == 0:
            seq.num_cached_tokens = seq.num_computed_tokens
        seq.status = Status.RUNNING
        self.running.append(seq)
        return min(remaining, budget)

    def schedule_decode(self, skip: frozenset[int] = frozenset()) -> ScheduledBatch:
        """One token for each running sequence (but those in `skip`), preempting if needed."""
        batch = ScheduledBatch(is_prefill=False)
        limit = min(self.max_num_seqs, self.max_num_batched_tokens)
        for seq in list(self.running):
            if len(batch.seqs) >= limit:
                break
            if seq.seq_id in skip:
                continue
            if seq.status is Status.RUNNING and self.make_room(seq, batch):
                batch.add(seq, 1)
        return batch

    def make_room(self, seq: Sequence, batch: ScheduledBatch) -> bool:
        """Grows seq by one token's block, preempting the newest unscheduled sequences if needed."""
        while not self.block_manager.grow(seq, len(seq)):
            victim = self.running[-1]
            self.preempt(victim)
            batch.num_preemptions += 1
            if victim is seq:
                return False
        return True

    def preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.block_manager.free_seq(seq)
        seq.status = Status.WAITING
        seq.num_preemptions += 1
        self.waiting.appendleft(seq)

    def abort_all(self) -> None:
        """Drops every queued or running request, returning their blocks."""
        for seq in list(self.running):
            self.finish(seq)
        self.waiting.clear()

    def finish(self, seq: Sequence) -> None:
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
            self.block_manager.free_seq(seq)
        else:  # preempted while its last token was still being sampled
            self.waiting.remove(seq)
        seq.status = Status.FINISHED
