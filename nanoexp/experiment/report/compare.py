"""Two sweeps side by side (`python -m nanoexp.experiment.report.compare SWEEP_A SWEEP_B`): jobs matched by
their swept values, each metric's ratio B/A with a 95% CI from the repeats, in compare.md/.csv/.png."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from nanoexp.config.checks import is_real
from nanoexp.experiment.metrics.summarize import CONFIDENCE
from nanoexp.experiment.report.sweep_plots import figure, save_figure
from nanoexp.experiment.report.sweep_report import (
    HIGHER_IS_BETTER,
    LOWER_IS_BETTER,
    TRIAL,
    parse_overrides,
    swept_keys,
)
from nanoexp.experiment.runtime import atomic_files
from nanoexp.experiment.sinks.local import RESULTS_FILE, read_results

METRICS = ["output_throughput", "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "mean_e2el_ms", "duration_s"]
LOWER = {*LOWER_IS_BETTER, "duration_s", "p99_tpot_ms", "median_ttft_ms"}


def load_jobs(sweep_dir: Path) -> list[dict]:
    """Each finished configuration: its overrides as `param:` keys, its summary and its commit; the jobs
    that differ only in `trial` are one, whose per_repeat holds every trial's repeats."""
    jobs: dict[tuple, dict] = {}
    for path in sorted(sweep_dir.rglob(RESULTS_FILE)):
        results = read_results(path)
        if results.get("status") != "ok":
            continue
        git = results.get("config", {}).get("resolved", {}).get("provenance", {}).get("git", {})
        params = parse_overrides(results.get("job", {}).get("overrides", []))
        params.pop(TRIAL, None)
        summary = results.get("summary", {})
        first = {"params": params, "summary": dict(summary, per_repeat=[]), "commit": git.get("commit")}
        job = jobs.setdefault(tuple(sorted(params.items())), first)
        job["summary"]["per_repeat"] += summary.get("per_repeat") or []
    return list(jobs.values())


def ratio(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """mean(b) / mean(a) and its 95% interval (delta method on the log ratio, Welch's degrees of
    freedom; NaN bounds with fewer than two values a side)."""
    a_arr, b_arr = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    mean_a, mean_b = a_arr.mean(), b_arr.mean()
    value = mean_b / mean_a if mean_a else math.nan
    if a_arr.size < 2 or b_arr.size < 2 or mean_a <= 0 or mean_b <= 0:
        return value, math.nan, math.nan
    var_a = a_arr.var(ddof=1) / (a_arr.size * mean_a**2)
    var_b = b_arr.var(ddof=1) / (b_arr.size * mean_b**2)
    total = var_a + var_b
    if total == 0:
        return value, value, value
    dof = total**2 / (var_a**2 / (a_arr.size - 1) + var_b**2 / (b_arr.size - 1))
    half = scipy_stats.t.ppf(0.5 + CONFIDENCE / 2, dof) * math.sqrt(total)
    return value, value * math.exp(-half), value * math.exp(half)


def compare(sweep_a: Path, sweep_b: Path, metrics: list[str] = METRICS) -> tuple[pd.DataFrame, list[str]]:
    """One row per job pair that agrees on the keys either sweep varies, and metric; and the header lines
    (sweeps, commits, unmatched jobs)."""
    jobs_a, jobs_b = load_jobs(sweep_a), load_jobs(sweep_b)
    params = [pd.DataFrame([j["params"] for j in jobs]) for jobs in (jobs_a, jobs_b)]
    keys = sorted({key for table in params for key in swept_keys(table)})
    by_values = {tuple(j["params"].get(k) for k in keys): j for j in jobs_a}
    candidates = [(by_values.get(tuple(b["params"].get(k) for k in keys)), b) for b in jobs_b]
    pairs = [(a, b) for a, b in candidates if a is not None]
    rows = []
    for a, b in pairs:
        config = ", ".join(f"{k.removeprefix('param:')}={b['params'].get(k)}" for k in keys) or "all"
        rows += [_metric_row(config, metric, a, b) for metric in metrics]
    table = pd.DataFrame([r for r in rows if r is not None])
    names = ", ".join(k.removeprefix("param:") for k in keys) or "nothing swept"
    unmatched = f"{len(jobs_a) - len(pairs)} of A and {len(jobs_b) - len(pairs)} of B unmatched"
    header = [
        f"A: {sweep_a} ({_commits(jobs_a)})",
        f"B: {sweep_b} ({_commits(jobs_b)})",
        f"{len(pairs)} configurations matched on {names}; {unmatched}",
    ]
    return table, header


def _metric_row(config: str, metric: str, a: dict, b: dict) -> dict | None:
    values_a, values_b = _values(a["summary"], metric), _values(b["summary"], metric)
    if not values_a or not values_b:
        return None
    value, low, high = ratio(values_a, values_b)
    significant = bool(low > 1 or high < 1)  # False with NaN bounds
    if math.isnan(low):
        verdict = "no CI (one repeat)"
    elif not significant:
        verdict = "within noise"
    elif metric in LOWER or metric in HIGHER_IS_BETTER:
        verdict = "better" if (value > 1) == (metric in HIGHER_IS_BETTER) else "worse"
    else:
        verdict = "higher" if value > 1 else "lower"
    return {
        "config": config,
        "metric": metric,
        "a": float(np.mean(values_a)),
        "b": float(np.mean(values_b)),
        "ratio": value,
        "ratio_ci95_low": low,
        "ratio_ci95_high": high,
        "significant": significant,
        "verdict": verdict,
        "repeats": f"{len(values_a)}/{len(values_b)}",
    }


def _values(summary: dict, metric: str) -> list[float]:
    """The metric's value per repeat, or its one value when the repeats did not record it."""
    per_repeat = [r.get(metric) for r in summary.get("per_repeat") or []]
    if per_repeat and all(map(is_real, per_repeat)):
        return [float(v) for v in per_repeat]
    return [float(summary[metric])] if is_real(summary.get(metric)) else []


def _commits(jobs: list[dict]) -> str:
    commits = sorted({str(j["commit"])[:12] for j in jobs if j.get("commit")})
    return "commit " + ", ".join(commits) if commits else "commit unknown"


def markdown(table: pd.DataFrame, header: list[str]) -> str:
    lines = ["# Compare B against A", "", *(f"- {h}" for h in header), ""]
    if table.empty:
        return "\n".join([*lines, "no matched jobs", ""])
    lines += ["| config | metric | A | B | B/A (95% CI) | verdict |", "|---|---|---|---|---|---|"]
    for _, r in table.iterrows():
        ci = f" ({r.ratio_ci95_low:.3f}-{r.ratio_ci95_high:.3f})" if pd.notna(r.ratio_ci95_low) else ""
        cell = f"**{r.ratio:.3f}**" if r.significant else f"{r.ratio:.3f}"
        lines.append(f"| {r.config} | {r.metric} | {r.a:.4g} | {r.b:.4g} | {cell}{ci} | {r.verdict} |")
    return "\n".join([*lines, "", "**bold**: the interval excludes 1 (beyond noise)", ""])


def plot(table: pd.DataFrame, path: Path) -> None:
    """One panel per metric: B/A per configuration with its interval, a line at 1."""
    if table.empty:
        return
    parts = list(table.groupby("metric", sort=False))
    fig = figure(figsize=(3.2 * len(parts), 3.4))
    for ax, (metric, part) in zip(fig.subplots(1, len(parts), squeeze=False).flat, parts):
        y = part["ratio"].to_numpy()
        err = np.nan_to_num(np.abs(np.stack([y - part["ratio_ci95_low"], part["ratio_ci95_high"] - y])))
        ax.errorbar(range(len(part)), y, yerr=err, fmt="o", capsize=3)
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xticks(range(len(part)), part["config"], rotation=30, ha="right", fontsize=6)
        ax.set(title=metric, ylabel="B / A")
    save_figure(fig, "B / A with 95% CI", path)


def cli(argv: list[str] | None = None) -> int:
    description = "Two sweeps side by side: each metric's ratio B/A with a 95% CI from the repeats."
    parser = argparse.ArgumentParser("python -m nanoexp.experiment.report.compare", description=description)
    parser.add_argument("sweep_a", type=Path)
    parser.add_argument("sweep_b", type=Path)
    parser.add_argument("--metrics", default=",".join(METRICS), help="comma-separated summary keys")
    parser.add_argument("--out", type=Path, help="where compare.md/.csv/.png go (default: SWEEP_B)")
    args = parser.parse_args(argv)
    for sweep in (args.sweep_a, args.sweep_b):
        if not sweep.is_dir():
            parser.error(f"{sweep}: no such sweep dir")
    table, header = compare(args.sweep_a, args.sweep_b, [m for m in args.metrics.split(",") if m])
    out = args.out or args.sweep_b
    out.mkdir(parents=True, exist_ok=True)
    text = markdown(table, header)
    atomic_files.write_atomically(out / "compare.md", text)
    atomic_files.write_table(table, out / "compare.csv")
    plot(table, out / "compare.png")
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(cli())
