"""The sweep report's plots: each main metric against one swept parameter (numeric parameters as
lines sorted by value, categorical ones as grouped bars, 95% CI error bars when the jobs had
repeats), and one latency CDF per sweep (TTFT and TPOT across requests, one curve per job)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

UNITS = {
    "output_throughput": ("tok/s", 1.0),
    "total_token_throughput": ("tok/s", 1.0),
    "request_throughput": ("req/s", 1.0),
    "request_goodput": ("req/s", 1.0),
    "peak_memory_bytes": ("GB", 1e9),
}


def unit(metric: str) -> tuple[str, float]:
    """(unit, divisor) of a metric's values."""
    return UNITS.get(metric, ("ms", 1.0) if metric.endswith("_ms") else ("", 1.0))


def plot_param(
    table: pd.DataFrame, metrics: list[str], key: str, others: list[str], title: str, path: Path
) -> None:
    """One panel per metric against `key`; one line (or bar series) per combination of `others`."""
    plt = _pyplot()
    ok = table[table["status"] == "ok"]
    metrics = [m for m in metrics if m in ok.columns and ok[m].notna().any()]
    if not metrics or ok.empty:
        return
    ncols = min(4, len(metrics))
    nrows = -(-len(metrics) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.6 * ncols, 3.0 * nrows + 0.6), squeeze=False)
    numeric = is_numeric(ok[key])
    for ax, metric in zip(axes.flat, metrics):
        draw = _lines if numeric else _bars
        draw(ax, ok, key, others, metric)
        label, _ = unit(metric)
        ax.set_title(metric, fontsize=9)
        ax.set_xlabel(key.removeprefix("param:"), fontsize=8)
        ax.set_ylabel(label, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.set_ylim(bottom=0)  # every metric is an amount (throughput, memory, time): 0 is the floor
    for ax in list(axes.flat)[len(metrics) :]:
        ax.set_visible(False)
    if others:
        axes.flat[0].legend(
            fontsize=6, title=", ".join(o.removeprefix("param:") for o in others), title_fontsize=6
        )
    _finish(fig, title, path)


def _lines(ax, ok: pd.DataFrame, key: str, others: list[str], metric: str) -> None:
    x_all = pd.to_numeric(ok[key])
    for label, part in _groups(ok, others):
        part = part.assign(_x=pd.to_numeric(part[key])).sort_values("_x")
        y, err = _values(part, metric)
        ax.errorbar(part["_x"], y, yerr=err, marker="o", capsize=3, label=label)
    if (x_all > 0).all() and x_all.max() >= 8 * x_all.min():  # block or batch sizes: powers of two
        ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(x_all.unique()))
    ax.set_xticklabels([f"{v:g}" for v in sorted(x_all.unique())])


def _bars(ax, ok: pd.DataFrame, key: str, others: list[str], metric: str) -> None:
    categories = list(dict.fromkeys(ok[key].astype(str)))
    groups = _groups(ok, others)
    width = 0.8 / len(groups)
    for i, (label, part) in enumerate(groups):
        part = part.assign(_c=part[key].astype(str)).set_index("_c").reindex(categories)
        y, err = _values(part, metric)
        positions = [c + (i - (len(groups) - 1) / 2) * width for c in range(len(categories))]
        ax.bar(positions, y, width=width, yerr=err, capsize=3, label=label)
    ax.set_xticks(range(len(categories)))
    ax.set_xticklabels(categories)


def _values(part: pd.DataFrame, metric: str):
    """Values in the metric's unit and the CI as asymmetric error bars (None without repeats)."""
    _, scale = unit(metric)
    y = pd.to_numeric(part[metric]) / scale
    low, high = f"{metric}_ci95_low", f"{metric}_ci95_high"
    if low not in part.columns or part[low].isna().all():
        return y, None
    return y, [y - pd.to_numeric(part[low]) / scale, pd.to_numeric(part[high]) / scale - y]


def _groups(ok: pd.DataFrame, others: list[str]) -> list[tuple[str, pd.DataFrame]]:
    """Sub-tables per combination of the other swept parameters, in numeric order where numeric."""
    if not others:
        return [("", ok)]
    groups = list(ok.groupby(others, dropna=False, sort=False))
    groups.sort(key=lambda g: tuple(sort_key(v) for v in _tuple(g[0])))
    return [
        (", ".join(f"{k.removeprefix('param:')}={v}" for k, v in zip(others, _tuple(g))), p)
        for g, p in groups
    ]


def plot_latency_cdf(ok_jobs: list[tuple[str, pd.DataFrame]], title: str, path: Path) -> None:
    """TTFT and TPOT across requests, one empirical CDF per job (`(label, requests.csv rows)`)."""
    if not ok_jobs:
        return
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for label, requests in ok_jobs:
        tpot = requests[requests["output_len"] > 1]["tpot_ms"]
        for ax, values in zip(axes, (requests["ttft_ms"], tpot)):
            values = values.sort_values().to_numpy()
            if values.size:
                ax.step(
                    values, [(i + 1) / values.size for i in range(values.size)], where="post", label=label
                )
    for ax, name in zip(axes, ("TTFT", "TPOT")):
        ax.set_xlabel(f"{name} (ms)", fontsize=8)
        ax.set_ylabel("fraction of requests", fontsize=8)
        ax.set_ylim(0, 1.02)
        ax.set_xlim(left=0)
        ax.tick_params(labelsize=7)
    axes[0].legend(fontsize=6)
    _finish(fig, title, path)


def is_numeric(values: pd.Series) -> bool:
    return bool(pd.to_numeric(values, errors="coerce").notna().all())


def sort_key(value) -> tuple:
    """Numbers before text, numbers by value (so 16 < 128), text alphabetically."""
    number = pd.to_numeric(pd.Series([value]), errors="coerce").iloc[0]
    return (0, float(number), "") if pd.notna(number) else (1, 0.0, str(value))


def _tuple(value) -> tuple:
    return value if isinstance(value, tuple) else (value,)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _finish(fig, title: str, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
