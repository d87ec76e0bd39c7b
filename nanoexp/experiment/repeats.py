"""Repeats: the timed workload run `repeats` times on one engine, summarized as mean, std and a 95%
confidence interval per headline metric (see metrics.aggregate_repeats)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from nanoexp.experiment.driver import Driver, RunRecord, StepLog, run
from nanoexp.experiment.metrics import HEADLINE, aggregate_repeats, latency_summary, step_row, summarize
from nanoexp.experiment.progress import Progress
from nanoexp.experiment.schema import NanoexpConfig
from nanoexp.experiment.workloads import Workload


def repeat_specs(spec: NanoexpConfig) -> list[NanoexpConfig]:
    """One config per repeat: the same one, or with `reseed_repeats` the seeds shifted by the repeat."""
    if not spec.reseed_repeats:
        return [spec] * spec.repeats
    return [_reseeded(spec, r) for r in range(spec.repeats)]


def _reseeded(spec: NanoexpConfig, r: int) -> NanoexpConfig:
    seed = spec.sampler.seed
    sampler = replace(spec.sampler, seed=None if seed is None else seed + r)
    return replace(spec, workload=replace(spec.workload, seed=spec.workload.seed + r), sampler=sampler)


def measure(driver: Driver, workloads: list[Workload], logger, progress: Progress) -> list[RunRecord]:
    """Every repeat in turn; steps go to `logger.log_step` numbered across repeats, after each
    repeat (and what a failed repeat recorded before it failed)."""
    emit: Callable = lambda i, stats, t, r: logger.log_step(i, step_row(i, stats, t, r))
    log = StepLog(emit, progress)
    records = []
    try:
        for r, w in enumerate(workloads):
            try:
                records.append(_run_cold(driver, w, log, r))
            finally:
                log.flush()
        return records
    finally:
        progress.close()


def _run_cold(driver: Driver, workload: Workload, log: StepLog, repeat: int) -> RunRecord:
    """One timed pass on an empty prefix cache: nothing the warm-up request or an earlier pass cached
    is reused."""
    driver.reset_prefix_cache()
    return run(driver, workload, log, repeat=repeat, warm_up=repeat == 0)


def progress_total(workloads: list[Workload]) -> int:
    """Requests the progress line counts: every timed request of every repeat."""
    return sum(len(w.requests) * (w.num_iters if w.latency_mode else 1) for w in workloads)


def summarize_repeats(records: list[RunRecord], slo: dict[str, float]) -> dict:
    """The job's summary over its repeats, plus `per_repeat`: each repeat's headline metrics."""
    summaries = [_summarize(r, slo) for r in records]
    summary = aggregate_repeats(summaries)
    summary["per_repeat"] = [{k: s[k] for k in HEADLINE if k in s} for s in summaries]
    return summary


def _summarize(record: RunRecord, slo: dict[str, float]) -> dict:
    summary = summarize(record.outputs, record.steps, record.duration_s, slo)
    if record.iteration_latencies_s:
        summary |= latency_summary(record.iteration_latencies_s)
    return summary
