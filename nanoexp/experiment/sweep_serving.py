"""The sweep report's serving view, for a sweep over `workload.request_rate`: latencies, achieved
rate, goodput and SLO attainment against the offered rate, and the highest offered rate up to which
every rate meets the SLOs (at least MIN_ATTAINMENT of its requests meet every SLO set)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from nanoexp.experiment import sweep_plots as plots

RATE = "param:workload.request_rate"
MIN_ATTAINMENT = 0.9
SLO_KEYS = ("ttft_ms", "tpot_ms", "e2el_ms")
RATE_METRICS = ("request_throughput", "request_goodput", "slo_attainment")
PLOT, SUMMARY = "sweep_serving.png", "sweep_serving.json"
LATENCY_PANELS = (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"), ("ITL", "itl_ms"))
PERCENTILE_METRICS = [f"{s}_{m}" for _, m in LATENCY_PANELS for s in ("median", "p99")]
METRICS = ["offered_request_rate", *RATE_METRICS, *PERCENTILE_METRICS]


def serving_report(table: pd.DataFrame, swept: list[str], title: str, sweep_dir: Path) -> list[str]:
    """sweep_serving.png and .json when the request rate is swept; returns lines for sweep_summary.md."""
    if RATE not in swept:
        return []
    others = [k for k in swept if k != RATE]
    slo = shared_slo(table)
    found = max_rates(table, others) if slo else []
    summary = {"slo": slo, "min_slo_attainment": MIN_ATTAINMENT, "max_rate_meeting_slo": found}
    (sweep_dir / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n")
    plot_serving(table, others, slo, title, sweep_dir / PLOT)
    return [rate_line(slo, entry) for entry in found] or [rate_line(slo, None)]


def shared_slo(table: pd.DataFrame) -> dict[str, float]:
    """The SLOs (metrics.slo) every finished job ran with; empty when unset or when they differ."""
    ok = table[table["status"] == "ok"]
    slo = {}
    for key in SLO_KEYS:
        values = set(ok[f"slo:{key}"].dropna()) if f"slo:{key}" in ok.columns else set()
        if len(values) == 1:
            slo[key] = float(values.pop())
    return slo


def max_rates(table: pd.DataFrame, others: list[str]) -> list[dict]:
    """Per combination of the other swept parameters: the highest offered rate up to which every
    rate's SLO attainment is >= MIN_ATTAINMENT (a failed job meets nothing), or None."""
    out = []
    for label, part in plots.groups(table, others):
        part = part.assign(_rate=pd.to_numeric(part[RATE])).sort_values("_rate")
        attainment = pd.to_numeric(part.get("slo_attainment", pd.Series(dtype=float)), errors="coerce")
        best = None
        for rate, met in zip(part["_rate"], attainment.reindex(part.index) >= MIN_ATTAINMENT):
            if not met:
                break
            best = rate
        rates = [
            {"offered_request_rate": _json_rate(row["_rate"]), "status": row["status"]}
            | {k: plots.to_number(row.get(k)) for k in RATE_METRICS}
            for _, row in part.iterrows()
        ]
        out.append({"group": label, "max_rate": _json_rate(best), "rates": rates})
    return out


def rate_line(slo: dict[str, float], entry: dict | None) -> str:
    """`max rate meeting SLOs (...): 64 req/s`, one line per group of the other swept values."""
    if not slo:
        return "max rate meeting SLOs: no SLOs set (metrics.slo.ttft_ms, tpot_ms, e2el_ms)"
    rule = ", ".join(f"{k} <= {v:g}" for k, v in slo.items())
    where = f", {entry['group']}" if entry and entry["group"] else ""
    head = f"max rate meeting SLOs ({rule} for >= {MIN_ATTAINMENT:.0%} of requests{where})"
    rate = entry["max_rate"] if entry else None
    if rate is None:
        return f"{head}: none of the offered rates"
    return f"{head}: {'all at t0 (inf)' if rate == 'inf' else f'{rate:g} req/s'}"


def _json_rate(rate: float | None) -> float | str | None:
    return "inf" if rate is not None and math.isinf(rate) else rate


def plot_serving(
    table: pd.DataFrame, others: list[str], slo: dict[str, float], title: str, path: Path
) -> None:
    """Latency panels (median solid, p99 dashed, the SLO dotted), request rates and SLO attainment."""
    ok = table[table["status"] == "ok"]
    if ok.empty:
        return
    plt = plots.pyplot()
    fig, axes = plt.subplots(1, 5, figsize=(18, 3.6))
    axis = plots.NumericAxis(ok[RATE], RATE)
    for colour, (label, part) in enumerate(plots.groups(ok, others)):
        part = part.assign(_x=axis.place(part[RATE])).sort_values("_x")
        style = {"color": f"C{colour}", "capsize": 3}
        for ax, (_, metric) in zip(axes, LATENCY_PANELS):
            _series(ax, part, f"median_{metric}", f"{label} median".strip(), "o-", style)
            _series(ax, part, f"p99_{metric}", f"{label} p99".strip(), "s--", style)
        _series(axes[3], part, "request_throughput", f"{label} achieved".strip(), "o-", style)
        _series(axes[3], part, "request_goodput", f"{label} goodput".strip(), "s--", style)
        _series(axes[4], part, "slo_attainment", label, "o-", style)
    axes[3].plot(axis.finite, axis.finite, color="grey", linestyle=":", linewidth=1, label="offered")
    for ax, (name, metric) in zip(axes, LATENCY_PANELS):
        _decorate(ax, axis, f"{name} (ms)", slo.get(metric), f"SLO {slo.get(metric, 0):g} ms")
    _decorate(axes[3], axis, "requests/s")
    _decorate(axes[4], axis, "SLO attainment", MIN_ATTAINMENT if slo else None, f"{MIN_ATTAINMENT:.0%}")
    plots.from_zero(axes[4], top=plots.HEADROOM)  # a fraction: up to 1, with room for the markers at 1
    plots.save_figure(fig, title, path)


def _series(ax, part: pd.DataFrame, metric: str, label: str, fmt: str, style: dict) -> None:
    if metric in part.columns and part[metric].notna().any():
        y, err = plots.metric_values(part, metric)
        ax.errorbar(part["_x"], y, yerr=err, fmt=fmt, label=label, **style)


def _decorate(ax, axis, ylabel: str, limit: float | None = None, limit_label: str = "") -> None:
    if limit is not None:
        ax.axhline(limit, color="red", linestyle=":", linewidth=1, label=limit_label)
    axis.apply(ax)
    ax.set_xlabel("offered rate (req/s)", fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    plots.from_zero(ax)
    ax.tick_params(labelsize=7)
    if ax.get_legend_handles_labels()[0]:  # below the panel: inside, it would hide data
        ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)
