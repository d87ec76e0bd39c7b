"""The value run.py returns, which a search sweeper (conf/hparams_search/) optimizes: the job's
`search.objective` metric, or `search.infeasible_value` when the job failed or its p99 TTFT is
above `search.max_p99_ttft_ms`."""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from nanoexp.config.checks import is_number
from nanoexp.experiment.local_sink import RESULTS_FILE


def objective(cfg: DictConfig) -> float:
    """The objective of the job that just ran (read back from its results.json)."""
    from hydra.core.hydra_config import HydraConfig

    search = OmegaConf.to_container(cfg.search, resolve=True) if "search" in cfg else {}
    path = Path(HydraConfig.get().runtime.output_dir) / RESULTS_FILE if HydraConfig.initialized() else None
    results = json.loads(path.read_text()) if path is not None and path.is_file() else {}
    return objective_of(results, search)


def objective_of(results: dict, search: dict) -> float:
    infeasible = float(search.get("infeasible_value", 0.0))
    summary = results.get("summary", {})
    value = summary.get(search.get("objective", "output_throughput"))
    if results.get("status") != "ok" or not is_number(value):
        return infeasible
    limit, p99 = search.get("max_p99_ttft_ms"), summary.get("p99_ttft_ms")
    if limit is not None and not (is_number(p99) and p99 <= limit):
        return infeasible
    return float(value)
