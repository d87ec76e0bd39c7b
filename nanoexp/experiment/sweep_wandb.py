"""The sweep-level W&B run: job type `sweep-report`, in the sweep's group, holding the sweep table
(a wandb.Table), the report's plots (images) and the swept keys with their values in its config."""

from __future__ import annotations

import math
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
    """The distinct swept values, typed as in the table (16, not '16')."""
    values = dict.fromkeys(typed(column).dropna())
    return [str(v) if isinstance(v, float) and not math.isfinite(v) else v for v in values]  # JSON


def typed(column: pd.Series) -> pd.Series:
    """An override column (its values are the command line's text) as numbers when every value is
    one (`16`, `0.5`, `inf`), as booleans when every value is true/false, else unchanged."""
    present = column.dropna().astype(str)
    numbers = pd.to_numeric(present, errors="coerce")
    if len(present) and numbers.notna().all():
        whole = numbers[numbers.map(lambda v: v == v and abs(v) != float("inf"))]
        as_int = (whole == whole.round()).all() and present.str.fullmatch(r"[+-]?\d+").all()
        return _objects(column, int if as_int else float)
    lowered = present.str.lower()
    if len(present) and lowered.isin(("true", "false")).all():
        return _objects(column, lambda v: str(v).lower() == "true")
    return column


def _objects(column: pd.Series, convert) -> pd.Series:
    """`convert` of each present value, None for a missing one, as Python objects (pandas would
    turn ints beside a None into floats)."""
    values = [None if v is None or v != v else convert(v) for v in column]
    return pd.Series(values, index=column.index, dtype=object)


def _loggable(table: pd.DataFrame) -> pd.DataFrame:
    """One column per key (a swept key the summary also holds, such as `model` or `repeats`, is
    the swept column only), swept values typed (see `typed`), strings for text columns, None for
    missing values: what wandb.Table accepts per column."""
    params = [c for c in table.columns if c.startswith("param:")]
    shadowed = [c.removeprefix("param:") for c in params if c.removeprefix("param:") in table.columns]
    out = table.drop(columns=shadowed).copy()
    for col in [c for c in out.columns if c not in params]:
        if not pd.api.types.is_numeric_dtype(out[col]):
            out[col] = out[col].map(
                lambda v: "" if v is None or (isinstance(v, float) and v != v) else str(v)
            )
    for col in params:
        out[col] = typed(out[col]).astype(object)
    return out.rename(columns=lambda c: c.removeprefix("param:"))


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0][:160]
