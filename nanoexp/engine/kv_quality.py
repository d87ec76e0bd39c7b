"""The KV-cache quality probe's checks, request grouping and summary (pure host code)."""

from __future__ import annotations

import numpy as np

from nanoexp.runner.probe import ProbeResult

# Reference log-probs a group holds at once: rows x vocab float32 (512 x 152k ~ 0.3 GB), twice
MAX_REFERENCE_ROWS = 512


def max_group_seqs(max_num_seqs: int, num_tokens: int) -> int:
    return max(1, min(max_num_seqs, MAX_REFERENCE_ROWS // num_tokens))


def check_num_tokens(num_tokens) -> int:
    if type(num_tokens) is not int or num_tokens < 1:
        raise ValueError(f"kv_cache_quality: num_tokens={num_tokens!r} is invalid: must be an int >= 1")
    return num_tokens


def probe_groups(
    lengths: list[int], num_tokens: int, budget: int, max_seqs: int, block_size: int, num_blocks: int
) -> list[list[int]]:
    """Request indices in order, packed so each group's prefill of prompt + continuation fits
    `budget` tokens, `max_seqs` sequences and the cache's blocks (each request fits alone, checked)."""
    groups: list[list[int]] = []
    tokens = blocks = 0
    for i, n in enumerate(lengths):
        need = -(-(n + num_tokens - 1) // block_size)
        if (
            not groups
            or tokens + n + num_tokens > budget
            or blocks + need > num_blocks
            or len(groups[-1]) >= max_seqs
        ):
            groups.append([])
            tokens = blocks = 0
        groups[-1].append(i)
        tokens, blocks = tokens + n + num_tokens, blocks + need
    return groups


def summarize(results: list[ProbeResult]) -> dict:
    """Aggregates over every probed position: the fraction where the decode path's argmax agrees
    with the reference's, and KL(reference || decode) mean / p99 / max (nats)."""
    kl = np.array([x for r in results for row in r.kl for x in row], dtype=np.float64)
    agree = np.array([x for r in results for row in r.agree for x in row], dtype=bool)
    return {
        "greedy_agreement": float(agree.mean()),
        "kl_mean": float(kl.mean()),
        "kl_p99": float(np.percentile(kl, 99)),
        "kl_max": float(kl.max()),
        "num_positions": int(kl.size),
        "num_requests": sum(len(r.kl) for r in results),
    }
