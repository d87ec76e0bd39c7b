"""hparams_search=throughput_slo: Optuna runs trials of engine settings and reports the one with
the highest output throughput whose p99 TTFT meets the SLO; run.py returns each trial's objective."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import ROOT, job_env

from nanoexp.experiment.job.objective import objective_of

SEARCH = {"objective": "output_throughput", "max_p99_ttft_ms": 100.0, "infeasible_value": 0.0}


def test_objective_is_the_metric_only_when_the_slo_holds() -> None:
    ok = {"status": "ok", "summary": {"output_throughput": 50.0, "p99_ttft_ms": 80.0}}
    slow = {"status": "ok", "summary": {"output_throughput": 90.0, "p99_ttft_ms": 120.0}}
    failed = {"status": "failed", "summary": {"error": "x"}}
    assert objective_of(ok, SEARCH) == 50.0
    assert objective_of(slow, SEARCH) == 0.0 and objective_of(failed, SEARCH) == 0.0
    assert objective_of(slow, SEARCH | {"max_p99_ttft_ms": None}) == 90.0


def test_a_trial_flagged_busy_is_infeasible_never_the_best() -> None:
    busy = {
        "status": "ok",
        "summary": {"output_throughput": 5000.0, "p99_ttft_ms": 1.0, "noise_busy_repeats": 1},
    }
    assert objective_of(busy, SEARCH) == 0.0
    latency = {"objective": "p99_ttft_ms", "infeasible_value": None}
    assert objective_of(busy, latency) >= 1e18  # minimizing: the worst value, not 0 (which would win)


def test_optuna_search_runs_four_trials_and_reports_the_best(tmp_path: Path) -> None:
    env = job_env(tmp_path / "home")
    sweep = tmp_path / "sweep"
    overrides = [
        "hparams_search=throughput_slo",
        "model=qwen3_tiny",
        "hydra.sweeper.n_trials=4",
        "logger=none",
    ]
    overrides += ["workload.num_requests=4", "workload.output_len=6", "workload.range_ratio=0"]
    overrides += ["cache.cpu_kv_cache_gib=0.05", "search.max_p99_ttft_ms=60000", f"hydra.sweep.dir={sweep}"]
    overrides += ["metrics.noise.busy_cores=1000"]  # the search's mechanics, on a shared machine too
    proc = subprocess.run(
        [sys.executable, "run.py", *overrides], cwd=ROOT, env=env, capture_output=True, text=True, timeout=400
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    trials = []
    assert sorted(p.name for p in sweep.glob("[0-9]*")) == ["0", "1", "2", "3"]  # trial numbers
    for path in sorted(sweep.glob("[0-9]*/results.json")):
        results = json.loads(path.read_text())
        search = results["config"]["search"]
        trials.append((objective_of(results, search), results["config"]))
    assert len(trials) == 4 and all(value > 0 for value, _ in trials)
    best = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    value, config = max(trials, key=lambda t: t[0])
    assert best["best_value"] == pytest.approx(value)
    assert best["best_params"]["cache.block_size"] == config["cache"]["block_size"]
    assert best["best_params"]["scheduler.max_num_seqs"] == config["scheduler"]["max_num_seqs"]
    assert "Best parameters" in proc.stderr + proc.stdout
    assert (sweep / "sweep_summary.csv").is_file()  # the sweep report covers the trials too
