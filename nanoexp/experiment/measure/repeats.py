"""The repeats (timed runs) of a job, summarized with a 95% CI per headline metric and flags for noise."""

from __future__ import annotations

import logging
import math
import os
import time
from contextlib import closing, nullcontext, suppress
from dataclasses import replace
from pathlib import Path

import torch

from nanoexp.experiment.measure.driver import Driver, Progress, RunRecord, StepLog, run
from nanoexp.experiment.measure.profiling import StepProfiler
from nanoexp.experiment.measure.workloads import Workload
from nanoexp.experiment.metrics import registry
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
CI_CHECKED = tuple(registry.names(registry.CI_CHECK))


def repeat_specs(spec: NanoexpConfig) -> list[NanoexpConfig]:
    """One config per repeat; with `reseed_repeats` no two repeats of a configuration share prompts."""
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
                    driver.reset_prefix_cache()  # nothing the warm-up or an earlier repeat cached is reused
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


def summarize_repeats(
    records: list[RunRecord],
    slo: dict[str, float],
    noise: NoiseConfig,
    device: str = "cpu",
    traced: int | None = None,
) -> dict:
    """The job's summary over its repeats, each repeat's headline metrics and load, and the noise flags.
    The `traced` repeat (run under the torch profiler) is left out of the summary when others exist."""
    latency = lambda r: latency_summary(r.iteration_latencies_s) if r.iteration_latencies_s else {}
    summaries = [summarize(r.outputs, r.steps, r.duration_s, slo) | r.facts | latency(r) for r in records]
    timed = [s for r, s in zip(records, summaries) if r.repeat != traced] or summaries
    summary = aggregate_repeats(timed)
    summary["per_repeat"] = [{k: s[k] for k in (*HEADLINE, *LOAD_KEYS) if k in s} for s in timed]
    if traced is not None:
        left_out = len(timed) < len(summaries)
        summary["traced_repeat"] = traced
        summary["traced_repeat_in_summary"] = not left_out
        if not left_out:
            log.warning("the only repeat ran under the profiler: its times include the profiler's cost")
    return summary | noise_flags(summary, summary["per_repeat"], noise, device)


class LoadMeter:
    """Started before a repeat; `read()` gives its LOAD_KEYS: `other_cpu_cores` is the machine's busy
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


def noise_flags(summary: dict, per_repeat: list[dict], cfg: NoiseConfig, device: str = "cpu") -> dict:
    """`noise_busy_repeats`, `noise_too_short`, `noise_wide_ci` and `noise_warning`, one line ("" when the
    job is not noisy). A busy repeat makes the job one that no verdict, max-rate line or search uses; a
    repeat shorter than the device's minimum duration says so instead of a wide-CI warning."""
    threads = torch.get_num_threads() if device == "cpu" else 0  # a CPU job wants its threads' cores
    limit = busy_limit(per_repeat, summary.get("cpu_count"), cfg.busy_cores, threads)
    busy = [r for r in per_repeat if r.get("other_cpu_cores", 0.0) > limit]
    min_s = cfg.min_duration(device)
    duration = summary.get("duration_s")
    too_short = isinstance(duration, int | float) and duration < min_s
    wide = [f"{m} ±{share:.0%}" for m in CI_CHECKED if (share := _ci_share(summary, m)) > cfg.max_ci_share]
    worst = max((r["other_cpu_cores"] for r in busy), default=0.0)
    lines = []
    if busy:
        lines.append(
            f"machine busy in {len(busy)} of {len(per_repeat)} repeats (up to {worst:.2f} other cores; "
            f"the job left {limit - cfg.busy_cores:g} free, metrics.noise.busy_cores={cfg.busy_cores:g}): "
            f"shown, not judged; {BUSY_HELP}"
        )
    if too_short:
        lines.append(
            f"measurement too short: {duration:.2f} s a repeat, under the {min_s:g} s a {device} repeat "
            f"needs to be repeatable (metrics.noise.min_duration_s); {SHORT_HELP}"
        )
    elif wide:
        lines.append(f"wide CI: {', '.join(wide)} of the mean; {WIDE_HELP}")
    warning = "; ".join(lines)
    if warning:
        log.warning("noisy measurement: %s", warning)
    return {
        "noise_busy_repeats": len(busy),
        "noise_busy_limit_cores": limit,  # other cores above which a repeat counted as busy
        "noise_too_short": bool(too_short),
        "noise_wide_ci": ", ".join(wide),
        "noise_warning": warning,
    }


def busy_limit(per_repeat: list[dict], cpu_count: float | None, busy_cores: float, threads: int = 0) -> float:
    """Other cores a repeat may see before it is busy: `busy_cores` beyond the cores the job left free.
    The job's cores: the most it used in a repeat, rounded up (1.24 cores: 2; a 1.03-core job: 1), and
    at least its torch threads on a CPU (a squeezed job uses fewer than it wants); so a 2-core CPU job
    on both has no free core, while a GPU job using one of 16 cores leaves 15."""
    cores = float(cpu_count or os.cpu_count() or 1)
    used = max((r.get("process_cpu_cores", cores) for r in per_repeat), default=cores)
    wanted = max(math.ceil(max(used - 0.1, 0.0)), threads)
    return busy_cores + max(0.0, cores - wanted)


BUSY_HELP = "what helps: a quieter machine, OMP_NUM_THREADS below the free cores, or rerun the job"
SHORT_HELP = "what helps: a longer workload (workload.num_requests, workload.output_len)"
WIDE_HELP = "what helps: more repeats, a longer workload, a quieter machine"


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
