"""Per-step records reach the loggers after each repeat, never inside it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from nanoexp.engine.outputs import StepStats
from nanoexp.experiment.measure.driver import Progress, StepLog, run
from nanoexp.experiment.measure.repeats import measure


def stats(num_seqs: int) -> StepStats:
    return StepStats("decode", num_seqs, num_seqs, num_seqs, 0.001, 1, 10, 0, 0, 0, num_seqs, 0)


class RecordingLogger:
    def __init__(self):
        self.rows = []

    def log_step(self, step: int, row: dict) -> None:
        self.rows.append((step, row["repeat"], row["num_seqs"]))


class StepsThenMaybeFail:
    """Drives `steps` engine steps per pass, checking that nothing was logged meanwhile; the pass
    numbered `fail_at` raises after its steps."""

    def __init__(self, logger: RecordingLogger, steps: int, fail_at: int | None = None):
        self.logger, self.steps, self.fail_at, self.passes = logger, steps, fail_at, 0

    def reset_prefix_cache(self) -> None:
        pass

    def drive(self, requests, t0, on_step):
        logged_before = len(self.logger.rows)
        for i in range(self.steps):
            on_step(stats(i + 1))
            assert len(self.logger.rows) == logged_before, "a step was logged inside the timed pass"
        self.passes += 1
        if self.passes - 1 == self.fail_at:
            raise RuntimeError("engine failed")
        return []


def workload():
    return SimpleNamespace(latency_mode=False, requests=[])


def test_step_log_sends_nothing_until_flushed():
    sent = []
    log = StepLog(lambda i, s, t, r: sent.append((i, s.num_seqs, t, r)))
    for n in (3, 2, 1):
        log(stats(n))
    assert sent == []
    log.flush()
    assert [(i, n, r) for i, n, _, r in sent] == [(0, 3, 0), (1, 2, 0), (2, 1, 0)]
    assert sent[0][2] <= sent[1][2] <= sent[2][2]  # seconds into the pass, taken at each step
    log.flush()
    assert len(sent) == 3


def test_measure_logs_each_pass_after_it_and_a_failed_pass_too():
    logger = RecordingLogger()
    driver = StepsThenMaybeFail(logger, steps=2, fail_at=1)
    with pytest.raises(RuntimeError, match="engine failed"):
        measure(driver, [workload(), workload(), workload()], logger, Progress(6, enabled=False))
    assert logger.rows == [(0, 0, 1), (1, 0, 2), (2, 1, 1), (3, 1, 2)]


class CacheTracking:
    """Records, per drive, whether the prefix cache was emptied since the last one."""

    def __init__(self):
        self.cold, self.reset = [], False

    def reset_prefix_cache(self) -> None:
        self.reset = True

    def drive(self, requests, t0, on_step):
        self.cold.append(self.reset)
        self.reset = False
        return []


def test_latency_iterations_each_prefill_their_batch_cold():
    """The same batch run again must not find its prompts cached: its TTFT would be a cache hit's."""
    driver = CacheTracking()
    latency = SimpleNamespace(latency_mode=True, requests=[], num_iters=3, num_iters_warmup=2)
    run(driver, latency, StepLog(lambda *a: None))
    assert driver.cold == [True] * 5
