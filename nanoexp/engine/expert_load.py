"""A step's expert-load figures from its [moe layers, experts] routed-token counts."""

from __future__ import annotations

import numpy as np


def layer_imbalance(counts: np.ndarray) -> np.ndarray:
    """Per layer: tokens of the busiest expert over the mean per expert (1 = balanced; 0 where none)."""
    mean = counts.mean(axis=1)
    return np.divide(counts.max(axis=1), mean, out=np.zeros(len(counts)), where=mean > 0)


def rank_shares(counts: np.ndarray, ranks: int) -> np.ndarray:
    """Per layer and expert-parallel rank (contiguous experts each): its share of the layer's routed slots."""
    per_rank = counts.reshape(len(counts), ranks, -1).sum(axis=2)
    total = per_rank.sum(axis=1, keepdims=True)
    return np.divide(per_rank, total, out=np.zeros(per_rank.shape), where=total > 0)


def step_expert_load(counts: np.ndarray | None, ep_ranks: int) -> dict:
    """The worst layer's (highest max / mean) busiest-expert and mean tokens per expert; with expert
    parallelism, the busiest rank's share of a layer's routed tokens (worst layer). {} without counts."""
    if counts is None or counts.size == 0:
        return {}
    worst = int(np.argmax(layer_imbalance(counts)))
    fields = {
        "expert_load_max": int(counts[worst].max()),
        "expert_load_mean": float(counts[worst].mean()),
    }
    if ep_ranks > 1:
        fields["expert_load_rank_share_max"] = float(rank_shares(counts, ep_ranks).max())
    return fields
