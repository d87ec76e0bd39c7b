"""Random workloads through the real scheduler and block manager, with a fake model whose paged
KV cache records (token, position) per slot: outputs depend on every cached token, so a wrong
block, a stale prefix hit or a lost token changes them."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nanoexp.config import EngineConfig, SamplingParams
from nanoexp.engine.llm_engine import LLMEngine
from nanoexp.runner.step_input import RunnerInfo, StepInput

VOCAB = 50


class RecordingExecutor:
    """Stores (token, position) at each slot; samples a hash of the context read back."""

    closed = False

    def __init__(self, num_blocks: int, block_size: int, max_model_len: int):
        self.block_size = block_size
        self.slots: dict[int, tuple[int, int]] = {}
        self.info = RunnerInfo(
            vocab_size=VOCAB, max_model_len=max_model_len, eos_token_ids=[VOCAB - 1], num_kv_blocks=num_blocks
        )
        self.steps: list[StepInput] = []
        self.last_sampled: list[int] = []
        self.pending: list[list[int]] = []

    def run(self, step: StepInput) -> list[int]:
        self.steps.append(step)
        tokens = iter(step.token_ids)
        contexts = []
        for n, ctx, table in zip(step.query_lens, step.context_lens, step.block_tables, strict=True):
            assert len(table) * self.block_size >= ctx
            for pos in range(ctx - n, ctx):
                self.slots[self.slot(table, pos)] = (next(tokens), pos)
            contexts.append(self.read(table, ctx))
        return [hash(tuple(contexts[i])) % VOCAB for i in step.sample_seq_indices]

    def launch(self, step: StepInput) -> None:
        """Overlapped mode: inputs still unknown on the host come from the previous launch's samples;
        results are collected first in, first out."""
        if step.prev_sample_rows is not None:
            for index, row in enumerate(step.prev_sample_rows):
                if row >= 0:
                    step.token_ids[index] = self.last_sampled[row]
        self.last_sampled = self.run(step)
        self.pending.append(self.last_sampled)

    def collect(self) -> list[int]:
        return self.pending.pop(0)

    def slot(self, table, pos):
        return table[pos // self.block_size] * self.block_size + pos % self.block_size

    def read(self, table, ctx) -> list[int]:
        out = []
        for pos in range(ctx):
            token, stored_pos = self.slots[self.slot(table, pos)]
            assert stored_pos == pos
            out.append(token)
        return out

    def stats(self):
        return {}

    def close(self):
        pass


def make_engine(
    num_blocks,
    block_size,
    max_num_seqs,
    budget,
    chunked,
    prefix,
    max_model_len=512,
    overlap=False,
    batching="mixed",
):
    config = EngineConfig.from_kwargs(
        "fake",
        kv_block_size=block_size,
        num_kv_blocks=num_blocks,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        enable_chunked_prefill=chunked,
        enable_prefix_caching=prefix,
        max_model_len=max_model_len,
        async_scheduling=overlap,
        batching=batching,
    )
    return LLMEngine(config, RecordingExecutor(num_blocks, block_size, max_model_len))


def workload(seed: int, n: int, max_prompt: int, max_out: int):
    rng = random.Random(seed)
    prefixes = [[rng.randrange(VOCAB - 1) for _ in range(rng.randrange(1, max_prompt))] for _ in range(3)]
    requests = []
    for _ in range(n):
        prompt = list(rng.choice(prefixes))[: rng.randrange(1, max_prompt)]
        prompt += [rng.randrange(VOCAB - 1) for _ in range(rng.randrange(0, 8))]
        ignore_eos = rng.random() < 0.7
        params = SamplingParams(temperature=0, max_tokens=rng.randrange(1, max_out), ignore_eos=ignore_eos)
        requests.append((prompt, params, rng.randrange(0, 6)))  # arrives after that many steps
    return requests


def check_invariants(engine: LLMEngine) -> None:
    manager = engine.block_manager
    held: dict[int, int] = {}
    for seq in engine.scheduler.running_seqs():
        for block_id in seq.block_table:
            held[block_id] = held.get(block_id, 0) + 1
    for block_id, ref_count in enumerate(manager.ref_counts):
        assert ref_count >= 0
        assert ref_count == held.get(block_id, 0)
        assert (ref_count == 0) == (block_id in manager.free)
    for seq in engine.scheduler.waiting_seqs():
        assert not seq.block_table


def check_step_shape(step: StepInput | None, stats, engine: LLMEngine) -> None:
    """Decodes come first and carry one token each; prefill_first never mixes the two."""
    if step is None or stats.num_tokens == 0:
        return
    assert all(n == 1 for n in step.query_lens[: step.num_decodes])
    if not engine.scheduler.mixed:
        assert stats.phase != "mixed"


def run(engine: LLMEngine, requests) -> dict[int, list[int]]:
    pending = sorted(enumerate(requests), key=lambda item: item[1][2])
    outputs, step_no, ids = {}, 0, {}
    while pending or engine.has_unfinished():
        while pending and pending[0][1][2] <= step_no:
            index, (prompt, params, _) = pending.pop(0)
            ids[engine.add_request(prompt, params)] = index
        finished, stats = engine.step()
        step_no += 1
        assert step_no < 10_000, "no progress"
        assert stats.num_seqs <= engine.config.scheduler.max_num_seqs
        assert stats.num_tokens <= engine.config.scheduler.max_num_batched_tokens
        assert stats.num_decode_tokens + stats.num_prefill_tokens == stats.num_tokens
        check_step_shape(engine.executor.steps[-1] if engine.executor.steps else None, stats, engine)
        check_invariants(engine)
        for out in finished:
            outputs[ids[out.request_id]] = out.token_ids
    assert engine.block_manager.num_used == 0
    return outputs


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10**6),
    block_size=st.sampled_from([1, 2, 4, 8, 16]),
    spare_blocks=st.integers(0, 40),
    max_num_seqs=st.integers(1, 8),
    budget=st.integers(1, 96),
    chunked=st.booleans(),
    prefix=st.booleans(),
    overlap=st.booleans(),
    batching=st.sampled_from(["mixed", "prefill_first"]),
)
def test_random_workloads_finish_without_leaks_and_match_a_roomy_engine(
    seed, block_size, spare_blocks, max_num_seqs, budget, chunked, prefix, overlap, batching
):
    requests = workload(seed, n=10, max_prompt=48, max_out=24)
    longest = max(len(p) + sp.max_tokens for p, sp, _ in requests)
    if not chunked:
        budget = max(budget, longest)
    num_blocks = -(-longest // block_size) + spare_blocks
    max_model_len = 512 if chunked else budget
    engine = make_engine(
        num_blocks, block_size, max_num_seqs, budget, chunked, prefix, max_model_len, overlap, batching
    )
    got = run(engine, requests)
    reference = run(make_engine(4096, 16, 64, 4096, True, False, batching="prefill_first"), requests)
    assert got == reference
    assert len(got) == len(requests)


def test_preemption_and_prefix_hits_happen_in_a_tight_cache():
    requests = workload(1, n=12, max_prompt=40, max_out=30)
    engine = make_engine(num_blocks=20, block_size=4, max_num_seqs=8, budget=32, chunked=True, prefix=True)
    preemptions = hits = 0
    pending = list(requests)
    for prompt, params, _ in pending:
        engine.add_request(prompt, params)
    while engine.has_unfinished():
        _, stats = engine.step()
        preemptions += stats.num_preemptions
        hits += stats.prefix_cache_hits
        check_invariants(engine)
    assert preemptions > 0 and hits > 0
    assert engine.block_manager.num_used == 0


@pytest.mark.parametrize("batching", ["mixed", "prefill_first"])
def test_overlapped_steps_match_synchronous_ones_under_pressure(batching):
    requests = workload(2, n=16, max_prompt=40, max_out=40)
    outputs, engines = {}, {}
    for overlap in (False, True):
        engines[overlap] = make_engine(
            num_blocks=24,
            block_size=4,
            max_num_seqs=6,
            budget=24,
            chunked=True,
            prefix=True,
            overlap=overlap,
            batching=batching,
        )
        outputs[overlap] = run(engines[overlap], requests)
    assert outputs[True] == outputs[False]
    assert sum(s.prev_sample_rows is not None for s in engines[True].executor.steps) >= 10


def test_mixed_steps_carry_every_running_decode_beside_prefill_chunks():
    requests = workload(3, n=16, max_prompt=40, max_out=30)
    engine = make_engine(num_blocks=400, block_size=4, max_num_seqs=8, budget=24, chunked=True, prefix=False)
    scheduler, schedule = engine.scheduler, engine.scheduler.schedule

    def checked_schedule(skip=frozenset()):
        batch = schedule(skip)
        scheduled = {seq.seq_id for seq in batch.seqs}
        for seq in scheduler.running_seqs():  # no running decode waits for a prefill
            assert seq.seq_id in scheduled or seq.in_prefill or seq.seq_id in skip
        assert all(n == 1 for n in batch.num_new_tokens[: batch.num_decodes])
        assert all(not seq.in_prefill for seq in batch.seqs[: batch.num_decodes])
        return batch

    scheduler.schedule = checked_schedule
    run(engine, requests)
    mixed = [s for s in engine.executor.steps if s.has_prefill and s.num_decodes]
    assert len(mixed) >= 5


def test_steps_with_decodes_stay_within_the_runners_graph_size():
    requests = workload(4, n=16, max_prompt=40, max_out=20)
    engine = make_engine(num_blocks=400, block_size=4, max_num_seqs=8, budget=48, chunked=True, prefix=False)
    engine.executor.info = dataclasses.replace(engine.executor.info, max_mixed_step_tokens=12)
    capped = LLMEngine(engine.config, engine.executor)
    run(capped, requests)
    steps = capped.executor.steps
    assert all(sum(s.query_lens) <= 12 for s in steps if s.num_decodes or not s.has_prefill)
    assert any(sum(s.query_lens) > 12 for s in steps if s.has_prefill and not s.num_decodes)
