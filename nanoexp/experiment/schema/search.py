"""The `search` section (set by the `hparams_search` group): what run.py returns to a search sweeper."""

from __future__ import annotations

from dataclasses import dataclass

from nanoexp.config.checks import choice, number
from nanoexp.experiment.metrics import registry

# the job summary's metrics a search can optimize (metric_registry: metrics.summarize, kv_quality, latency)
SEARCH_OBJECTIVES = tuple(registry.names(registry.SEARCH))


@dataclass
class SearchConfig:
    """What run.py returns to a search sweeper (see job/objective.py objective_of)."""

    objective: str = "output_throughput"
    max_p99_ttft_ms: float | None = None
    infeasible_value: float | None = None  # null: the objective's worst (0 for a rate, 1e18 for a latency)

    def __post_init__(self) -> None:
        choice("search.objective", self.objective, SEARCH_OBJECTIVES)
        if self.infeasible_value is not None:
            number(
                "search.infeasible_value", self.infeasible_value, lambda v: True, "null or a finite number"
            )
        if self.max_p99_ttft_ms is not None:
            number("search.max_p99_ttft_ms", self.max_p99_ttft_ms, lambda v: v > 0, "null or a number > 0")
