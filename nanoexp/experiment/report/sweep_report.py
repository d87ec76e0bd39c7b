"""Sweep report: the table and plots of every job of a multirun (at its end, or redrawn from its dirs)."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import pandas as pd
import yaml
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from omegaconf import DictConfig, OmegaConf

from nanoexp.config.checks import is_real
from nanoexp.experiment.metrics.summarize import HEADLINE, aggregate_repeats
from nanoexp.experiment.report import sweep_plots
from nanoexp.experiment.runtime import atomic_files
from nanoexp.experiment.runtime.job_info import sweep_group, sweep_overrides
from nanoexp.experiment.schema import LoggerConfig, LoggerKind
from nanoexp.experiment.sinks.local import RESULTS_FILE, first_line, json_safe, read_results
from nanoexp.experiment.sinks.summary_table import interval_suffix
from nanoexp.experiment.sinks.wandb_sink import finish_run, run_dir, start_run

HIGHER_IS_BETTER = ("output_throughput", "total_token_throughput", "request_goodput")
LOWER_IS_BETTER = (
    "mean_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "p99_itl_ms",
    "mean_e2el_ms",
    "mean_latency_ms",
)
METRICS = [*HIGHER_IS_BETTER, *LOWER_IS_BETTER[:-1], "peak_memory_bytes"]  # the plots' and the table's
RATES = ["offered_request_rate", "request_throughput", "slo_attainment"]  # slo_attainment only with SLOs
TABLE_METRICS = [*RATES, *METRICS, "mean_latency_ms", "duration_s", "num_preemptions"]
TABLE_METRICS += ["prefix_cache_hit_rate", "kv_quality/greedy_agreement"]
TABLE_METRICS += ["kv_quality/kl_mean", "kv_quality/kl_max"]
TABLE_METRICS += ["weight_quality/greedy_agreement", "weight_quality/kl_mean", "weight_quality/kl_max"]
TABLE_METRICS += ["capacity_request_rate", "capacity_bracket_low", "capacity_bracket_high"]
CONTEXT = ("model", "workload", "repeats")  # from each job's summary, for titles
CI = ("_ci95_low", "_ci95_high")
NOISE = "noise_warning"  # a job's noise flags (repeats.noise_flags)
RUN_CONTROL = {"append_to_sweep"}
TRIAL = "param:trial"  # the interleaved pass of a configuration (see pool_trials)
JOB_DIR = re.compile(r"^(\d+)(_|$)")
TURN_METRIC = re.compile(r"^(turn\d+_(mean_ttft_ms|prefix_hit_rate)|followup_prefix_hit_rate)$")  # multi_turn
JOB_TYPE, TABLE_KEY = "sweep-report", "sweep_table"  # of the sweep-level W&B run


def wandb_target(config: DictConfig) -> tuple[LoggerConfig, str] | None:
    """(LoggerConfig, group) of the sweep-level W&B run, or None with logger=none."""
    plain = cast(dict, OmegaConf.to_container(config.logger, resolve=True, enum_to_str=True))
    if plain.get("kind") != LoggerKind.wandb.value:
        return None
    cfg = LoggerConfig(**(plain | {"kind": LoggerKind.wandb}))
    return cfg, cfg.group or sweep_group(str(Path(config.hydra.sweep.dir)))


def expected_jobs(config: DictConfig) -> list[list[str]] | None:
    """The overrides of every job Hydra's basic sweeper will launch; None for other sweepers."""
    if not str(config.hydra.get("sweeper", {}).get("_target_", "")).endswith("BasicSweeper"):
        return None
    try:
        return [job for batch in BasicSweeper.split_arguments(sweep_overrides(config), None) for job in batch]
    except Exception:  # noqa: BLE001 - a sweep Hydra can run but we cannot expand: no expected list
        return None


def report(sweep_dir: Path, expected: list[list[str]] | None, wandb=None, metrics: Sequence[str] = ()) -> int:
    """Writes the report; prints where, and how many jobs failed or vanished. Returns that count."""
    table = write_report(sweep_dir, expected, metrics)
    if table is None:
        return 0
    if wandb is not None:
        log_sweep(sweep_dir, table, *wandb)
    print(f"sweep report: {sweep_dir / 'sweep_summary.md'}", flush=True)
    failed = int((table["status"] != "ok").sum())
    if failed:
        print(f"nanoexp: {failed} of {len(table)} jobs failed or vanished (see {sweep_dir})", file=sys.stderr)
    return failed


def write_report(
    sweep_dir: Path, expected: list[list[str]] | None = None, metrics: Sequence[str] = ()
) -> pd.DataFrame | None:
    """sweep_summary.csv and .md and the plots from the jobs' results.json, with `metrics` beside the main."""
    extra = [m for m in metrics if m not in METRICS]
    jobs = collect(sweep_dir, expected, extra)
    if jobs.empty:
        return None
    extra += sorted((c for c in jobs.columns if TURN_METRIC.match(c)), key=lambda c: (len(c), c))
    table = mark_noise(pool_trials(jobs, sweep_dir))
    swept = swept_keys(table)
    atomic_files.write_table(table, sweep_dir / "sweep_summary.csv")
    title = plot_title(table, swept)
    serving = sweep_plots.serving_report(table, swept, title, sweep_dir)
    summary_md = markdown(table, swept, str(sweep_dir), title, serving, extra)
    atomic_files.write_atomically(sweep_dir / "sweep_summary.md", summary_md)
    for key in swept:
        others = [k for k in swept if k != key]
        slug = key.removeprefix("param:").replace("/", "_").replace(".", "_")
        sweep_plots.plot_param(table, [*METRICS, *extra], key, others, title, sweep_dir / f"sweep_{slug}.png")
    cdf = sweep_dir / "sweep_latency_cdf.png"
    sweep_plots.plot_latency_cdf(job_requests(sweep_dir, jobs, swept_keys(jobs)), title, cdf)
    return table


def pool_trials(table: pd.DataFrame, sweep_dir: Path) -> pd.DataFrame:
    """With `trial` swept, one row per configuration, its CIs over every repeat of its finished trials."""
    if TRIAL not in swept_keys(table):
        return table
    ok = table[table["status"] == "ok"]
    keys = [k for k in swept_keys(table) if k != TRIAL]
    pooled = []
    for _, part in ok.groupby(keys, dropna=False, sort=False) if keys else [((), ok)]:
        row = part.iloc[0].to_dict() | {TRIAL: ",".join(map(str, part[TRIAL]))}
        numeric = [c for c in part.columns if c != "job_num" and pd.api.types.is_numeric_dtype(part[c])]
        row |= {c: part[c].mean() for c in numeric if not c.endswith(CI)}
        row[NOISE] = "; ".join(dict.fromkeys(w for w in part[NOISE].fillna("") if w))
        results = [read_results(sweep_dir / str(d) / RESULTS_FILE) for d in part["job_dir"]]
        repeats = [r for res in results for r in res.get("summary", {}).get("per_repeat") or []]
        pooled_repeats = aggregate_repeats(repeats) if repeats else {}
        headline = [f"{key}{suffix}" for key in HEADLINE for suffix in ("", "_std", *CI)]
        row |= {k: pooled_repeats[k] for k in headline if is_real(pooled_repeats.get(k))}
        row["repeats"] = len(repeats)
        pooled.append(row)
    rest = table[table["status"] != "ok"]
    return pd.concat([pd.DataFrame(pooled), rest], ignore_index=True).sort_values("job_num", kind="stable")


def plot_title(table: pd.DataFrame, swept: list[str]) -> str:
    """Model, workload and the settings every job shared (the overrides not swept)."""
    ok = table[table["status"] == "ok"]
    first = (ok if not ok.empty else table).iloc[0]
    context = [f"{k} {first[k]}" for k in CONTEXT if k in table.columns and pd.notna(first[k])]
    fixed = {c.removeprefix("param:"): first[c] for c in table.columns.drop(swept) if c.startswith("param:")}
    settings = [f"{k}={v}" for k, v in fixed.items() if k not in CONTEXT and pd.notna(v)]
    return " | ".join([", ".join(context), "fixed: " + (" ".join(settings) or "defaults")])


def job_requests(sweep_dir: Path, table: pd.DataFrame, swept: list[str]) -> list[tuple[str, pd.DataFrame]]:
    """(label, requests.csv rows) of every repeat of every finished job: one latency CDF per repeat."""
    out = []
    for _, row in table[table["status"] == "ok"].iterrows():
        path = sweep_dir / str(row["job_dir"]) / "requests.csv"
        if not path.is_file():
            continue
        label = ", ".join(f"{k.removeprefix('param:')}={row[k]}" for k in swept) or str(row["job_dir"])
        repeats = list(pd.read_csv(path).groupby("repeat", sort=True))
        out += [(label if len(repeats) == 1 else f"{label} r{r}", part) for r, part in repeats]
    return out


def mark_noise(table: pd.DataFrame) -> pd.DataFrame:
    """`noise:<metric>`: "best", "within noise" (CI overlaps the best row's) or "" (with repeats)."""
    table = table.copy()
    ok = table["status"] == "ok"
    for metric in HIGHER_IS_BETTER + LOWER_IS_BETTER:
        low, high = (f"{metric}{s}" for s in CI)
        if low not in table.columns or table.loc[ok, low].isna().all():
            continue
        values = pd.to_numeric(table.loc[ok, metric])
        best = values.idxmax() if metric in HIGHER_IS_BETTER else values.idxmin()
        overlaps = (table[low] <= table.at[best, high]) & (table[high] >= table.at[best, low]) & ok
        table[f"noise:{metric}"] = overlaps.map({True: "within noise", False: ""})
        table.at[best, f"noise:{metric}"] = "best"
    return table


def collect(
    sweep_dir: Path, expected: list[list[str]] | None = None, metrics: Sequence[str] = ()
) -> pd.DataFrame:
    """One row per job (its swept values, status, the table's metrics and `metrics`), vanished ones too."""
    # at any depth: an override value with a slash (workload.path=a/b.jsonl) nests Hydra's job dir
    found = {path: read_results(path) for path in sorted(sweep_dir.rglob(RESULTS_FILE))}
    rows = [_row(path, sweep_dir, results, metrics) for path, results in found.items() if results]
    nums, dirs = {r["job_num"] for r in rows}, {r["job_dir"] for r in rows}
    for path in sorted(p for p in sweep_dir.iterdir() if p.is_dir() and JOB_DIR.match(p.name)):
        match = JOB_DIR.match(path.name)
        assert match is not None  # the loop takes only the dirs it matches
        num = int(match.group(1))
        if path.name not in dirs and num not in nums:
            saved = path / ".hydra" / "overrides.yaml"  # else the ones Hydra was to launch it with
            listed = expected[num] if expected and num < len(expected) else []
            overrides = list(yaml.safe_load(saved.read_text()) or []) if saved.is_file() else listed
            error = "no readable results.json: the job died before writing it"
            rows.append(_vanished(num, path.name, overrides, error))
            nums.add(num)
    for num, overrides in enumerate(expected or []):
        if num not in nums:
            rows.append(_vanished(num, "", overrides, "no job dir: the job never started"))
    return pd.DataFrame(sorted(rows, key=lambda row: row["job_num"]))


def _vanished(num: int, job_dir: str, overrides: list[str], error: str) -> dict:
    row = {"job_num": num, "job_dir": job_dir, **parse_overrides(overrides)}
    return row | {"status": "vanished", "error": error}


def _row(path: Path, sweep_dir: Path, results: dict, extra: Sequence[str] = ()) -> dict:
    job, summary = results.get("job", {}), results.get("summary", {})
    row = {"job_num": job.get("job_num", -1), "job_dir": str(path.parent.relative_to(sweep_dir))}
    row |= parse_overrides(job.get("overrides", []))
    row |= {"status": results.get("status", "?"), "error": summary.get("error", "")}
    metrics = [*dict.fromkeys([*TABLE_METRICS, *sweep_plots.SERVING_METRICS, *extra])]
    keys = [*CONTEXT, *metrics, *(m + s for m in metrics for s in CI)]
    number = lambda v: float(v) if v in ("inf", "-inf") else v  # results.json spells inf "inf" (strict JSON)
    row |= {k: number(summary[k]) for k in keys if k in summary}
    row |= {k: v for k, v in summary.items() if TURN_METRIC.match(k)}
    row[NOISE] = summary.get(NOISE, "")
    slo = results.get("config", {}).get("metrics", {}).get("slo") or {}
    return row | {f"slo:{k}": v for k, v in slo.items() if v is not None}


def parse_overrides(overrides: list[str]) -> dict:
    """A job's settings from its overrides; Hydra's own and the run-control flags (where results go,
    not what the job measures) are left out, so a job appended to a sweep is not a point of a sweep."""
    pairs = (o.lstrip("+~").split("=", 1) for o in overrides if "=" in o)
    return {f"param:{k}": v for k, v in pairs if not k.startswith("hydra") and k not in RUN_CONTROL}


def swept_keys(table: pd.DataFrame) -> list[str]:
    """Override columns whose value differs between jobs."""
    return [c for c in table.columns if c.startswith("param:") and table[c].astype(str).nunique() > 1]


def markdown(
    table: pd.DataFrame,
    swept: list,
    title: str,
    where: str = "",
    lines: list | None = None,
    extra: Sequence = (),
) -> str:
    """The table with `mean ± CI half-width` cells (**bold**: a metric's best row, ≈: within noise of
    it); `lines` (such as the max rate meeting the SLOs) above it, `extra` metrics after the main."""
    metrics = [m for m in dict.fromkeys([*TABLE_METRICS, *extra]) if m in table.columns]
    errors = ["error"] if (table["status"] != "ok").any() else []
    noisy = [NOISE] if NOISE in table.columns and table[NOISE].fillna("").astype(bool).any() else []
    columns = ["job_num", *swept, "status", *metrics, *errors, *noisy]
    header = "| " + " | ".join(c.removeprefix("param:") for c in columns) + " |"
    rule = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(_metric_cell(row, c) for c in columns) + " |" for _, row in table.iterrows()]
    notes = [where] if where else []
    if any(c.startswith("noise:") for c in table.columns):
        notes.append(
            "mean ± 95% CI half-width over repeats ([low, high] where the CI stops at 0); **bold**: "
            "best row, ≈: CI overlaps the best row's (within noise)"
        )
    if noisy:
        notes.append(f"{NOISE}: the job's machine was busy or its CIs are wide (metrics.noise)")
    lines = [*(f"- {line}" for line in lines), ""] if lines else []
    return "\n".join([f"# Sweep {title}", "", *notes, "", *lines, header, rule, *body, ""])


def _metric_cell(row: pd.Series, column: str) -> str:
    v = row.get(column)  # NaN: a failed job has no metrics
    text = "" if pd.isna(v) else f"{v:.4g}" if isinstance(v, float) else str(v)
    low, high = row.get(f"{column}{CI[0]}"), row.get(f"{column}{CI[1]}")
    if text and pd.notna(low) and pd.notna(high):
        text += interval_suffix(float(row[column]), low, high, lambda v: f"{v:.3g}")
    mark = row.get(f"noise:{column}", "")
    return f"**{text}**" if mark == "best" else f"≈{text}" if mark == "within noise" else text


def log_sweep(sweep_dir: Path, table: pd.DataFrame, cfg: LoggerConfig, group: str) -> str | None:
    """The sweep-level W&B run (table, plots, swept values); None after one warning line if W&B failed."""
    swept = swept_keys(table)
    try:
        import wandb

        # the distinct swept values, typed as in the table (16, not '16')
        values = {k.removeprefix("param:"): list(dict.fromkeys(typed(table[k]).dropna())) for k in swept}
        config = json_safe(values) | {"sweep_dir": str(sweep_dir), "num_jobs": len(table)}
        config["swept_keys"] = [k.removeprefix("param:") for k in swept]
        run, env_set = start_run(cfg, sweep_dir, config, group, "sweep-report", JOB_TYPE)
        try:
            run.log({TABLE_KEY: wandb.Table(dataframe=_loggable(table))})
            run.log({f"plots/{p.stem}": wandb.Image(str(p)) for p in sorted(sweep_dir.glob("sweep_*.png"))})
            run.summary.update({"num_jobs": len(table), "num_failed": int((table["status"] != "ok").sum())})
            return run_dir(run)
        finally:
            finish_run(run, env_set)
    except Exception as err:  # noqa: BLE001 - the local report stands on its own
        print(f"wandb: warning: no sweep-level run ({first_line(err)})", file=sys.stderr)
        return None


def typed(column: pd.Series) -> pd.Series:
    """An override column (command-line text) as numbers or booleans when every value is one, else
    unchanged; as Python objects (pandas would turn ints beside a None into floats)."""
    present = column.dropna().astype(str)
    if len(present) and pd.to_numeric(present, errors="coerce").notna().all():
        convert: Callable[[Any], Any] = int if present.str.fullmatch(r"[+-]?\d+").all() else float
    elif len(present) and present.str.lower().isin(("true", "false")).all():
        convert = lambda v: str(v).lower() == "true"
    else:
        return column
    values = [None if v is None or v != v else convert(v) for v in column]
    return pd.Series(values, index=column.index, dtype=object)


def _loggable(table: pd.DataFrame) -> pd.DataFrame:
    """What wandb.Table takes: one column per key, swept values typed, text as str, None for missing."""
    params = [c for c in table.columns if c.startswith("param:")]
    shadowed = [c.removeprefix("param:") for c in params if c.removeprefix("param:") in table.columns]
    out = table.drop(columns=shadowed)
    for col in [c for c in out.columns if c not in params]:
        if not pd.api.types.is_numeric_dtype(out[col]):
            out[col] = out[col].map(lambda v: "" if pd.isna(v) else str(v))
    for col in params:
        out[col] = typed(out[col]).astype(object)
    return out.rename(columns=lambda c: c.removeprefix("param:"))


def cli(argv: list[str] | None = None) -> int:
    """The report of a sweep dir from what its jobs left (and `multirun.yaml`), as at the sweep's end."""
    description = "Redraw a sweep's report (sweep_summary.csv/.md and plots) from its job dirs."
    parser = argparse.ArgumentParser(
        "python -m nanoexp.experiment.report.sweep_report", description=description
    )
    parser.add_argument("sweep_dir", type=Path)
    parser.add_argument("--metrics", help="comma-separated summary keys (default: the jobs' report.metrics)")
    parser.add_argument("--wandb", action="store_true", help="also log a sweep-level W&B run")
    args = parser.parse_args(argv)
    if not args.sweep_dir.is_dir():
        parser.error(f"{args.sweep_dir}: no such sweep dir")
    saved = args.sweep_dir / "multirun.yaml"
    config = cast(DictConfig, OmegaConf.load(saved)) if saved.is_file() else None
    if args.metrics is not None:
        metrics = [m for m in args.metrics.split(",") if m]
    else:
        configs = (read_results(path).get("config") for path in sorted(args.sweep_dir.rglob(RESULTS_FILE)))
        first: dict = next((c for c in configs if c), {})
        metrics = list((first.get("report") or {}).get("metrics") or [])
    expected = expected_jobs(config) if config is not None else None
    target = wandb_target(config) if args.wandb and config is not None else None
    return 1 if report(args.sweep_dir, expected, target, metrics) else 0


if __name__ == "__main__":
    sys.exit(cli())
