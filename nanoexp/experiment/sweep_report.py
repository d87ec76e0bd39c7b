"""Sweep report: a Hydra callback that tabulates and plots every job of a multirun.

Writes sweep_summary.csv, sweep_summary.md and one PNG per swept parameter (main metrics against
its values, one line per combination of the other swept parameters) into the sweep dir. Jobs that
failed (their results.json says so) or vanished (a job dir without results.json, or, for Hydra's
basic sweeper, an expected job without a dir) are listed too. When the launcher aborts the sweep
(e.g. submitit raising for a killed job), the report is still written at exit, after the jobs
that are still running have ended.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import pandas as pd
import yaml
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from nanoexp.experiment.local_sink import RESULTS_FILE

METRICS = [
    "output_throughput",
    "total_token_throughput",
    "mean_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "p99_itl_ms",
    "mean_e2el_ms",
    "peak_memory_bytes",
]
TABLE_METRICS = METRICS + ["mean_latency_ms", "duration_s", "num_preemptions", "prefix_cache_hit_rate"]


VANISHED = "vanished"
JOB_DIR = re.compile(r"^(\d+)(_|$)")


class SweepReport(Callback):
    def __init__(self) -> None:
        self.sweep_dir: Path | None = None
        self.expected: list[list[str]] | None = None
        self.reported = False

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        self.sweep_dir = Path(config.hydra.sweep.dir)
        self.expected = expected_jobs(config)
        wait_s = 60.0 * float(config.hydra.launcher.get("timeout_min", 0) or 0) + 60.0
        atexit.register(self._report_after_abort, wait_s)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        self.reported = True
        failed = report(Path(config.hydra.sweep.dir), self.expected)
        if failed:
            sys.exit(1)

    def _report_after_abort(self, wait_s: float) -> None:
        """The launcher raised, so on_multirun_end never ran: report what the jobs left."""
        if self.reported or self.sweep_dir is None:
            return
        wait_for_local_jobs(self.sweep_dir, wait_s)
        report(self.sweep_dir, self.expected)


def report(sweep_dir: Path, expected: list[list[str]] | None) -> int:
    """Writes the report; prints where, and how many jobs failed or vanished. Returns that count."""
    table = write_report(sweep_dir, expected)
    if table is None:
        return 0
    print(f"sweep report: {sweep_dir / 'sweep_summary.md'}", flush=True)
    failed = int((table["status"] != "ok").sum())
    if failed:
        print(f"nanoexp: {failed} of {len(table)} jobs failed or vanished (see {sweep_dir})", file=sys.stderr)
    return failed


def write_report(sweep_dir: Path, expected: list[list[str]] | None = None) -> pd.DataFrame | None:
    """Collect <job>/results.json under `sweep_dir`; write CSV, Markdown and plots."""
    table = collect(sweep_dir, expected)
    if table.empty:
        return None
    swept = swept_keys(table)
    table.to_csv(sweep_dir / "sweep_summary.csv", index=False)
    (sweep_dir / "sweep_summary.md").write_text(markdown(table, swept, str(sweep_dir)))
    for key in swept:
        plot(table, key, [k for k in swept if k != key], sweep_dir / f"sweep_{_slug(key)}.png")
    return table


def collect(sweep_dir: Path, expected: list[list[str]] | None = None) -> pd.DataFrame:
    rows = [_row(p) for p in sorted(sweep_dir.glob(f"*/{RESULTS_FILE}"))]
    rows += vanished_rows(sweep_dir, expected, {r["job_num"] for r in rows}, {r["job_dir"] for r in rows})
    table = pd.DataFrame(rows)
    return table.sort_values("job_num", kind="stable") if not table.empty else table


def vanished_rows(sweep_dir: Path, expected: list[list[str]] | None, nums: set, dirs: set) -> list[dict]:
    """Jobs with a dir but no results.json, and expected jobs without a dir."""
    rows = []
    for path in sorted(p for p in sweep_dir.iterdir() if p.is_dir() and JOB_DIR.match(p.name)):
        num = int(JOB_DIR.match(path.name).group(1))
        if path.name not in dirs and num not in nums:
            error = "no results.json: the job died before writing it"
            rows.append(_vanished(num, path.name, _overrides_of(path, expected, num), error))
            nums = nums | {num}
    for num, overrides in enumerate(expected or []):
        if num not in nums:
            rows.append(_vanished(num, "", overrides, "no job dir: the job never started"))
    return rows


def _vanished(num: int, job_dir: str, overrides: list[str], error: str) -> dict:
    row = {"job_num": num, "job_dir": job_dir, **_parse_overrides(overrides)}
    return row | {"status": VANISHED, "error": error}


def _overrides_of(job_dir: Path, expected: list[list[str]] | None, num: int) -> list[str]:
    saved = job_dir / ".hydra" / "overrides.yaml"
    if saved.is_file():
        return list(yaml.safe_load(saved.read_text()) or [])
    return expected[num] if expected and num < len(expected) else []


def expected_jobs(config: DictConfig) -> list[list[str]] | None:
    """The overrides of every job Hydra's basic sweeper will launch; None for other sweepers."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    sweeper = config.hydra.get("sweeper", {})
    if not str(sweeper.get("_target_", "")).endswith("BasicSweeper"):
        return None
    params = [f"{k}={v}" for k, v in (sweeper.get("params") or {}).items()]
    try:
        parsed = OverridesParser.create().parse_overrides(params + list(config.hydra.overrides.task))
        return [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]
    except Exception:  # noqa: BLE001 - a sweep Hydra can run but we cannot expand: no expected list
        return None


def wait_for_local_jobs(sweep_dir: Path, wait_s: float) -> None:
    """Waits (at most `wait_s`, then terminates them) for this process's submitit jobs still
    running, so none outlives the sweep; submitit names a local job's folder after its pid."""
    deadline = time.monotonic() + wait_s
    pids = [int(p.name) for p in (sweep_dir / ".submitit").glob("*") if p.name.isdigit()]
    while pids and time.monotonic() < deadline:
        pids = [pid for pid in pids if _running_child(pid)]
        time.sleep(0.2 if pids else 0)
    for pid in pids:
        if _running_child(pid):
            os.kill(pid, signal.SIGTERM)


def _running_child(pid: int) -> bool:
    try:
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:  # not our child, or already reaped
        return False


def _row(path: Path) -> dict:
    try:
        results = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        match = JOB_DIR.match(path.parent.name)
        num = int(match.group(1)) if match else -1
        overrides = _overrides_of(path.parent, None, num)
        return _vanished(num, path.parent.name, overrides, f"unreadable {RESULTS_FILE}: {err}")
    job = results.get("job", {})
    row = {"job_num": job.get("job_num", -1), "job_dir": path.parent.name}
    row |= _parse_overrides(job.get("overrides", []))
    row |= {"status": results.get("status", "?"), "error": results.get("summary", {}).get("error", "")}
    summary = results.get("summary", {})
    return row | {k: summary.get(k) for k in TABLE_METRICS if k in summary}


def _parse_overrides(overrides: list[str]) -> dict:
    pairs = (o.lstrip("+~").split("=", 1) for o in overrides if "=" in o)
    return {f"param:{k}": v for k, v in pairs if not k.startswith("hydra")}


def swept_keys(table: pd.DataFrame) -> list[str]:
    """Override columns whose value differs between jobs."""
    params = [c for c in table.columns if c.startswith("param:")]
    return [c for c in params if table[c].astype(str).nunique() > 1]


def markdown(table: pd.DataFrame, swept: list[str], title: str) -> str:
    metrics = [m for m in TABLE_METRICS if m in table.columns]
    errors = ["error"] if (table["status"] != "ok").any() else []
    shown = table[["job_num", *swept, "status", *metrics, *errors]].rename(
        columns=lambda c: c.removeprefix("param:")
    )
    header = "| " + " | ".join(shown.columns) + " |"
    rule = "|" + "|".join("---" for _ in shown.columns) + "|"
    body = ["| " + " | ".join(_cell(v) for v in row) + " |" for row in shown.itertuples(index=False)]
    return "\n".join([f"# Sweep {title}", "", header, rule, *body, ""])


def plot(table: pd.DataFrame, key: str, others: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = [m for m in METRICS if m in table.columns and table[m].notna().any()]
    if not metrics:
        return
    ok = table[table["status"] == "ok"].copy()
    ok["_x"] = _axis(ok[key])
    ncols = min(4, len(metrics))
    nrows = -(-len(metrics) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.4 * ncols, 2.9 * nrows), squeeze=False)
    groups = list(ok.groupby(others, dropna=False)) if others else [("all", ok)]
    for ax, metric in zip(axes.flat, metrics):
        for label, part in groups:
            part = part.sort_values("_x")
            ax.plot(part["_x"], part[metric], marker="o", label=_label(others, label))
        ax.set_title(metric, fontsize=9)
        ax.set_xlabel(key.removeprefix("param:"), fontsize=8)
        ax.tick_params(labelsize=7)
        _log2_axis(ax, ok["_x"])
    for ax in list(axes.flat)[len(metrics) :]:
        ax.set_visible(False)
    if others:
        axes.flat[0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _log2_axis(ax, x: pd.Series) -> None:
    """Powers of two spanning 8x or more (block sizes, batch sizes) read best on a log2 axis."""
    if pd.api.types.is_numeric_dtype(x) and (x > 0).all() and x.max() >= 8 * x.min():
        ax.set_xscale("log", base=2)


def _axis(values: pd.Series) -> pd.Series:
    numeric = pd.to_numeric(values, errors="coerce")
    return numeric if numeric.notna().all() else values.astype(str)


def _label(others: list[str], label) -> str:
    if not others:
        return ""
    values = label if isinstance(label, tuple) else (label,)
    return ", ".join(f"{k.removeprefix('param:')}={v}" for k, v in zip(others, values))


def _cell(v) -> str:
    if isinstance(v, float) and v != v:  # NaN: a failed job has no metrics
        return ""
    if isinstance(v, float):
        return f"{v:.4g}"
    return "" if v is None else str(v)


def _slug(key: str) -> str:
    return key.removeprefix("param:").replace("/", "_").replace(".", "_")
