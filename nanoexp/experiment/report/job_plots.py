"""A job's timeline (timeline.png): the offered rate (as set, and as the arrivals realized it) and the
achieved rate over the run, and each request's TTFT and TPOT against its arrival. Drawn for workloads whose
requests arrive over time (a finite rate, a ramp, a trace, sessions); one colour per repeat."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from nanoexp.experiment.measure.driver import RunRecord
from nanoexp.experiment.measure.workloads import Workload
from nanoexp.experiment.report.sweep_plots import figure, save_figure

log = logging.getLogger(__name__)
TIMELINE = "timeline.png"


def plot_timeline(
    records: list[RunRecord], workloads: list[Workload], out_dir: Path, title: str
) -> Path | None:
    """timeline.png in `out_dir`, or None when every request arrived at t0 (nothing happens over time).
    A plot that cannot be drawn is a warning: the job's measurements stand without it."""
    if not any(o.arrival_time > r.t0 for r in records for o in r.outputs):
        return None
    try:
        return _draw(records, workloads, out_dir / TIMELINE, title)
    except Exception as err:  # noqa: BLE001 - see above
        log.warning("timeline plot skipped: %s", err)
        return None


def _draw(records: list[RunRecord], workloads: list[Workload], path: Path, title: str) -> Path:
    fig = figure(figsize=(13, 3.4))
    rate_ax, ttft_ax, tpot_ax = fig.subplots(1, 3)
    for colour, record in enumerate(records):
        workload = workloads[colour] if colour < len(workloads) else None
        arrivals = np.array([o.arrival_time - record.t0 for o in record.outputs])
        finishes = np.array([o.finish_time - record.t0 for o in record.outputs])
        style = {"color": f"C{colour}", "label": f"repeat {record.repeat}"}
        _rates(rate_ax, arrivals, finishes, workload, style, first=colour == 0)
        ttft_ax.scatter(arrivals, [o.ttft * 1e3 for o in record.outputs], s=6, **style)
        many = [(a, o.tpot * 1e3) for a, o in zip(arrivals, record.outputs) if len(o.token_ids) > 1]
        if many:
            tpot_ax.scatter(*zip(*many), s=6, **style)
    rate_ax.set(ylabel="requests/s", title="offered and achieved rate")
    ttft_ax.set(ylabel="TTFT (ms)", title="TTFT by arrival")
    tpot_ax.set(ylabel="TPOT (ms)", title="TPOT by arrival")
    for ax in (rate_ax, ttft_ax, tpot_ax):
        ax.set_xlabel("time since the workload started (s)")
        ax.set_ylim(bottom=0)
        ax.set_xlim(left=0)
    rate_ax.legend(fontsize=6, frameon=False)
    save_figure(fig, title, path)
    return path


def _rates(
    ax, arrivals: np.ndarray, finishes: np.ndarray, workload: Workload | None, style: dict, first: bool
) -> None:
    """Arrivals and completions per second in windows (dashed, solid); the rate the arrivals were drawn at."""
    end = float(max(finishes.max(), arrivals.max(), 1e-6))
    edges = np.linspace(0.0, end, max(5, min(40, len(arrivals) // 5)) + 1)
    width, mids = edges[1] - edges[0], (edges[:-1] + edges[1:]) / 2
    come, done = np.histogram(arrivals, edges)[0] / width, np.histogram(finishes, edges)[0] / width
    colour = style["color"]
    ax.plot(mids, come, "--", color=colour, linewidth=1, label=f"{style['label']} arrivals")
    ax.plot(mids, done, "-", color=colour, linewidth=1, label=f"{style['label']} completions")
    if (
        first
        and workload is not None
        and workload.offered_rates
        and np.isfinite(workload.offered_rates).all()
    ):
        offsets = [r.arrival_offset_s for r in workload.requests]
        ax.plot(
            offsets, workload.offered_rates[: len(offsets)], color="black", linewidth=1.5, label="offered"
        )
