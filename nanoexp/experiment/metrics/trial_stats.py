"""Intervals and verdicts with the independent run (a trial) as the unit of replication.

Repeats inside one run share its process, engine, caches, clocks and neighbours, so their spread is the
within-run noise only; two runs of the same configuration differ by more (Georges, Buytaert & Eeckhout,
OOPSLA 2007; Kalibera & Jones, ISMM 2013). Each run is summarized by its mean over its repeats, and the
runs' means are the samples: their spread holds both levels of noise (the between-run variance plus the
within-run variance over the repeats), so a t-interval over them covers the configuration's mean. With
fewer than MIN_TRIALS clean runs a side there is no interval and no verdict: "not enough runs".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

CONFIDENCE = 0.95
MIN_TRIALS = 3  # clean runs a side; with 2, Welch's t on ~2 degrees of freedom is too wide to be useful
NOT_ENOUGH = "not enough runs"
WITHHELD = "withheld: noisy"


@dataclass(frozen=True)
class Estimate:
    """A configuration's mean over its runs and the interval on it (NaN bounds: too few runs)."""

    mean: float
    low: float
    high: float
    runs: int

    @property
    def has_interval(self) -> bool:
        return not math.isnan(self.low)


def _t(dof: float) -> float:
    from scipy import stats  # here: its import costs a one-repeat job ~1 s of CPU

    return float(stats.t.ppf(0.5 + CONFIDENCE / 2, dof))


def run_interval(run_means: Sequence[float], min_runs: int = MIN_TRIALS, upper: float = math.inf) -> Estimate:
    """The mean of the runs' means and its t-interval over them (cut to [0, upper]); NaN bounds with
    fewer than `min_runs` runs."""
    arr = np.asarray([v for v in run_means if v == v], dtype=float)
    if arr.size == 0:
        return Estimate(math.nan, math.nan, math.nan, 0)
    mean = float(arr.mean())
    if arr.size < max(2, min_runs):
        return Estimate(mean, math.nan, math.nan, int(arr.size))
    half = _t(arr.size - 1) * float(arr.std(ddof=1)) / math.sqrt(arr.size)
    return Estimate(mean, max(mean - half, 0.0), min(mean + half, upper), int(arr.size))


def ratio_interval(
    a: Sequence[float], b: Sequence[float], min_runs: int = MIN_TRIALS
) -> tuple[float, float, float]:
    """mean(b) / mean(a) over the runs' means, and its interval: the delta method on the log ratio
    (var of log mean ~ s^2 / (n mean^2)) with Welch's degrees of freedom. NaN bounds with fewer than
    `min_runs` runs a side or a mean <= 0."""
    a_arr, b_arr = (np.asarray([v for v in x if v == v], dtype=float) for x in (a, b))
    if not a_arr.size or not b_arr.size:
        return math.nan, math.nan, math.nan
    mean_a, mean_b = float(a_arr.mean()), float(b_arr.mean())
    value = mean_b / mean_a if mean_a else math.nan
    enough = min(a_arr.size, b_arr.size) >= max(2, min_runs)
    if not enough or mean_a <= 0 or mean_b <= 0:
        return value, math.nan, math.nan
    var_a = a_arr.var(ddof=1) / (a_arr.size * mean_a**2)
    var_b = b_arr.var(ddof=1) / (b_arr.size * mean_b**2)
    total = var_a + var_b
    if total == 0:
        return value, value, value
    dof = total**2 / (var_a**2 / (a_arr.size - 1) + var_b**2 / (b_arr.size - 1))
    half = _t(dof) * math.sqrt(total)
    return value, value * math.exp(-half), value * math.exp(half)


def verdict(value: float, low: float, high: float, better: str | None) -> str:
    """`better`/`worse` (or `higher`/`lower` for a metric with no better direction) when the interval
    excludes 1, `within noise` when it holds 1, NOT_ENOUGH without an interval."""
    if math.isnan(low) or math.isnan(high):
        return NOT_ENOUGH
    if low <= 1 <= high:
        return "within noise"
    if better is None:
        return "higher" if value > 1 else "lower"
    return "better" if (value > 1) == (better == "higher") else "worse"
