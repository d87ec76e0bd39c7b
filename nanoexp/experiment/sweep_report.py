"""Sweep report: a Hydra callback that tabulates and plots every job of a multirun.

Writes sweep_summary.csv, sweep_summary.md and one PNG per swept parameter (main metrics against
its values, one line per combination of the other swept parameters) into the sweep dir.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
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


class SweepReport(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        table = write_report(sweep_dir)
        if table is None:
            return
        print(f"sweep report: {sweep_dir / 'sweep_summary.md'}", flush=True)
        failed = int((table["status"] != "ok").sum())
        if failed:
            print(f"nanoexp: {failed} of {len(table)} jobs failed (see {sweep_dir})", file=sys.stderr)
            sys.exit(1)


def write_report(sweep_dir: Path) -> pd.DataFrame | None:
    """Collect <job>/results.json under `sweep_dir`; write CSV, Markdown and plots."""
    table = collect(sweep_dir)
    if table.empty:
        return None
    swept = swept_keys(table)
    table.to_csv(sweep_dir / "sweep_summary.csv", index=False)
    (sweep_dir / "sweep_summary.md").write_text(markdown(table, swept, str(sweep_dir)))
    for key in swept:
        plot(table, key, [k for k in swept if k != key], sweep_dir / f"sweep_{_slug(key)}.png")
    return table


def collect(sweep_dir: Path) -> pd.DataFrame:
    rows = [_row(p) for p in sorted(sweep_dir.glob(f"*/{RESULTS_FILE}"))]
    table = pd.DataFrame(rows)
    return table.sort_values("job_num", kind="stable") if not table.empty else table


def _row(path: Path) -> dict:
    results = json.loads(path.read_text())
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
