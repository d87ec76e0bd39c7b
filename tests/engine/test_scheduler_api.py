"""The scheduler's API (add, has_unfinished, counts, snapshots, finish, abort_all): what callers use
instead of its queues."""

from __future__ import annotations

import pytest
from helpers import StandInExecutor, stand_in_engine

from nanoexp.config import EngineConfig, SamplingParams
from nanoexp.engine.block_manager import BlockManager
from nanoexp.engine.scheduler import Scheduler
from nanoexp.engine.sequence import Sequence, Status

PARAMS = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


def make_scheduler(max_num_seqs: int = 2) -> Scheduler:
    config = EngineConfig.from_kwargs(
        "stand-in", kv_block_size=4, num_kv_blocks=16, max_num_seqs=max_num_seqs
    )
    return Scheduler(BlockManager(16, config.cache), config.scheduler, None)


def test_added_requests_wait_then_run_then_finish() -> None:
    scheduler = make_scheduler(max_num_seqs=2)
    assert not scheduler.has_unfinished() and (scheduler.num_waiting, scheduler.num_running) == (0, 0)
    seqs = [Sequence(i, [1, 2, 3, 4, 5], PARAMS) for i in range(3)]
    for seq in seqs:
        scheduler.add(seq)
    assert scheduler.has_unfinished() and scheduler.waiting_seqs() == tuple(seqs)
    assert (scheduler.num_waiting, scheduler.num_running) == (3, 0)

    batch = scheduler.schedule()
    assert batch.seqs == seqs[:2]  # max_num_seqs
    assert scheduler.running_seqs() == tuple(seqs[:2]) and scheduler.waiting_seqs() == (seqs[2],)
    assert (scheduler.num_waiting, scheduler.num_running) == (1, 2)

    scheduler.finish(seqs[0])
    assert seqs[0].status is Status.FINISHED and scheduler.running_seqs() == (seqs[1],)
    assert scheduler.has_unfinished()
    scheduler.abort_all()
    assert not scheduler.has_unfinished() and (scheduler.num_waiting, scheduler.num_running) == (0, 0)
    assert scheduler.block_manager.num_used == 0


def test_snapshots_are_copies_the_queues_do_not_follow() -> None:
    scheduler = make_scheduler()
    seq = Sequence(0, [1, 2, 3], PARAMS)
    scheduler.add(seq)
    waiting = scheduler.waiting_seqs()
    with pytest.raises(AttributeError):
        waiting.append(Sequence(1, [4], PARAMS))  # type: ignore[attr-defined]
    scheduler.schedule()
    assert waiting == (seq,) and scheduler.waiting_seqs() == () and scheduler.running_seqs() == (seq,)


def test_the_engine_queues_through_the_scheduler_and_counts_its_queues() -> None:
    engine = stand_in_engine(StandInExecutor(), max_num_seqs=1, async_scheduling=False)
    try:
        ids = [engine.add_request([1, 2, 3], PARAMS) for _ in range(2)]
        assert [s.seq_id for s in engine.scheduler.waiting_seqs()] == ids and engine.has_unfinished()
        _, stats = engine.step()
        assert (stats.num_running, stats.num_waiting) == (1, 1)
        engine.abort_all()
        assert not engine.has_unfinished() and not engine.scheduler.has_unfinished()
    finally:
        engine.close()
