"""Sweep report: the table and plots of every job of a multirun (at its end, or redrawn from its dirs)."""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import pandas as pd
import yaml
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from omegaconf import DictConfig, OmegaConf

from nanoexp.experiment.metrics import registry
from nanoexp.experiment.metrics.trial_stats import MIN_TRIALS, run_interval
from nanoexp.experiment.report import sweep_plots
from nanoexp.experiment.runtime import atomic_files
from nanoexp.experiment.runtime.job_info import sweep_group, sweep_overrides
from nanoexp.experiment.schema import LoggerConfig, LoggerKind
from nanoexp.experiment.sinks.local import RESULTS_FILE, first_line, json_safe, read_results
from nanoexp.experiment.sinks.summary_table import interval_suffix
from nanoexp.experiment.sinks.wandb_sink import finish_run, run_dir, start_run

METRICS = registry.names(registry.PLOT)  # each plotted against every swept key
TABLE_METRICS = registry.names(registry.TABLE)
CONTEXT = ("model", "workload", "repeats")  # from each job's summary, for titles
CI = ("_ci95_low", "_ci95_high")
NOISE = "noise_warning"  # a job's noise flags (repeats.noise_flags)
BUSY = "noise_busy_repeats"  # a job with a busy repeat is shown, marked, and never used for a verdict
RUNS, NOISY_RUNS, BASIS = "runs", "noisy_runs", "interval"  # the runs a row rests on and what its CI spans
RUN_CONTROL = {"append_to_sweep"}
UNSET = "(default)"  # the value of a setting in a job that did not override it, beside jobs that did
TRIAL = "param:trial"  # the independent run of a configuration (see pool_trials)
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


class ReportError(RuntimeError):
    """The report could not be written: one `nanoexp: error:` line and a non-zero exit."""


def report(sweep_dir: Path, expected: list[list[str]] | None, wandb=None, metrics: Sequence[str] = ()) -> int:
    """Writes the report; prints where, and how many jobs failed or vanished. Returns that count, or 1
    after one `nanoexp: error:` line when the report itself failed."""
    try:
        table = write_report(sweep_dir, expected, metrics)
    except registry.UnknownMetric as err:
        print(f"nanoexp: error: {err}", file=sys.stderr, flush=True)
        return 1
    except Exception as err:  # noqa: BLE001 - a sweep whose report failed must not look finished
        print(
            f"nanoexp: error: sweep report of {sweep_dir} failed: {first_line(err)}",
            file=sys.stderr,
            flush=True,
        )
        return 1
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
    """sweep_summary.csv and .md and the plots from the jobs' results.json, with `metrics` beside the main.
    A metric neither in the registry nor in any job's summary raises UnknownMetric."""
    summaries = [read_results(path).get("summary", {}) for path in sorted(sweep_dir.rglob(RESULTS_FILE))]
    registry.check_names(metrics, {k for s in summaries for k in s}, "--metrics (report.metrics)")
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


def pool_trials(table: pd.DataFrame, sweep_dir: Path | None = None) -> pd.DataFrame:
    """One row per configuration: the jobs that differ only in `trial` (or ran the same settings again,
    appended) are its independent runs. Its values are the mean over its clean runs (over all when every
    run was flagged busy), and with MIN_TRIALS clean runs its CIs are over the runs' means (trial_stats);
    a configuration of one run keeps that run's CIs, which span its repeats only (column `interval`)."""
    table = table.copy()
    flagged = pd.to_numeric(table.get(BUSY, pd.Series(0, index=table.index)), errors="coerce").fillna(0) > 0
    table[NOISY_RUNS] = flagged.astype(int)
    table[RUNS] = 1 - table[NOISY_RUNS]
    table[BASIS] = table.get("repeats", pd.Series(1, index=table.index)).map(_within_run)
    ok = table[table["status"] == "ok"]
    keys = [k for k in _setting_keys(table) if k != TRIAL]
    groups = list(ok.groupby(keys, dropna=False, sort=False)) if keys else [((), ok)]
    if all(len(part) == 1 for _, part in groups):
        return table
    pooled = [_pool(part) if len(part) > 1 else part.iloc[0].to_dict() for _, part in groups]
    rest = table[table["status"] != "ok"]
    return pd.concat([pd.DataFrame(pooled), rest], ignore_index=True).sort_values("job_num", kind="stable")


def _within_run(repeats) -> str:
    n = int(repeats) if pd.notna(repeats) else 1
    return f"within 1 run ({n} repeats)" if n > 1 else "1 run, 1 repeat: none"


def _setting_keys(table: pd.DataFrame) -> list[str]:
    return [c for c in table.columns if c.startswith("param:")]


def _pool(part: pd.DataFrame) -> dict:
    """The row of one configuration from its runs (`part`: one finished job each)."""
    clean = part[part[NOISY_RUNS] == 0]
    used = clean if len(clean) else part
    row = part.iloc[0].to_dict()
    if TRIAL in part.columns:
        row[TRIAL] = ",".join(map(str, part[TRIAL]))
    numeric = [c for c in part.columns if c not in ("job_num", RUNS, NOISY_RUNS) and _is_numeric(part[c])]
    row |= {
        c: pd.to_numeric(used[c]).mean() for c in numeric if not c.endswith(CI) and not c.endswith("_std")
    }
    row[NOISE] = "; ".join(dict.fromkeys(w for w in part[NOISE].fillna("") if w))
    row |= {
        RUNS: len(clean),
        NOISY_RUNS: len(part) - len(clean),
        "repeats": int(pd.to_numeric(part.get("repeats", pd.Series(1, index=part.index))).fillna(1).sum()),
    }
    for metric in registry.names(headline=True):
        if metric not in part.columns:
            continue
        values = pd.to_numeric(clean[metric], errors="coerce").dropna().tolist()
        known = registry.get(metric)
        upper = 1.0 if known is not None and known.fmt.endswith("%") else math.inf
        estimate = run_interval(values, MIN_TRIALS, upper)
        low, high = (estimate.low, estimate.high) if estimate.has_interval else (math.nan, math.nan)
        row |= {f"{metric}{CI[0]}": low, f"{metric}{CI[1]}": high}
    row[BASIS] = f"over {len(clean)} runs" if len(clean) >= MIN_TRIALS else f"none: {len(clean)} clean runs"
    return row


def _is_numeric(column: pd.Series) -> bool:
    return pd.api.types.is_numeric_dtype(column) and not pd.api.types.is_bool_dtype(column)


def plot_title(table: pd.DataFrame, swept: list[str]) -> str:
    """Model, workload and the settings every job shared (the overrides not swept)."""
    ok = table[table["status"] == "ok"]
    first = (ok if not ok.empty else table).iloc[0]
    context = [f"{k} {first[k]}" for k in CONTEXT if k in table.columns and pd.notna(first[k])]
    fixed = {c.removeprefix("param:"): first[c] for c in table.columns.drop(swept) if c.startswith("param:")}
    settings = [
        f"{k}={v}" for k, v in fixed.items() if k not in CONTEXT and f"param:{k}" != TRIAL and pd.notna(v)
    ]
    return " | ".join([", ".join(context), "fixed: " + (" ".join(settings) or "defaults")])


def job_requests(sweep_dir: Path, table: pd.DataFrame, swept: list[str]) -> list[tuple[str, pd.DataFrame]]:
    """(label, requests.csv rows) of every repeat of every finished job: one latency CDF per repeat."""
    out = []
    for _, row in table[table["status"] == "ok"].iterrows():
        path = sweep_dir / str(row["job_dir"]) / "requests.csv"
        if not path.is_file():
            continue
        label = ", ".join(f"{k.removeprefix('param:')}={row[k]}" for k in swept) or str(row["job_dir"])
        label += " (machine busy: not judged)" if pd.notna(row.get(BUSY)) and row.get(BUSY) else ""
        repeats = list(pd.read_csv(path).groupby("repeat", sort=True))
        out += [(label if len(repeats) == 1 else f"{label} r{r}", part) for r, part in repeats]
    return out


def mark_noise(table: pd.DataFrame) -> pd.DataFrame:
    """`noise:<metric>`: "best", "within noise" (CI overlaps the best row's) or "", among the rows whose
    interval spans independent runs (MIN_TRIALS clean runs); a row flagged busy or with fewer runs gets
    no mark: the table says it has not enough runs rather than guessing."""
    table = table.copy()
    runs = pd.to_numeric(table.get(RUNS, pd.Series(0, index=table.index)), errors="coerce").fillna(0)
    judged = (table["status"] == "ok") & (runs >= MIN_TRIALS)
    for metric in registry.names():
        direction = registry.better(metric)
        low, high = (f"{metric}{s}" for s in CI)
        if direction is None or low not in table.columns or table.loc[judged, low].notna().sum() < 2:
            continue  # a best needs two rows to be best among
        values = pd.to_numeric(table.loc[judged, metric])
        best = values.idxmax() if direction == registry.HIGHER else values.idxmin()
        overlaps = (table[low] <= table.at[best, high]) & (table[high] >= table.at[best, low]) & judged
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
            listed = (expected[num] if expected and num < len(expected) else None) or []
            overrides = list(yaml.safe_load(saved.read_text()) or []) if saved.is_file() else listed
            error = "no readable results.json: the job died before writing it"
            rows.append(_vanished(num, path.name, overrides, error))
            nums.add(num)
    for num, overrides in enumerate(expected or []):
        if overrides is not None and num not in nums:  # None: a job of an earlier sweep (appended to)
            rows.append(_vanished(num, "", overrides, "no job dir: the job never started"))
    table = pd.DataFrame(sorted(rows, key=lambda row: row["job_num"]))
    params = _setting_keys(table)  # a key some jobs did not set: they ran its default
    table[params] = table[params].astype(object).where(table[params].notna(), UNSET)
    return table


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
    engine = summary.get("engine_kind")
    row |= {k: number(summary[k]) for k in keys if k in summary and registry.applies(_base(k), engine)}
    row |= {k: v for k, v in summary.items() if TURN_METRIC.match(k)}
    row[NOISE], row[BUSY] = summary.get(NOISE, ""), summary.get(BUSY, 0)
    slo = results.get("config", {}).get("metrics", {}).get("slo") or {}
    return row | {f"slo:{k}": v for k, v in slo.items() if v is not None}


def _base(key: str) -> str:
    return key.removesuffix(CI[0]).removesuffix(CI[1])


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
    """The table with `mean ± CI half-width` cells in each metric's unit (**bold**: a metric's best row,
    ≈: within noise of it, among rows with enough runs); `lines` (such as the max rate meeting the SLOs)
    above it, `extra` metrics after the main; settings that only some jobs have listed under it."""
    metrics = [m for m in dict.fromkeys([*TABLE_METRICS, *extra]) if m in table.columns]
    errors = ["error"] if (table["status"] != "ok").any() else []
    noisy = [NOISE] if NOISE in table.columns and table[NOISE].fillna("").astype(bool).any() else []
    runs = [RUNS, NOISY_RUNS, BASIS] if RUNS in table.columns else []
    columns = ["job_num", *swept, "status", *runs, *metrics, *errors, *noisy]
    header = "| " + " | ".join(_header(c) for c in columns) + " |"
    rule = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(_metric_cell(row, c) for c in columns) + " |" for _, row in table.iterrows()]
    notes = [where] if where else []
    notes.append(
        "mean ± 95% CI half-width ([low, high] where the CI stops at 0); `interval` says what it spans: "
        f"over runs (independent jobs: `-m trial=0,1,2 ...`) when a configuration has {MIN_TRIALS} clean "
        "runs, else within one run (its repeats share a process: no verdict); **bold**: best row, "
        "≈: CI overlaps the best row's (within noise), among rows over runs only"
    )
    if noisy:
        notes.append(
            f"{NOISE}: the job's machine was busy or its CIs are wide (metrics.noise); a job busy in a "
            "repeat is shown but counted in no verdict, max-rate line or search"
        )
    lines = [*(f"- {line}" for line in lines), ""] if lines else []
    partial = partial_settings(table, swept)
    partial_lines = [f"- {k.removeprefix('param:')}: set only in jobs {v}" for k, v in partial.items()]
    if partial_lines:
        partial_lines = [
            "",
            f"Settings not shared by every job ({UNSET}: the job left it at its default):",
            *partial_lines,
        ]
    return "\n".join([f"# Sweep {title}", "", *notes, "", *lines, header, rule, *body, *partial_lines, ""])


def partial_settings(table: pd.DataFrame, swept: list) -> dict[str, str]:
    """Override keys that some jobs set and others did not (an appended job with another setting)."""
    out = {}
    for key in swept:
        present = table[key].astype(str) != UNSET
        if not present.all():
            out[key] = ", ".join(str(n) for n in table.loc[present, "job_num"])
    return out


def _header(column: str) -> str:
    name = column.removeprefix("param:")
    unit = registry.unit(column)[0] if registry.get(column) else ""
    shown = unit and unit != "fraction of requests" and not name.endswith(f"_{unit}")
    return f"{name} ({unit})" if shown else name


def _metric_cell(row: pd.Series, column: str) -> str:
    v = row.get(column)  # NaN: a failed job has no metrics, or the metric does not apply to its engine
    if column.startswith("param:"):
        return "" if pd.isna(v) else str(v)
    if isinstance(v, float) and pd.isna(v):
        text = "n/a" if registry.get(column) and row.get("status") == "ok" else ""
        return text
    text = (
        ""
        if v is None
        else registry.display(column, v)
        if isinstance(v, (int, float)) and not isinstance(v, bool)
        else str(v)
    )
    low, high = row.get(f"{column}{CI[0]}"), row.get(f"{column}{CI[1]}")
    if text and pd.notna(low) and pd.notna(high):
        _, scale = registry.unit(column)
        fmt = lambda x: registry.display(column, x * scale)
        text += interval_suffix(float(row[column]) / scale, low / scale, high / scale, fmt)
    mark = row.get(f"noise:{column}", "")
    if text and registry.get(column) and row.get(RUNS, 1) == 0:  # every run of the row flagged busy
        text += " (busy)"
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
        # each table metric's unit and which way is better (metric_registry), for whoever reads the table
        shown = [m for m in registry.METRICS if m.name in table.columns]
        config["metrics"] = {m.name: {"unit": m.unit, "better": m.better or "neither"} for m in shown}
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
