"""Drives a workload through an engine (ours or a baseline) and records what happened, step by step."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from nanoexp.engine.outputs import RequestOutput, StepStats
from nanoexp.experiment.progress import Progress
from nanoexp.experiment.workloads import Request, Workload

OnStep = Callable[[StepStats], None]


class Driver(Protocol):
    """Submits requests at their arrival offsets from t0 and returns their outputs when all finish."""

    def drive(self, requests: Sequence[Request], t0: float, on_step: OnStep) -> list[RequestOutput]: ...

    def reset_prefix_cache(self) -> None:
        """Starts the next timed pass cold: nothing an earlier pass cached is reused."""


class EngineDriver:
    """Our engine: submit each request when it is due (and, with `max_concurrency`, a slot is free),
    stamped with its scheduled arrival time; call `engine.step()` until done."""

    def __init__(self, engine, max_concurrency: int | None = None):
        self.engine = engine
        self.max_concurrency = max_concurrency or math.inf

    def reset_prefix_cache(self) -> None:
        self.engine.reset_prefix_cache()

    def drive(self, requests: Sequence[Request], t0: float, on_step: OnStep) -> list[RequestOutput]:
        pending, outputs, submitted = list(requests), [], 0
        while pending or self.engine.has_unfinished():
            due = self._submit_due(pending, t0, self.max_concurrency - (submitted - len(outputs)))
            pending, submitted = pending[due:], submitted + due
            if not self.engine.has_unfinished():
                _sleep_until(t0 + pending[0].arrival_offset_s)
                continue
            finished, stats = self.engine.step()
            outputs += finished
            on_step(stats)
        return outputs

    def _submit_due(self, pending: list[Request], t0: float, free: float) -> int:
        """Submits the requests whose arrival time has come, at most `free`; returns how many. A
        request's arrival is its scheduled time, so the step in progress when it fell due (and a wait
        for a slot) counts in its TTFT."""
        now, count = time.perf_counter() - t0, 0
        while count < min(free, len(pending)) and pending[count].arrival_offset_s <= now:
            r = pending[count]
            self.engine.add_request(list(r.prompt_token_ids), r.sampling_params, t0 + r.arrival_offset_s)
            count += 1
        return count


@dataclass
class RunRecord:
    """One timed pass of the workload (one repeat)."""

    repeat: int = 0
    outputs: list[RequestOutput] = field(default_factory=list)
    steps: list[StepStats] = field(default_factory=list)
    t0: float = 0.0
    duration_s: float = 0.0
    iteration_latencies_s: list[float] = field(default_factory=list)
    facts: dict = field(default_factory=dict)  # what else was measured: machine load, profile counts


Emit = Callable[[int, StepStats, float, int], None]  # (step index, stats, seconds into the repeat, repeat)


class StepLog:
    """Collects StepStats of the current repeat (only while recording), numbers the steps across
    repeats and feeds the progress line. Steps reach `emit` (the loggers: W&B, the local sink) only
    at `flush()`, after the timed pass: logging a step costs the host 0.2-2 ms (W&B offline on
    2 CPU cores, experiments/tools/host_step.py), and inside the loop it would delay the
    next step's launch and show up in the measured step times."""

    def __init__(self, emit: Emit, progress: Progress | None = None):
        self.emit, self.progress = emit, progress
        self.record, self.recording, self.index = RunRecord(), True, 0
        self.unsent: list[tuple[int, StepStats, float, int]] = []

    def __call__(self, stats: StepStats) -> None:
        if self.progress is not None:
            self.progress.update(stats, counted=self.recording)
        if self.recording:
            self.record.steps.append(stats)
            self.unsent.append((self.index, stats, time.perf_counter() - self.record.t0, self.record.repeat))
            self.index += 1

    def flush(self) -> None:
        """Sends the recorded steps to `emit`, in order."""
        unsent, self.unsent = self.unsent, []
        for step in unsent:
            self.emit(*step)


def run(driver: Driver, workload: Workload, log: StepLog, repeat: int = 0, warm_up: bool = True) -> RunRecord:
    """One timed pass: offline/online, or in latency mode (after the warm-up iterations when
    `warm_up`) `num_iters` timed iterations of one batch."""
    record = log.record = RunRecord(repeat)
    if not workload.latency_mode:
        record.t0 = time.perf_counter()
        record.outputs = sorted(driver.drive(workload.requests, record.t0, log), key=_order)
        record.duration_s = time.perf_counter() - record.t0
        return record
    log.recording = False
    for _ in range(workload.num_iters_warmup if warm_up else 0):
        driver.drive(workload.requests, time.perf_counter(), log)
    log.recording = True
    record.t0 = time.perf_counter()
    for _ in range(workload.num_iters):
        start = time.perf_counter()
        record.outputs += driver.drive(workload.requests, start, log)
        record.iteration_latencies_s.append(time.perf_counter() - start)
    record.duration_s = time.perf_counter() - record.t0
    return record


def _order(o: RequestOutput) -> int:
    return o.request_id


def _sleep_until(t: float) -> None:
    if not math.isfinite(t):  # nan never arrives and inf never comes: the loop would spin forever
        raise ValueError(f"a request's arrival time is {t}; arrival offsets must be finite seconds")
    time.sleep(max(0.0, t - time.perf_counter()))
