"""The timed passes of a job, summarized with a 95% CI per headline metric and flags for noise."""

from __future__ import annotations

import logging
import os
import time
from contextlib import closing, nullcontext, suppress
from dataclasses import replace
from pathlib import Path

from nanoexp.experiment.measure.driver import Driver, Progress, RunRecord, StepLog, run
from nanoexp.experiment.measure.profiling import StepProfiler
from nanoexp.experiment.measure.workloads import Workload
from nanoexp.experiment.metrics.summarize import (
    HEADLINE,
    aggregate_repeats,
    latency_summary,
    step_row,
    summarize,
)
from nanoexp.experiment.runtime.interrupts import process_tree
from nanoexp.experiment.schema import NanoexpConfig, NoiseConfig, ProfileConfig

log = logging.getLogger(__name__)
LOAD_KEYS = ("load_avg_1m_before", "load_avg_1m_after", "process_cpu_cores", "other_cpu_cores")
CI_CHECKED = ("output_throughput", "mean_ttft_ms", "mean_tpot_ms", "mean_e2el_ms", "mean_latency_ms")


def repeat_specs(spec: NanoexpConfig) -> list[NanoexpConfig]:
    """One config per repeat; with `reseed_repeats` no two passes of a configuration share prompts."""
    if not spec.reseed_repeats:
        return [spec] * spec.repeats
    specs, seed = [], spec.sampler.seed
    for r in range(spec.trial * spec.repeats, (spec.trial + 1) * spec.repeats):
        sampler = replace(spec.sampler, seed=None if seed is None else seed + r)
        workload = replace(spec.workload, seed=spec.workload.seed + r)
        specs.append(replace(spec, workload=workload, sampler=sampler))
    return specs


def measure(
    driver: Driver,
    workloads: list[Workload],
    logger,
    progress: Progress,
    profile: ProfileConfig | None = None,
    out_dir: Path | None = None,
) -> list[RunRecord]:
    """Every repeat in turn, on an empty prefix cache; its steps logged after it (a failed one's too)."""
    profiler = _profiler(profile, driver, out_dir)
    columns = profiler.columns if profiler else {}  # filled as the steps run
    emit = lambda i, stats, t, r: logger.log_step(i, step_row(i, stats, t, r) | columns.get(i, {}))
    log = StepLog(emit, progress)
    records = []
    with closing(progress):
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
        job_facts = profiler.job_summary() if profiler else {}
        for record in records:  # the same in each, so the job's summary has them whole
            record.facts |= job_facts
        return records


def _profiler(profile: ProfileConfig | None, driver: Driver, out_dir: Path | None) -> StepProfiler | None:
    if profile is None or not profile.enabled:
        return None
    engine = getattr(driver, "engine", None)
    if engine is None or out_dir is None:
        log.warning("profile: only engine=nanoexp steps can be profiled; skipped")
        return None
    return StepProfiler(profile, engine, out_dir)


def progress_total(workloads: list[Workload]) -> int:
    """Requests the progress line counts: every timed request of every repeat."""
    return sum(w.num_requests * (w.num_iters if w.latency_mode else 1) for w in workloads)


def summarize_repeats(records: list[RunRecord], slo: dict[str, float], noise: NoiseConfig) -> dict:
    """The job's summary over its repeats, each repeat's headline metrics and load, and the noise flags."""
    latency = lambda r: latency_summary(r.iteration_latencies_s) if r.iteration_latencies_s else {}
    summaries = [summarize(r.outputs, r.steps, r.duration_s, slo) | r.facts | latency(r) for r in records]
    summary = aggregate_repeats(summaries)
    summary["per_repeat"] = [{k: s[k] for k in (*HEADLINE, *LOAD_KEYS) if k in s} for s in summaries]
    return summary | noise_flags(summary, summary["per_repeat"], noise)


class LoadMeter:
    """Started before a timed pass; `read()` gives its LOAD_KEYS: `other_cpu_cores` is the machine's busy
    CPU time less this process tree's over the wall time (unlike the load average, without the job)."""

    def __init__(self) -> None:
        self.load_before = os.getloadavg()[0]
        self.busy_before, self.tree_before = _busy_cpu_s(), _tree_cpu_s()
        self.start = time.perf_counter()

    def read(self) -> dict:
        wall, own, busy = time.perf_counter() - self.start, _tree_cpu_s() - self.tree_before, _busy_cpu_s()
        before = self.busy_before  # busy and before: None where not on Linux (then nan)
        other = float("nan") if busy is None or before is None else max(0.0, (busy - before - own) / wall)
        return {
            "load_avg_1m_before": self.load_before,
            "load_avg_1m_after": os.getloadavg()[0],
            "cpu_count": os.cpu_count() or 0,
            "process_cpu_cores": own / wall,
            "other_cpu_cores": other,
        }


def noise_flags(summary: dict, per_repeat: list[dict], cfg: NoiseConfig) -> dict:
    """`noise_busy_repeats`, `noise_wide_ci` and `noise_warning`, one line ("" when the job is not noisy)."""
    busy = [r for r in per_repeat if r.get("other_cpu_cores", 0.0) > cfg.busy_cores]
    wide = [f"{m} ±{share:.0%}" for m in CI_CHECKED if (share := _ci_share(summary, m)) > cfg.max_ci_share]
    worst = max((r["other_cpu_cores"] for r in busy), default=0.0)
    busy_line = f"machine busy in {len(busy)} of {len(per_repeat)} repeats (up to {worst:.1f} other cores)"
    wide_line = f"wide CI: {', '.join(wide)} of the mean"
    warning = "; ".join(line for line, flagged in ((busy_line, busy), (wide_line, wide)) if flagged)
    if warning:
        log.warning("noisy measurement: %s", warning)
    return {"noise_busy_repeats": len(busy), "noise_wide_ci": ", ".join(wide), "noise_warning": warning}


def _ci_share(summary: dict, metric: str) -> float:
    """The CI's half-width over the mean (0 without a CI: one repeat, or a NaN one)."""
    low, high, mean = (summary.get(k) for k in (f"{metric}_ci95_low", f"{metric}_ci95_high", metric))
    return abs(high - low) / 2 / abs(mean) if low is not None and mean and low == low else 0.0


def _busy_cpu_s() -> float | None:
    """Seconds of CPU time every CPU spent busy since boot (all but idle and iowait); None off Linux."""
    try:  # the first line: cpu user nice system idle iowait irq softirq steal ...
        ticks = [int(f) for f in Path("/proc/stat").read_text().split()[1:9]]
    except OSError:
        return None
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def _tree_cpu_s() -> float:
    """CPU seconds of this process and its live descendants (tensor-parallel workers)."""
    workers_s = 0.0
    for pid in process_tree(os.getpid())[:-1]:  # children first, this process last
        with suppress(OSError, ValueError):  # a worker that has just exited
            utime, stime = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[11:13]
            workers_s += (int(utime) + int(stime)) / os.sysconf("SC_CLK_TCK")
    return time.process_time() + workers_s
