"""A MoE job's expert load over its timed steps: per-layer imbalance (busiest expert's tokens over the
mean per expert) in the summary, and the tokens routed per layer and expert as expert_load.csv and a
heatmap, expert_load.png, in the job dir (the W&B logger uploads the image)."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from nanoexp.engine.expert_load import layer_imbalance
from nanoexp.experiment.measure.driver import RunRecord
from nanoexp.experiment.runtime import atomic_files

HEATMAP = "expert_load.png"
COUNTS = "expert_load.csv"


def routed_totals(records: Sequence[RunRecord]) -> np.ndarray | None:
    """[moe layers, experts] tokens routed over every timed step, None for a dense model (or counting off)."""
    loads = [s.expert_load for r in records for s in r.steps if s.expert_load is not None]
    return np.sum(loads, axis=0) if loads else None


def expert_load_summary(records: Sequence[RunRecord], out_dir: Path) -> dict:
    """The summary's expert_load_* entries; writes the counts and the heatmap. {} without counts."""
    totals = routed_totals(records)
    if totals is None:
        return {}
    imbalance = layer_imbalance(totals)
    write_counts(totals, out_dir / COUNTS)
    write_heatmap(totals, out_dir / HEATMAP)
    return {
        "expert_load_tokens_routed": int(totals.sum()),
        "expert_load_imbalance_max": float(imbalance.max()),
        "expert_load_imbalance_mean": float(imbalance.mean()),
        "expert_load_imbalance_per_layer": [round(float(x), 4) for x in imbalance],
        "expert_load_heatmap": HEATMAP,
    }


def write_counts(totals: np.ndarray, path: Path) -> None:
    with atomic_files.atomic_open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["moe_layer", *(f"expert_{e}" for e in range(totals.shape[1]))])
        writer.writerows([i, *row] for i, row in enumerate(totals.tolist()))


def write_heatmap(totals: np.ndarray, path: Path) -> None:
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    layers, experts = totals.shape
    fig = Figure(figsize=(min(4 + experts / 8, 20), min(2 + layers / 4, 14)), layout="constrained")
    ax = fig.subplots()
    image = ax.imshow(totals, aspect="auto", interpolation="nearest", cmap="viridis")
    fig.colorbar(image, ax=ax, label="tokens routed")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel="expert", ylabel="MoE layer (in model order)", title="tokens routed per layer and expert")
    atomic_files.save_figure(fig, path, dpi=100)
