"""The capacity search (`experiment=capacity`): the highest offered request rate at which at least
`metrics.slo.attainment` of the requests meet the SLOs (DistServe's goodput), found on one engine by
bracketing (the rate times or divided by `capacity.growth` until the verdict flips) and bisection (at the
geometric mean of the bracket) until the bracket is within `capacity.precision`. Each probe is a job's
timed repeats (`repeats`, each with fresh prompts) written to `probes/<n>_rate=<r>/`; the job's own results
are those of the probe at the capacity, plus the search's answer, bracket, CI and probes."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from nanoexp.experiment.measure.driver import Progress, RunRecord
from nanoexp.experiment.measure.repeats import measure, progress_total, repeat_specs, summarize_repeats
from nanoexp.experiment.measure.workloads import Workload
from nanoexp.experiment.metrics.summarize import request_rows
from nanoexp.experiment.runtime.atomic_files import write_atomically
from nanoexp.experiment.runtime.job_info import JobInfo
from nanoexp.experiment.schema import ConfigError, NanoexpConfig, WorkloadKind
from nanoexp.experiment.sinks.local import LocalSink, json_safe

log = logging.getLogger(__name__)
BuildWorkload = Callable[[NanoexpConfig], Workload]
PROBES_DIR = "probes"


@dataclass
class Probe:
    rate: float
    attainment: float
    ci_low: float  # the attainment's 95% CI over the repeats (the attainment itself with one repeat)
    ci_high: float
    passed: bool
    dir: str
    records: list[RunRecord]


def check(spec: NanoexpConfig) -> None:
    """What the search needs: SLOs to meet and a workload whose load a rate sets."""
    if not spec.metrics.slo.as_dict():
        raise ConfigError("capacity.enabled=true needs an SLO: set metrics.slo.ttft_ms, tpot_ms or e2el_ms")
    if spec.workload.kind is WorkloadKind.latency:
        raise ConfigError("capacity.enabled=true: workload=latency has no arrivals to speed up")
    if spec.workload.ramp != "none":
        raise ConfigError(
            f"capacity.enabled=true: workload.ramp={spec.workload.ramp} sets its own rates; use none"
        )


def at_rate(spec: NanoexpConfig, rate: float, trace_rate: float | None = None) -> NanoexpConfig:
    """The job at an offered `rate`: a trace stretched to it (time_scale), else request_rate (sessions/s)."""
    w = spec.workload
    if w.kind is WorkloadKind.trace:
        assert trace_rate is not None  # a trace's native rate, which the search passes
        return replace(spec, workload=replace(w, time_scale=trace_rate / rate))
    return replace(spec, workload=replace(w, request_rate=rate))


def search(spec: NanoexpConfig, driver, build_workload: BuildWorkload, job: JobInfo) -> tuple[list, dict]:
    """(the records of the probe at the capacity, or of the lowest probe when none passed; the search's
    summary keys). Probes log to their own dirs; a probe's progress line names its rate."""
    check(spec)
    trace_rate = None
    if spec.workload.kind is WorkloadKind.trace:
        from nanoexp.experiment.measure.traces import native_rate

        trace_rate = native_rate(spec.workload)
    target, c = spec.metrics.slo.attainment, spec.capacity
    probes: list[Probe] = []

    def probe(rate: float) -> bool:
        probes.append(
            run_probe(spec, at_rate(spec, rate, trace_rate), rate, driver, build_workload, job, len(probes))
        )
        p = probes[-1]
        log.info(
            "capacity probe %d: %.4g req/s, attainment %.3f: %s", len(probes), rate, p.attainment, p.passed
        )
        return p.passed

    low, high = bracket(probe, c.start_rate, c.growth, c.min_rate, c.max_rate, c.max_probes)
    while (
        low is not None and high is not None and high / low - 1 > c.precision and len(probes) < c.max_probes
    ):
        middle = math.sqrt(low * high)
        low, high = (middle, high) if probe(middle) else (low, middle)
    found = answer(probes, low, high, target, c.precision)
    write_report(job.out_dir, probes, found, spec)
    at = max((p for p in probes if p.passed), key=lambda p: p.rate, default=min(probes, key=lambda p: p.rate))
    return at.records, found


def bracket(
    probe: Callable[[float], bool], start: float, growth: float, lowest: float, highest: float, most: int
):
    """(highest passing rate, lowest failing rate) around the verdict's flip; None on a side not found
    within [lowest, highest] or `most` probes."""
    rate, passed = start, probe(start)
    (low, high), probes = (start, None) if passed else (None, start), 1
    while (low is None or high is None) and probes < most:
        rate = rate * growth if passed else rate / growth
        if not lowest <= rate <= highest:
            break
        passed, probes = probe(rate), probes + 1
        low, high = (max(low or 0, rate), high) if passed else (low, min(high or math.inf, rate))
    return low, high


def run_probe(
    spec: NanoexpConfig, probe_spec: NanoexpConfig, rate: float, driver, build_workload, job: JobInfo, n: int
) -> Probe:
    """One probe: the repeats at `rate` on the job's engine, written like a job (results.json, CSVs)."""
    workloads = [build_workload(s) for s in repeat_specs(probe_spec)]
    out = job.out_dir / PROBES_DIR / f"{n:02d}_rate={rate:.4g}"
    sink = LocalSink()
    sink.start({"offered_request_rate": rate}, replace(job, out_dir=out, name=f"{job.name} probe {n}"))
    progress = Progress(progress_total(workloads), spec.engine.use_tqdm, desc=f"probe {n}: {rate:.4g} req/s")
    records = measure(driver, workloads, sink, progress)
    sink.log_requests([row for r in records for row in request_rows(r.outputs, r.t0, r.repeat, r.requests)])
    summary = summarize_repeats(records, spec.metrics.slo.as_dict(), spec.metrics.noise)
    summary |= {"offered_request_rate": rate} | workloads[0].facts | {"offered_request_rate": rate}
    sink.finish(summary)
    attainment = float(summary.get("slo_attainment", 0.0))
    low, high = (summary.get(f"slo_attainment_ci95_{s}", attainment) for s in ("low", "high"))
    passed = attainment >= spec.metrics.slo.attainment
    return Probe(rate, attainment, low, high, passed, str(out.relative_to(job.out_dir)), records)


def answer(
    probes: list[Probe], low: float | None, high: float | None, target: float, precision: float
) -> dict:
    """The capacity (the highest rate that met the SLOs), its bracket, whether the bracket reached the
    precision, and a 95% interval: from the highest probe whose attainment CI lies wholly above the target
    to the lowest whose CI lies wholly below it (the rates where the verdict is within noise lie inside)."""
    sure_pass = [p.rate for p in probes if p.ci_low >= target]
    sure_fail = [p.rate for p in probes if p.ci_high < target]
    converged = low is not None and high is not None and high / low - 1 <= precision
    return {
        "capacity_request_rate": low,  # None: no probe met the SLOs
        "capacity_bracket_low": low,
        "capacity_bracket_high": high,  # None: every probe up to capacity.max_rate met them
        "capacity_converged": converged,
        "capacity_ci95_low": max((r for r in sure_pass if r <= (high or math.inf)), default=0.0),
        "capacity_ci95_high": min((r for r in sure_fail if r >= (low or 0.0)), default=math.inf),
        "capacity_target_attainment": target,
        "capacity_num_probes": len(probes),
        "capacity_probes": [
            {k: getattr(p, k) for k in ("rate", "attainment", "ci_low", "ci_high", "passed", "dir")}
            for p in probes
        ],
    }


def describe(found: dict) -> str:
    """One line: the capacity with its bracket and interval, or what the search found instead."""
    low, high, n = found["capacity_bracket_low"], found["capacity_bracket_high"], found["capacity_num_probes"]
    if low is None:
        return f"capacity: no probed rate met the SLOs (lowest probed {high:.4g} req/s; {n} probes)"
    if high is None:
        return f"capacity: every probed rate met the SLOs, up to {low:.4g} req/s ({n} probes)"
    state = "converged" if found["capacity_converged"] else "not converged (capacity.max_probes)"
    ci = f"[{found['capacity_ci95_low']:.4g}, {found['capacity_ci95_high']:.4g}]"
    return (
        f"capacity: {low:.4g} req/s, bracket [{low:.4g}, {high:.4g}], 95% interval {ci}, {n} probes, {state}"
    )


def write_report(out_dir: Path, probes: list[Probe], found: dict, spec: NanoexpConfig) -> None:
    """capacity.md (the probes, in search order) and capacity.png (attainment against rate)."""
    slo = ", ".join(f"{k} <= {v:g}" for k, v in spec.metrics.slo.as_dict().items())
    lines = [f"# Capacity: {spec.model.name}, workload {spec.workload.name}", "", describe(found), ""]
    lines += [
        f"SLOs {slo} for >= {found['capacity_target_attainment']:.0%} of requests; {spec.repeats} repeats",
        "",
    ]
    lines += ["| probe | rate (req/s) | SLO attainment | 95% CI | met | dir |", "|---|---|---|---|---|---|"]
    for i, p in enumerate(probes):
        ci, met = f"[{p.ci_low:.3f}, {p.ci_high:.3f}]", "yes" if p.passed else "no"
        lines.append(f"| {i} | {p.rate:.4g} | {p.attainment:.3f} | {ci} | {met} | {p.dir} |")
    write_atomically(out_dir / "capacity.md", "\n".join(lines) + "\n")
    write_atomically(out_dir / "capacity.json", json.dumps(json_safe(found), indent=2) + "\n")
    plot(out_dir / "capacity.png", probes, found, f"{spec.model.name}, workload {spec.workload.name}")


def plot(path: Path, probes: list[Probe], found: dict, title: str) -> None:
    from matplotlib.ticker import FuncFormatter

    from nanoexp.experiment.report.sweep_plots import figure, save_figure

    fig = figure(figsize=(6, 3.6))
    ax = fig.subplots()
    for passed, colour, label in ((True, "C2", "met the SLOs"), (False, "C3", "did not")):
        chosen = [p for p in probes if p.passed == passed]
        if chosen:
            y = [p.attainment for p in chosen]
            err = [[a - p.ci_low for a, p in zip(y, chosen)], [p.ci_high - a for a, p in zip(y, chosen)]]
            ax.errorbar([p.rate for p in chosen], y, yerr=err, fmt="o", color=colour, capsize=3, label=label)
    for i, p in enumerate(probes):
        ax.annotate(str(i), (p.rate, p.attainment), fontsize=6, xytext=(3, 3), textcoords="offset points")
    ax.axhline(found["capacity_target_attainment"], color="grey", linestyle=":", linewidth=1, label="target")
    low, high = found["capacity_bracket_low"], found["capacity_bracket_high"]
    if low is not None and high is not None:
        ax.axvspan(low, high, color="C0", alpha=0.15, label="bracket")
    if low is not None:
        ax.axvline(low, color="C0", linewidth=1, label=f"capacity {low:.3g} req/s")
    ax.set_xscale("log")
    plain = FuncFormatter(lambda v, _: f"{v:g}")  # 2, not 2x10^0
    ax.xaxis.set_major_formatter(plain)
    ax.xaxis.set_minor_formatter(plain)
    ax.set(xlabel="offered rate (req/s)", ylabel="SLO attainment", ylim=(0, 1.05))
    ax.legend(fontsize=6, frameon=False, loc="lower left")
    save_figure(fig, title, path)
