"""The search objective: what run.py returns to a search sweeper (conf/hparams_search/), from the job's
results.json; an infeasible trial gets a value that is never the best."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import cast

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from nanoexp.config.checks import is_number
from nanoexp.experiment.metrics import registry
from nanoexp.experiment.sinks.local import RESULTS_FILE, read_results

INFEASIBLE_LOWER = 1e18  # an infeasible trial's value when the search minimizes (finite: Optuna stores it)


def objective(cfg: DictConfig) -> float:
    """What run.py returns to a search sweeper (conf/hparams_search/), read from the job's results.json."""
    hydra_cfg = HydraConfig.get()
    results = read_results(Path(hydra_cfg.runtime.output_dir) / RESULTS_FILE)
    searching = "BasicSweeper" not in str(hydra_cfg.sweeper.get("_target_", "BasicSweeper"))
    search = cast(dict, OmegaConf.to_container(cfg.search, resolve=True))
    return objective_of(results, search, say=searching)


def objective_of(results: dict, search: dict, say: bool = True) -> float:
    """`search.objective`, or `search.infeasible_value` for a failed job, a p99 TTFT above the limit, or a
    job flagged busy (infeasible by noise: its number measured the neighbour, so it is never the best)."""
    summary = results.get("summary", {})
    value = summary.get(search.get("objective", "output_throughput"))
    limit, p99 = search.get("max_p99_ttft_ms"), summary.get("p99_ttft_ms")
    too_slow = limit is not None and not (is_number(p99) and p99 <= limit)
    busy = bool(summary.get("noise_busy_repeats"))
    if busy and say and results.get("status") == "ok":  # `say`: a search sweeper reads the value
        print("nanoexp: search trial infeasible by noise (machine busy; see noise_warning)", file=sys.stderr)
    if results.get("status") != "ok" or not is_number(value) or too_slow or busy:
        return infeasible_value(search)
    return float(value)


def infeasible_value(search: dict) -> float:
    """`search.infeasible_value`; unset, the worst value of the objective's direction (0 for a rate, a
    huge latency for a metric where lower is better), so an infeasible trial is never the best."""
    chosen = search.get("infeasible_value")
    if chosen is not None:
        return float(chosen)
    return INFEASIBLE_LOWER if registry.better(search.get("objective", "")) == registry.LOWER else 0.0
