"""Repeats: the timed workload run `repeats` times on one engine, summarized as mean, std and a 95%
confidence interval per headline metric."""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

from nanoexp.experiment.driver import Driver, Progress, RunRecord, StepLog, run
from nanoexp.experiment.metrics import HEADLINE, aggregate_repeats, latency_summary, step_row, summarize
from nanoexp.experiment.noise import LOAD_KEYS, LoadMeter, noise_flags
from nanoexp.experiment.profiling import StepProfiler
from nanoexp.experiment.schema import NanoexpConfig, NoiseConfig, ProfileConfig
from nanoexp.experiment.workloads import Workload


def repeat_specs(spec: NanoexpConfig) -> list[NanoexpConfig]:
    """One config per repeat: the same one, or with `reseed_repeats` the seeds shifted by the pass's
    number over all trials, so that no two passes of a configuration share their prompts."""
    if not spec.reseed_repeats:
        return [spec] * spec.repeats
    specs, seed = [], spec.sampler.seed
    for r in range(spec.trial * spec.repeats, (spec.trial + 1) * spec.repeats):
        sampler = replace(spec.sampler, seed=None if seed is None else seed + r)
        specs.append(
            replace(spec, workload=replace(spec.workload, seed=spec.workload.seed + r), sampler=sampler)
        )
    return specs


def measure(
    driver: Driver,
    workloads: list[Workload],
    logger,
    progress: Progress,
    profile: ProfileConfig | None = None,
    out_dir: Path | None = None,
) -> list[RunRecord]:
    """Every repeat in turn, each on an empty prefix cache; steps go to `logger.log_step` after each
    repeat (a failed one's too), with the profile columns when `profile` knobs are on."""
    profiler = _profiler(profile, driver, out_dir)
    extra: Callable = profiler.columns.get if profiler else lambda i, default: default
    emit: Callable = lambda i, stats, t, r: logger.log_step(i, step_row(i, stats, t, r) | extra(i, {}))
    log = StepLog(emit, progress)
    records = []
    try:
        for r, w in enumerate(workloads):
            try:
                with profiler.repeat(r, log) if profiler else nullcontext():
                    load = LoadMeter()
                    driver.reset_prefix_cache()  # nothing the warm-up or an earlier pass cached is reused
                    records.append(run(driver, w, log, repeat=r, warm_up=r == 0))
                records[-1].facts |= load.read()
                if profiler:
                    records[-1].facts |= profiler.summary(since=log.index - len(records[-1].steps))
            finally:
                log.flush()
        if profiler:
            profiler.warn()
            for record in records:  # the same in each, so the job's summary has them whole
                record.facts |= profiler.job_summary()
        return records
    finally:
        progress.close()


def _profiler(profile: ProfileConfig | None, driver: Driver, out_dir: Path | None) -> StepProfiler | None:
    if profile is None or not profile.enabled:
        return None
    engine = getattr(driver, "engine", None)
    if engine is None or out_dir is None:
        logging.getLogger(__name__).warning("profile: only engine=nanoexp steps can be profiled; skipped")
        return None
    return StepProfiler(profile, engine, out_dir)


def progress_total(workloads: list[Workload]) -> int:
    """Requests the progress line counts: every timed request of every repeat."""
    return sum(len(w.requests) * (w.num_iters if w.latency_mode else 1) for w in workloads)


def summarize_repeats(
    records: list[RunRecord], slo: dict[str, float], noise: NoiseConfig | None = None
) -> dict:
    """The job's summary over its repeats, `per_repeat` (each one's headline metrics and the machine's
    load) and the noise flags."""
    summaries = []
    for r in records:
        summaries.append(summarize(r.outputs, r.steps, r.duration_s, slo) | r.facts)
        if r.iteration_latencies_s:
            summaries[-1] |= latency_summary(r.iteration_latencies_s)
    summary = aggregate_repeats(summaries)
    summary["per_repeat"] = [{k: s[k] for k in (*HEADLINE, *LOAD_KEYS) if k in s} for s in summaries]
    return summary | noise_flags(summary, summary["per_repeat"], noise or NoiseConfig())
