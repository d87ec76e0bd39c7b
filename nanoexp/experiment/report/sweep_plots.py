"""The sweep report's plots: each main metric against each swept parameter, the TTFT and TPOT CDFs and,
for a sweep over `workload.request_rate`, the serving view against the offered rate with the highest rate
up to which every rate meets the SLOs (at least MIN_ATTAINMENT of its requests meet every SLO set)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from nanoexp.experiment.metrics import registry
from nanoexp.experiment.runtime import atomic_files
from nanoexp.experiment.sinks.local import json_safe

INF_LABELS = {"workload.request_rate": "all at t0"}  # what an infinite value of a parameter means
RATE = "param:workload.request_rate"
MIN_ATTAINMENT = 0.9
SLO_KEYS = ("ttft_ms", "tpot_ms", "e2el_ms")
RATE_METRICS = ("request_throughput", "request_goodput", "slo_attainment")
LATENCY_PANELS = (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"), ("ITL", "itl_ms"))
PERCENTILE_METRICS = [f"{s}_{m}" for _, m in LATENCY_PANELS for s in ("median", "p99")]
SERVING_METRICS = ["offered_request_rate", *RATE_METRICS, *PERCENTILE_METRICS]
SERVING_PANELS = [  # (y label, [(metric, series name)]: the first drawn solid, the second dashed)
    *[(f"{name} (ms)", [(f"median_{m}", "median"), (f"p99_{m}", "p99")]) for name, m in LATENCY_PANELS],
    ("requests/s", [("request_throughput", "achieved"), ("request_goodput", "goodput")]),
    ("SLO attainment", [("slo_attainment", "")]),
]
FLAGGED_LABEL = "machine busy: shown, not judged"
LEGEND_PT = 9
HEADROOM = 1.08  # the y axis ends this far above the highest point (error bars included)
LOG_SPAN = 30  # a latency panel whose points span more than this factor gets a log axis


def metric_title(metric: str) -> str:
    """The panel title: the metric in words and its unit, `p99 TTFT (ms)`, `peak memory (GB)`."""
    return registry.title(metric)


def unit(metric: str) -> tuple[str, float]:
    """(unit, divisor) of a metric's values."""
    return registry.unit(metric)


def flagged(part: pd.DataFrame) -> pd.Series:
    """Rows resting on a run flagged busy (repeats.noise_flags): drawn, and marked as such."""
    noisy = part.get("noisy_runs", part.get("noise_busy_repeats", pd.Series(0, index=part.index)))
    return pd.to_numeric(noisy, errors="coerce").fillna(0) > 0


def mark_flagged(ax, x, y, rows: pd.DataFrame) -> None:
    """A red ring around each point of a flagged job (legend: `machine busy: not judged`)."""
    where = flagged(rows).to_numpy()
    if where.any():
        xs, ys = np.asarray(x, dtype=float)[where], np.asarray(y, dtype=float)[where]
        ax.plot(xs, ys, "o", ms=11, mfc="none", mec="red", mew=1.5, label=FLAGGED_LABEL, zorder=5)


def plot_param(
    table: pd.DataFrame, metrics: list[str], key: str, others: list[str], title: str, path: Path
) -> None:
    """One panel per metric against `key`; one line (or bar series) per combination of `others`."""
    ok = table[table["status"] == "ok"]
    metrics = [m for m in metrics if m in ok.columns and ok[m].notna().any()]
    if not metrics:  # also when no job finished
        return
    ncols = min(4, len(metrics))
    nrows = -(-len(metrics) // ncols)
    fig = figure(figsize=(3.6 * ncols, 3.0 * nrows + 0.6))
    draw = _lines if pd.to_numeric(ok[key], errors="coerce").notna().all() else _bars
    for panel, metric in enumerate(metrics, start=1):
        ax = fig.add_subplot(nrows, ncols, panel)
        draw(ax, ok, key, others, metric)
        ax.set(title=metric_title(metric), xlabel=key.removeprefix("param:"), ylabel=unit(metric)[0])
        from_zero(ax)
    legend = ", ".join(o.removeprefix("param:") for o in others) if others else None
    save_figure(fig, title, path, legend_title=legend)


def spans_decades(ax) -> bool:
    """Whether the panel's positive points span more than LOG_SPAN (their own range, not the axis')."""
    values = [y for line in ax.get_lines() for y in np.asarray(line.get_ydata(), dtype=float)]
    positive = [v for v in values if np.isfinite(v) and v > 0]
    return bool(positive) and max(positive) > LOG_SPAN * min(positive)


def from_zero(ax) -> None:
    """The y axis from 0 (every metric is an amount) to just above the highest point."""
    high = ax.dataLim.y1 if np.isfinite(ax.dataLim.y1) else 0.0
    ax.set_ylim(0, high * HEADROOM if high > 0 else 1.0)


def _lines(ax, ok: pd.DataFrame, key: str, others: list[str], metric: str) -> None:
    axis = NumericAxis(ok[key], key)
    for label, part in groups(ok, others):
        part = part.assign(_x=axis.place(part[key])).sort_values("_x")
        y, err = metric_values(part, metric)
        ax.errorbar(part["_x"], y, yerr=err, marker="o", capsize=3, label=label)
        mark_flagged(ax, part["_x"], y, part)
    axis.apply(ax)


class NumericAxis:
    """An x axis for a numeric parameter: log2 for wide spans, inf one step past the largest finite value."""

    def __init__(self, values: pd.Series, key: str):
        x = pd.to_numeric(values)
        self.finite = finite = sorted(set(x[np.isfinite(x)]))
        self.log = bool(finite) and finite[0] > 0 and finite[-1] >= 8 * finite[0]
        self.ticks = sorted(set(x))
        self.inf_label = INF_LABELS.get(key.removeprefix("param:"), "inf")
        # inf: one step beyond the largest finite value, as the last step (or ratio on a log axis)
        if len(finite) < 2:
            self.inf_at = finite[0] + (abs(finite[0]) or 1.0) if finite else 1.0
        else:
            self.inf_at = finite[-1] ** 2 / finite[-2] if self.log else 2 * finite[-1] - finite[-2]

    def place(self, values: pd.Series) -> pd.Series:
        return pd.to_numeric(values).replace({math.inf: self.inf_at})

    def apply(self, ax) -> None:
        if self.log:
            ax.set_xscale("log", base=2)
            ax.minorticks_off()
        labels = [self.inf_label if math.isinf(v) else f"{v:g}" for v in self.ticks]
        ax.set_xticks(list(self.place(pd.Series(self.ticks, dtype=float))), labels)


def _bars(ax, ok: pd.DataFrame, key: str, others: list[str], metric: str) -> None:
    categories = list(dict.fromkeys(ok[key].astype(str)))
    series = groups(ok, others)
    width = 0.8 / len(series)
    for i, (label, part) in enumerate(series):
        part = part.assign(_c=part[key].astype(str)).set_index("_c").reindex(categories)
        y, err = metric_values(part, metric)
        positions = [c + (i - (len(series) - 1) / 2) * width for c in range(len(categories))]
        ax.bar(positions, y, width=width, yerr=err, capsize=3, label=label)
        mark_flagged(ax, positions, y, part)
    ax.set_xticks(range(len(categories)), categories)


def metric_values(part: pd.DataFrame, metric: str):
    """Values in the metric's unit and the CI as asymmetric error bars (None without repeats)."""
    _, scale = unit(metric)
    y = pd.to_numeric(part[metric]) / scale
    low, high = f"{metric}_ci95_low", f"{metric}_ci95_high"
    if low not in part.columns or part[low].isna().all():
        return y, None
    return y, [y - pd.to_numeric(part[low]) / scale, pd.to_numeric(part[high]) / scale - y]


def groups(ok: pd.DataFrame, others: list[str]) -> list[tuple[str, pd.DataFrame]]:
    """Sub-tables per combination of the other swept parameters, in numeric order where numeric."""
    if not others:
        return [("", ok)]
    parts = sorted(ok.groupby(others, dropna=False, sort=False), key=lambda g: tuple(map(sort_key, g[0])))
    name = lambda g: ", ".join(f"{k.removeprefix('param:')}={v}" for k, v in zip(others, g))
    return [(name(g), p) for g, p in parts]


def plot_latency_cdf(ok_jobs: list[tuple[str, pd.DataFrame]], title: str, path: Path) -> None:
    """TTFT and TPOT across requests, one empirical CDF per job (`(label, requests.csv rows)`)."""
    if not ok_jobs:
        return
    fig = figure(figsize=(9, 3.6))
    axes = fig.subplots(1, 2)
    for label, requests in ok_jobs:
        tpot = requests[requests["output_len"] > 1]["tpot_ms"]
        for ax, values in zip(axes, (requests["ttft_ms"], tpot)):
            values = values.sort_values().to_numpy()
            if values.size:
                ax.step(values, np.arange(1, values.size + 1) / values.size, where="post", label=label)
    for ax, name in zip(axes, ("TTFT", "TPOT")):
        ax.set(xlabel=f"{name} (ms)", ylabel="fraction of requests", ylim=(0, 1.02), xlim=(0, None))
    save_figure(fig, title, path, legend_title="job")


def sort_key(value) -> tuple:
    """Numbers before text, numbers by value (so 16 < 128), text alphabetically."""
    number = pd.to_numeric(value, errors="coerce")
    return (0, float(number), "") if pd.notna(number) else (1, 0.0, str(value))


def figure(**kwargs):
    """A figure outside pyplot (no GUI backend, nothing to close), in the report's font sizes."""
    import matplotlib
    from matplotlib.figure import Figure

    sizes = {"axes.titlesize": 9, "axes.labelsize": 8, "xtick.labelsize": 7, "ytick.labelsize": 7}
    matplotlib.rcParams.update(sizes)
    return Figure(**kwargs)


def save_figure(fig, title: str, path: Path, legend_title: str | None = None) -> None:
    """Saves with the title on top and one legend below the panels (inside, it hides data): the series
    of every panel (once each), and the mark of flagged jobs wherever a panel has one."""
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    found: dict[str, object] = {}
    for ax in fig.axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            found.setdefault(label, handle)
    if legend_title is None:  # no series legend asked for: only the flagged mark's entry, if any
        found = {k: v for k, v in found.items() if k == FLAGGED_LABEL}
    if found:
        fig.legend(
            list(found.values()),
            list(found),
            loc="upper center",
            bbox_to_anchor=(0.5, 0.0),
            ncol=min(len(found), 4),
            fontsize=LEGEND_PT,
            title=legend_title,
            title_fontsize=LEGEND_PT,
            frameon=False,
        )
    atomic_files.save_figure(fig, path, dpi=110, bbox_inches="tight")  # grown to hold the legend below


def serving_report(table: pd.DataFrame, swept: list[str], title: str, sweep_dir: Path) -> list[str]:
    """sweep_serving.png and .json when the request rate is swept; returns lines for sweep_summary.md."""
    if RATE not in swept:
        return []
    others = [k for k in swept if k != RATE]
    slo = shared_slo(table)
    found = max_rates(table, others) if slo else []
    summary = {"slo": slo, "min_slo_attainment": MIN_ATTAINMENT, "max_rate_meeting_slo": found}
    atomic_files.write_atomically(sweep_dir / "sweep_serving.json", json.dumps(summary, indent=2) + "\n")
    plot_serving(table, others, slo, title, sweep_dir / "sweep_serving.png")
    unset = "max rate meeting SLOs: no SLOs set (metrics.slo.ttft_ms, tpot_ms, e2el_ms)"
    return [rate_line(slo, entry) for entry in found] or [unset]


def shared_slo(table: pd.DataFrame) -> dict[str, float]:
    """The SLOs (metrics.slo) every finished job ran with; empty when unset or when they differ."""
    ok = table[table["status"] == "ok"]
    values = {k: set(ok[f"slo:{k}"].dropna()) if f"slo:{k}" in ok.columns else set() for k in SLO_KEYS}
    return {k: float(v.pop()) for k, v in values.items() if len(v) == 1}


def max_rates(table: pd.DataFrame, others: list[str]) -> list[dict]:
    """Per group of the other swept values: the highest rate up to which every rate meets the SLOs. A
    rate whose job was flagged busy (or failed) cannot say either way: the search stops below it and
    names it (`withheld_at`)."""
    out = []
    for label, part in groups(table, others):
        part = part.assign(_rate=pd.to_numeric(part[RATE])).sort_values("_rate")
        attainment = pd.to_numeric(part.get("slo_attainment", pd.Series(dtype=float)), errors="coerce")
        attainment = attainment.reindex(part.index)
        unknown = flagged(part) | (part["status"] != "ok")
        best, withheld = None, None
        for index, row in part.iterrows():
            if unknown[index]:
                withheld = row["_rate"]
                break
            if not attainment[index] >= MIN_ATTAINMENT:
                break
            best = row["_rate"]
        rates = [
            {"offered_request_rate": row["_rate"], "status": row["status"], "flagged": bool(unknown[i])}
            | {k: row.get(k) for k in RATE_METRICS}
            for i, row in part.iterrows()
        ]
        out.append({"group": label, "max_rate": best, "withheld_at": withheld, "rates": rates})
    return json_safe(out)  # inf as "inf", NaN as null


def rate_line(slo: dict[str, float], entry: dict) -> str:
    """`max rate meeting SLOs (...): 64 req/s` of a `max_rates` entry (a group of the other swept values)."""
    rule = ", ".join(f"{k} <= {v:g}" for k, v in slo.items())
    where = f", {entry['group']}" if entry["group"] else ""
    head = f"max rate meeting SLOs ({rule} for >= {MIN_ATTAINMENT:.0%} of requests{where})"
    rate, withheld = entry["max_rate"], entry.get("withheld_at")
    name = lambda r: "all at t0 (inf)" if r == "inf" else f"{r:g} req/s"
    after = (
        f"; rate {name(withheld)} unknown (machine busy or job failed): rerun it"
        if withheld is not None
        else ""
    )
    if rate is None:
        return f"{head}: {'not known' if withheld is not None else 'none of the offered rates'}{after}"
    return f"{head}: {name(rate)}{' or more' if withheld is not None else ''}{after}"


def plot_serving(
    table: pd.DataFrame, others: list[str], slo: dict[str, float], title: str, path: Path
) -> None:
    """Latency panels (median solid, p99 dashed, the SLO dotted), request rates and SLO attainment."""
    ok = table[table["status"] == "ok"]
    if ok.empty:
        return
    fig = figure(figsize=(13, 7.6))
    grid = fig.subplots(2, 3)
    axes, spare = list(grid.flat[: len(SERVING_PANELS)]), grid.flat[len(SERVING_PANELS) :]
    axis = NumericAxis(ok[RATE], RATE)
    for colour, (label, part) in enumerate(groups(ok, others)):
        label = label.split("=", 1)[1] if len(others) == 1 else label  # the key names the legend
        part = part.assign(_x=axis.place(part[RATE])).sort_values("_x")
        for ax, (_, series) in zip(axes, SERVING_PANELS):
            for (metric, name), fmt in zip(series, ("o-", "s--")):
                if metric in part.columns and part[metric].notna().any():
                    y, err = metric_values(part, metric)
                    style = {"fmt": fmt, "color": f"C{colour}", "capsize": 3}
                    ax.errorbar(part["_x"], y, yerr=err, label=f"{label} {name}".strip(), **style)
                    mark_flagged(ax, part["_x"], y, part)
    axes[3].plot(axis.finite, axis.finite, color="grey", linestyle=":", linewidth=1, label="offered")
    limits = [(slo.get(m), f"SLO {slo.get(m, 0):g} ms") for _, m in LATENCY_PANELS]
    limits += [(None, ""), (MIN_ATTAINMENT if slo else None, f"{MIN_ATTAINMENT:.0%}")]
    for ax, (ylabel, _), (limit, limit_label) in zip(axes, SERVING_PANELS, limits):
        if limit is not None:
            ax.axhline(limit, color="red", linestyle=":", linewidth=1, label=limit_label)
        axis.apply(ax)
        ax.set(xlabel="offered rate (req/s)", ylabel=ylabel)
        if ylabel.endswith("(ms)") and spans_decades(ax):
            ax.set_yscale("log")  # all at t0 queues for hundreds of ms; low rates take a few
        else:
            from_zero(ax)
    axes[-1].set_ylim(0, HEADROOM)  # a fraction: up to 1, with room for the markers at 1
    if not slo:
        axes[-1].text(
            0.5,
            0.5,
            "no SLOs set\n(metrics.slo.ttft_ms,\ntpot_ms, e2el_ms)",
            ha="center",
            va="center",
            transform=axes[-1].transAxes,
            fontsize=8,
            color="grey",
        )
    for ax in spare:
        ax.set_visible(False)
    legend = (
        others[0].removeprefix("param:")
        if len(others) == 1
        else ", ".join(o.removeprefix("param:") for o in others)
    )
    save_figure(fig, title, path, legend_title=f"{legend} (median: solid circles, p99: dashed squares)")
