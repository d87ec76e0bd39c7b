"""Two sweeps side by side (`python -m nanoexp.experiment.report.compare SWEEP_A SWEEP_B`): configurations
matched by their swept values, each metric's ratio B/A with a 95% CI over independent runs (trial_stats)
and a verdict, in compare.md/.csv/.png. A run flagged busy is shown but not judged."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from nanoexp.config.checks import is_real
from nanoexp.experiment.metrics import registry
from nanoexp.experiment.metrics.trial_stats import MIN_TRIALS, NOT_ENOUGH, WITHHELD, ratio_interval, verdict
from nanoexp.experiment.report.sweep_plots import figure, save_figure
from nanoexp.experiment.report.sweep_report import TRIAL, parse_overrides, swept_keys
from nanoexp.experiment.runtime import atomic_files
from nanoexp.experiment.sinks.local import RESULTS_FILE, read_results

METRICS = registry.names(registry.COMPARE)


class CompareError(ValueError):
    """Nothing to compare, or a metric no job has: an error, not an empty report."""


def load_jobs(sweep_dir: Path) -> list[dict]:
    """Each configuration of the sweep: its overrides as `param:` keys, its commit and its runs (`trials`:
    one summary per finished job, so the jobs that differ only in `trial`, or a configuration appended
    again, are its independent runs)."""
    jobs: dict[tuple, dict] = {}
    for path in sorted(sweep_dir.rglob(RESULTS_FILE)):
        results = read_results(path)
        if results.get("status") != "ok":
            continue
        git = results.get("config", {}).get("resolved", {}).get("provenance", {}).get("git", {})
        params = parse_overrides(results.get("job", {}).get("overrides", []))
        params.pop(TRIAL, None)
        first = {"params": params, "trials": [], "commit": git.get("commit")}
        jobs.setdefault(tuple(sorted(params.items())), first)["trials"].append(results.get("summary", {}))
    return list(jobs.values())


def ratio(a: list[float], b: list[float], min_runs: int = 2) -> tuple[float, float, float]:
    """mean(b) / mean(a) and its 95% interval, the samples being independent runs' means (trial_stats)."""
    return ratio_interval(a, b, min_runs)


def compare(
    sweep_a: Path, sweep_b: Path, metrics: list[str] = METRICS, min_trials: int = MIN_TRIALS
) -> tuple[pd.DataFrame, list[str]]:
    """One row per job pair that agrees on the keys either sweep varies, and metric; and the header lines
    (sweeps, commits, unmatched jobs). Raises CompareError when nothing matched or a metric is unknown."""
    jobs_a, jobs_b = load_jobs(sweep_a), load_jobs(sweep_b)
    written = {k for job in jobs_a + jobs_b for trial in job["trials"] for k in trial}
    registry.check_names(metrics, written)
    params = [pd.DataFrame([j["params"] for j in jobs]) for jobs in (jobs_a, jobs_b)]
    keys = sorted({key for table in params for key in swept_keys(table)})
    by_values = {tuple(j["params"].get(k) for k in keys): j for j in jobs_a}
    pairs = [(by_values.get(tuple(b["params"].get(k) for k in keys)), b) for b in jobs_b]
    pairs = [(a, b) for a, b in pairs if a is not None]
    if not pairs:
        raise CompareError(
            f"no configuration of {sweep_b} matches one of {sweep_a} on the keys either sweep varies "
            f"({', '.join(k.removeprefix('param:') for k in keys) or 'none'}; "
            f"{len(jobs_a)} and {len(jobs_b)} finished configurations)"
        )
    rows = []
    for a, b in pairs:
        config = ", ".join(f"{k.removeprefix('param:')}={b['params'].get(k)}" for k in keys) or "all"
        assert a is not None  # pairs hold matched configurations only
        rows += [_metric_row(config, metric, a, b, min_trials) for metric in metrics]
    table = pd.DataFrame([r for r in rows if r is not None])
    if table.empty:
        raise CompareError(f"the matched jobs recorded none of {', '.join(metrics)}")
    names = ", ".join(k.removeprefix("param:") for k in keys) or "nothing swept"
    unmatched = f"{len(jobs_a) - len(pairs)} of A and {len(jobs_b) - len(pairs)} of B unmatched"
    header = [
        f"A: {sweep_a} ({_commits(jobs_a)})",
        f"B: {sweep_b} ({_commits(jobs_b)})",
        f"{len(pairs)} configurations matched on {names}; {unmatched}",
        f"intervals over independent runs (trials), at least {min_trials} clean runs a side for a verdict",
    ]
    return table, header


def _metric_row(config: str, metric: str, a: dict, b: dict, min_trials: int) -> dict | None:
    (clean_a, noisy_a), (clean_b, noisy_b) = _run_values(a, metric), _run_values(b, metric)
    if not clean_a + noisy_a or not clean_b + noisy_b:
        return None
    value, low, high = ratio_interval(clean_a, clean_b, min_trials)
    said = verdict(value, low, high, registry.better(metric))
    if (
        said == NOT_ENOUGH
        and (noisy_a or noisy_b)
        and min(len(clean_a + noisy_a), len(clean_b + noisy_b)) >= min_trials
    ):
        said = WITHHELD  # enough runs, but too few of them clean
    if math.isnan(value):  # every run of a side was flagged: the ratio of all of them, shown, not judged
        value = ratio_interval(clean_a + noisy_a, clean_b + noisy_b, 10**9)[0]
    return {
        "config": config,
        "metric": metric,
        "a": float(np.mean(clean_a or noisy_a)),
        "b": float(np.mean(clean_b or noisy_b)),
        "ratio": value,
        "ratio_ci95_low": low,
        "ratio_ci95_high": high,
        "significant": said not in ("within noise", NOT_ENOUGH, WITHHELD),
        "verdict": said,
        "runs": f"{len(clean_a)}/{len(clean_b)}",
        "noisy_runs": f"{len(noisy_a)}/{len(noisy_b)}",
        "repeats": f"{_repeats(a)}/{_repeats(b)}",
    }


def _run_values(job: dict, metric: str) -> tuple[list[float], list[float]]:
    """The metric's value in each run of the configuration: (clean runs, runs flagged busy)."""
    clean: list[float] = []
    noisy: list[float] = []
    for summary in job["trials"]:
        value = summary.get(metric)
        if is_real(value) and value == value:
            (noisy if summary.get("noise_busy_repeats") else clean).append(float(value))
    return clean, noisy


def _repeats(job: dict) -> int:
    return sum(int(s.get("repeats", 1) or 1) for s in job["trials"])


def _commits(jobs: list[dict]) -> str:
    commits = sorted({str(j["commit"])[:12] for j in jobs if j.get("commit")})
    return "commit " + ", ".join(commits) if commits else "commit unknown"


def markdown(table: pd.DataFrame, header: list[str]) -> str:
    lines = ["# Compare B against A", "", *(f"- {h}" for h in header), ""]
    lines += ["| config | metric | A | B | B/A (95% CI) | verdict | runs A/B | noisy runs |"]
    lines += ["|---|---|---|---|---|---|---|---|"]
    for _, r in table.iterrows():
        ci = f" ({r.ratio_ci95_low:.3f}-{r.ratio_ci95_high:.3f})" if pd.notna(r.ratio_ci95_low) else ""
        cell = f"**{r.ratio:.3f}**" if r.significant else f"{r.ratio:.3f}"
        a, b = registry.display(r.metric, r.a), registry.display(r.metric, r.b)
        unit = registry.unit(r.metric)[0]
        name = f"{r.metric} ({unit})" if unit else r.metric
        lines.append(
            f"| {r.config} | {name} | {a} | {b} | {cell}{ci} | {r.verdict} | {r.runs} | {r.noisy_runs} |"
        )
    notes = [
        "**bold**: the interval excludes 1 (beyond noise)",
        f"{NOT_ENOUGH}: fewer clean runs a side than a verdict needs; run more trials (`-m trial=0,1,2 ...`)",
        f"{WITHHELD}: runs flagged busy (metrics.noise) are shown in A/B but left out of the verdict",
    ]
    return "\n".join([*lines, "", *(f"- {n}" for n in notes), ""])


def plot(table: pd.DataFrame, path: Path) -> None:
    """One panel per metric: B/A per configuration with its interval, a line at 1; titles in words with
    the unit and which way is better; a verdict withheld or without enough runs drawn hollow."""
    if table.empty:
        return
    parts = list(table.groupby("metric", sort=False))
    ncols = min(3, len(parts))
    nrows = -(-len(parts) // ncols)
    fig = figure(figsize=(3.6 * ncols, 3.4 * nrows))
    for ax, (metric, part) in zip(fig.subplots(nrows, ncols, squeeze=False).flat, parts):
        y = part["ratio"].to_numpy(dtype=float)
        err = np.nan_to_num(np.abs(np.stack([y - part["ratio_ci95_low"], part["ratio_ci95_high"] - y])))
        judged = ~part["verdict"].isin([NOT_ENOUGH, WITHHELD]).to_numpy()
        x = np.arange(len(part))
        ax.errorbar(x[judged], y[judged], yerr=err[:, judged], fmt="o", capsize=3, label="verdict")
        if (~judged).any():
            ax.plot(x[~judged], y[~judged], "o", mfc="none", color="grey", label="no verdict (runs)")
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xticks(x, part["config"], rotation=30, ha="right", fontsize=7)
        metric_info = registry.get(metric)
        words = metric_info.direction_words() if metric_info else ""
        ax.set(title=registry.title(metric), ylabel=f"B / A ({words})" if words else "B / A")
    for ax in fig.axes[len(parts) :]:
        ax.set_visible(False)
    save_figure(fig, "B / A with 95% CI over independent runs", path)


def cli(argv: list[str] | None = None) -> int:
    description = "Two sweeps side by side: each metric's ratio B/A with a 95% CI over independent runs."
    parser = argparse.ArgumentParser("python -m nanoexp.experiment.report.compare", description=description)
    parser.add_argument("sweep_a", type=Path)
    parser.add_argument("sweep_b", type=Path)
    parser.add_argument("--metrics", default=",".join(METRICS), help="comma-separated summary keys")
    parser.add_argument("--min-trials", type=int, default=MIN_TRIALS, help="clean runs a side for a verdict")
    parser.add_argument("--out", type=Path, help="where compare.md/.csv/.png go (default: SWEEP_B)")
    args = parser.parse_args(argv)
    for sweep in (args.sweep_a, args.sweep_b):
        if not sweep.is_dir():
            parser.error(f"{sweep}: no such sweep dir")
    if args.min_trials < 2:
        parser.error(f"--min-trials={args.min_trials}: at least 2 (an interval needs two runs a side)")
    metrics = [m for m in args.metrics.split(",") if m]
    try:
        table, header = compare(args.sweep_a, args.sweep_b, metrics, args.min_trials)
    except (CompareError, registry.UnknownMetric) as err:
        print(f"nanoexp: error: {err}", file=sys.stderr)
        return 2
    out = args.out or args.sweep_b
    text = markdown(table, header)
    try:
        out.mkdir(parents=True, exist_ok=True)
        atomic_files.write_atomically(out / "compare.md", text)
        atomic_files.write_table(table, out / "compare.csv")
        plot(table, out / "compare.png")
    except OSError as err:  # one line, as run.py's: the comparison is printed but cannot be kept
        print(text, end="")
        print(f"nanoexp: error: {atomic_files.unwritable(out, err, '--out')}", file=sys.stderr)
        return 1
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(cli())
