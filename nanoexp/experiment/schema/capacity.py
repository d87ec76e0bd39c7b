"""The `capacity` section (experiment=capacity): the search for the highest offered rate meeting the SLOs."""

from __future__ import annotations

from dataclasses import dataclass

from nanoexp.config.checks import integer, number


@dataclass
class CapacityConfig:
    """The capacity search (experiment=capacity, capacity.py): the highest offered rate meeting the SLOs."""

    enabled: bool = False
    start_rate: float = 4.0  # the first probe (requests/s; sessions/s for multi_turn)
    growth: float = 2.0  # bracketing: the rate times (or divided by) this until the SLOs flip
    precision: float = 0.1  # bisection stops when (failing - passing) / passing <= this
    max_probes: int = 16
    min_rate: float = 0.01  # the search gives up below this rate (nothing meets the SLOs) ...
    max_rate: float = 10000.0  # ... or above this one (everything does)

    def __post_init__(self) -> None:
        positive = lambda v: v > 0
        number("capacity.start_rate", self.start_rate, positive, "a number > 0 (requests/s)")
        number("capacity.growth", self.growth, lambda v: v > 1, "a number > 1")
        number("capacity.precision", self.precision, lambda v: 0 < v < 1, "a number in (0, 1) (0.1 = 10%)")
        integer("capacity.max_probes", self.max_probes, 2)
        number(
            "capacity.min_rate",
            self.min_rate,
            lambda v: 1e-3 <= v <= self.start_rate,
            "in [0.001, start_rate]",
        )
        number("capacity.max_rate", self.max_rate, lambda v: v >= self.start_rate, "a number >= start_rate")
