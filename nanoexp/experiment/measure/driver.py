"""Drives a workload through an engine (ours or a baseline) and records what happened, step by step."""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol, TextIO

from tqdm import tqdm

from nanoexp.engine.outputs import RequestOutput, StepStats
from nanoexp.experiment.measure.workloads import FollowUp, Request, Workload, request_label

OnStep = Callable[[StepStats], None]
REFRESH_S = 0.25  # the progress line is redrawn at most this often: it costs far less than 1% of a run


class Driver(Protocol):
    """Submits requests at their arrival offsets from t0 and returns their outputs when all finish, each
    output's `request_id` the request's index in `requests` (never an engine-internal number)."""

    def drive(self, requests: Sequence[Request], t0: float, on_step: OnStep) -> list[RequestOutput]: ...

    def reset_prefix_cache(self) -> None: ...  # the next repeat starts cold


class EngineDriver:
    """Our engine: each request submitted when due (and a slot is free), stamped with its scheduled arrival
    time, then `engine.step()` until done. With `follow_up` (closed loop), a finished request may bring the
    next one, due at the offset the follow-up sets (after the finish). `submitted`: request id -> Request."""

    def __init__(self, engine, max_concurrency: int | None = None):
        self.engine, self.max_concurrency = engine, max_concurrency or math.inf
        self.submitted: dict[int, Request] = {}

    def reset_prefix_cache(self) -> None:
        self.engine.reset_prefix_cache()

    def check(
        self, requests: Sequence[Request], label: Callable[[int, Request], str] = request_label
    ) -> None:
        """Every request checked against the engine (vocabulary, max_model_len, KV cache) before any runs;
        an error names the request as `label` does."""
        for index, r in enumerate(requests):
            self.engine.check_request(label(index, r), r.prompt_token_ids, r.sampling_params)

    def drive(
        self, requests: Sequence[Request], t0: float, on_step: OnStep, follow_up: FollowUp | None = None
    ) -> list[RequestOutput]:
        pending, outputs, in_flight, self.submitted = Arrivals(requests), [], 0, {}
        index_of: dict[int, int] = {}  # the engine's request id -> the request's index in the workload
        while pending or self.engine.has_unfinished():
            now = time.perf_counter() - t0
            while pending and in_flight < self.max_concurrency and pending.next_offset() <= now:
                index, r = pending.pop()
                index_of[self._add(r, t0)] = index
                self.submitted[index] = r
                in_flight += 1
            if not self.engine.has_unfinished():
                sleep_until(t0 + pending.next_offset())
                continue
            step_finished, stats = self.engine.step()
            finished = [replace(o, request_id=index_of.pop(o.request_id)) for o in step_finished]
            outputs += finished
            in_flight -= len(finished)
            if follow_up is not None:
                for out in finished:
                    pending.push(follow_up(self.submitted[out.request_id], out, out.finish_time - t0))
            on_step(stats)
        return outputs

    def _add(self, r: Request, t0: float) -> int:
        """Submits `r` stamped with its scheduled arrival; an engine's refusal names the request's origin."""
        try:
            return self.engine.add_request(
                list(r.prompt_token_ids), r.sampling_params, t0 + r.arrival_offset_s
            )
        except ValueError as err:
            if r.origin:
                raise ValueError(f"{r.origin}: {err}") from None
            raise


class Arrivals:
    """Requests not yet submitted, earliest arrival first (ties in the order they came)."""

    def __init__(self, requests: Sequence[Request]):
        self.order = itertools.count()
        self.heap = [(r.arrival_offset_s, next(self.order), r) for r in requests]
        heapq.heapify(self.heap)

    def __bool__(self) -> bool:
        return bool(self.heap)

    def next_offset(self) -> float:
        return self.heap[0][0]

    def pop(self) -> tuple[int, Request]:
        """The next request and its index: its place in the workload, follow-ups numbered after it."""
        _, index, request = heapq.heappop(self.heap)
        return index, request

    def push(self, request: Request | None) -> None:
        if request is not None:
            heapq.heappush(self.heap, (request.arrival_offset_s, next(self.order), request))


@dataclass
class RunRecord:
    """One repeat: a timed run of the workload."""

    repeat: int = 0
    outputs: list[RequestOutput] = field(default_factory=list)
    steps: list[StepStats] = field(default_factory=list)
    t0: float = 0.0
    duration_s: float = 0.0
    iteration_latencies_s: list[float] = field(default_factory=list)
    facts: dict = field(default_factory=dict)  # what else was measured: machine load, profile counts
    requests: dict[int, Request] = field(default_factory=dict)  # request id -> what was submitted


class Progress:
    """The live progress line of a job, only on a terminal and with engine.use_tqdm=true."""

    def __init__(self, total: int, enabled: bool, stream: TextIO | None = None, desc: str = "requests"):
        self.bar = tqdm(
            total=total,
            desc=desc,
            unit="req",
            file=stream,
            disable=None if enabled else True,
            dynamic_ncols=True,
            mininterval=REFRESH_S,
            leave=True,
        )
        self.done = self.tokens = self.preemptions = 0
        self.started: float | None = None  # the first step's start
        self.next_draw = 0.0  # the next redraw

    def update(self, stats: StepStats, counted: bool = True) -> None:
        """One engine step; `counted=False` for untimed (warm-up) steps, shown but not counted."""
        if self.bar.disable:  # disable=None above: tqdm turns itself off off a terminal
            return
        now = time.perf_counter()
        if self.started is None:
            self.started = now - stats.step_time_s
        self.done += stats.num_finished if counted else 0
        self.tokens += stats.num_output_tokens
        self.preemptions += stats.num_preemptions
        if now >= self.next_draw:
            self.next_draw = now + REFRESH_S
            rate = self.tokens / max(now - self.started, 1e-9)
            usage = stats.kv_blocks_used / stats.num_kv_blocks if stats.num_kv_blocks else 0.0
            text = f"{rate:,.0f} out tok/s, running {stats.num_running}, waiting {stats.num_waiting}, "
            self.bar.n = self.done
            self.bar.set_postfix_str(text + f"KV {usage:.0%}, preemptions {self.preemptions}", refresh=False)
            self.bar.refresh()

    def close(self) -> None:
        self.bar.n = self.done
        self.bar.close()  # a bar left on screen is drawn once more


Emit = Callable[[int, StepStats, float, int], None]  # (step index, stats, seconds into the repeat, repeat)


class StepLog:
    """Records the timed steps; they reach the loggers at `flush()`, after the repeat, since logging a
    step costs the host 0.2-2 ms (experiments/tools/host_step.py)."""

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
        unsent, self.unsent = self.unsent, []
        for step in unsent:
            self.emit(*step)


def run(driver: Driver, workload: Workload, log: StepLog, repeat: int = 0, warm_up: bool = True) -> RunRecord:
    """One repeat: offline/online, or in latency mode `num_iters` timed iterations of one batch."""
    record = log.record = RunRecord(repeat)
    if not workload.latency_mode:
        follow_up = getattr(workload, "follow_up", None)  # closed loop: requests that bring the next
        closed_loop = {"follow_up": follow_up} if follow_up else {}
        record.t0 = time.perf_counter()
        outputs = driver.drive(workload.requests, record.t0, log, **closed_loop)
        record.outputs = sorted(outputs, key=lambda o: o.request_id)
        record.duration_s = time.perf_counter() - record.t0
        record.requests = dict(getattr(driver, "submitted", {}))
        return record
    log.recording = False
    for _ in range(workload.num_iters_warmup if warm_up else 0):
        driver.reset_prefix_cache()
        driver.drive(workload.requests, time.perf_counter(), log)
    log.recording = True
    record.t0 = time.perf_counter()
    for iteration in range(workload.num_iters):
        driver.reset_prefix_cache()  # every iteration prefills its batch: none reuses the last one's blocks
        start = time.perf_counter()
        outputs = driver.drive(workload.requests, start, log)
        offset = iteration * len(workload.requests)  # iteration k's request i: k * batch_size + i
        record.outputs += [replace(o, request_id=offset + o.request_id) for o in outputs]
        record.iteration_latencies_s.append(time.perf_counter() - start)
    record.duration_s = time.perf_counter() - record.t0
    return record


def sleep_until(t: float) -> None:
    """Sleeps until time.perf_counter() reaches `t` (a request's arrival); returns at once if it has."""
    if not math.isfinite(t):  # nan never arrives and inf never comes: the loop would spin forever
        raise ValueError(f"a request's arrival time is {t}; arrival offsets must be finite seconds")
    time.sleep(max(0.0, t - time.perf_counter()))
