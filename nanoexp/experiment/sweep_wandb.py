"""The sweep-level W&B run: job type `sweep-report`, in the sweep's group, holding the sweep table
(a wandb.Table), the report's plots (images) and the swept keys with their values in its config."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from nanoexp.experiment.schema import LoggerConfig
from nanoexp.experiment.wandb_logger import restore_env, run_dir, start_run

JOB_TYPE = "sweep-report"
TABLE_KEY = "sweep_table"


def log_sweep(
    sweep_dir: Path, table: pd.DataFrame, swept: list[str], images: list[Path], cfg: LoggerConfig, group: str
) -> str | None:
    """Logs the report as one run under `<sweep_dir>/wandb`; returns its dir (None when W&B failed:
    the local report stands on its own, so a W&B error is one warning line, not a failed sweep)."""
    try:
        return _log(sweep_dir, table, swept, images, cfg, group)
    except Exception as err:  # noqa: BLE001 - see the docstring
        print(f"wandb: warning: no sweep-level run ({_first_line(err)})", file=sys.stderr)
        return None


def _log(sweep_dir: Path, table: pd.DataFrame, swept: list[str], images: list[Path], cfg, group) -> str:
    import wandb

    keys = [k.removeprefix("param:") for k in swept]
    config = {k.removeprefix("param:"): _values(table[k]) for k in swept}
    config |= {"sweep_dir": str(sweep_dir), "num_jobs": len(table), "swept_keys": keys}
    run, env_set = start_run(cfg, sweep_dir, config, group, "sweep-report", JOB_TYPE)
    try:
        run.log({TABLE_KEY: wandb.Table(dataframe=_loggable(table))})
        run.log({f"plots/{p.stem}": wandb.Image(str(p)) for p in images if p.is_file()})
        run.summary.update({"num_jobs": len(table), "num_failed": int((table["status"] != "ok").sum())})
        return run_dir(run)
    finally:
        try:
            run.finish()
        finally:
            restore_env(env_set)


def _values(column: pd.Series) -> list:
    return list(dict.fromkeys(column.dropna().astype(str)))


def _loggable(table: pd.DataFrame) -> pd.DataFrame:
    """Strings for text columns, None for missing values: what wandb.Table accepts per column."""
    out = table.rename(columns=lambda c: c.removeprefix("param:")).copy()
    for col in out.columns:
        if not pd.api.types.is_numeric_dtype(out[col]):
            out[col] = out[col].map(
                lambda v: "" if v is None or (isinstance(v, float) and v != v) else str(v)
            )
    return out


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0][:160]
