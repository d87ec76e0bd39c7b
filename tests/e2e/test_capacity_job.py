"""experiment=capacity through run.py: the search converges within its precision on one engine, its answer
lies between a probe that met the SLOs and one that did not, and the report shows every probe."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = ["model=qwen3_tiny", "cache.cpu_kv_cache_gib=0.05", "logger=none"]


@pytest.mark.slow
def test_capacity_search_converges_between_a_passing_and_a_failing_probe(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "HYDRA_FULL_ERROR"))}
    env |= {"HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}
    search = [
        "experiment=capacity",
        "workload.num_requests=64",
        "workload.input_len=256",
        "workload.output_len=4",
    ]
    # a TTFT bound one prefill meets and a burst of 64 does not, on a fast or a busy CPU alike
    search += ["metrics.slo.ttft_ms=40", "metrics.slo.tpot_ms=null", "capacity.start_rate=16", "repeats=1"]
    search += [
        "capacity.precision=0.5",
        "capacity.max_rate=4096",
        "capacity.min_rate=0.25",
        "capacity.max_probes=10",
    ]
    cmd = [sys.executable, "run.py", f"hydra.run.dir={tmp_path / 'run'}", *TINY, *search]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "results.json").read_text())["summary"]
    probes = summary["capacity_probes"]
    assert summary["capacity_converged"] and summary["capacity_num_probes"] == len(probes) <= 10
    low, high = summary["capacity_bracket_low"], summary["capacity_bracket_high"]
    assert high / low - 1 <= 0.5 and summary["capacity_request_rate"] == low
    assert any(p["passed"] and p["rate"] == low for p in probes)
    assert any(not p["passed"] and p["rate"] == high for p in probes)
    assert all(p["attainment"] >= 0.9 for p in probes if p["passed"])
    assert summary["offered_request_rate"] == low  # the job's metrics are those of the probe at the capacity
    for p in probes:
        assert (tmp_path / "run" / p["dir"] / "requests.csv").is_file()
    report = (tmp_path / "run" / "capacity.md").read_text()
    assert report.count("| probes/") == len(probes) and f"capacity: {low:.4g} req/s" in report
    assert (tmp_path / "run" / "capacity.png").stat().st_size > 10_000
    assert f"capacity: {low:.4g} req/s" in proc.stdout
