"""A ramp job through run.py: requests.csv's arrivals are the ramp's offsets, the realized rate rises as
the ramp does, and the job draws its timeline (offered and achieved rate, TTFT/TPOT by arrival)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from nanoexp.experiment.measure.workloads import arrival_offsets, offered_rates

ROOT = Path(__file__).resolve().parents[2]
TINY = ["model=qwen3_tiny", "cache.cpu_kv_cache_gib=0.05", "logger=none", "metrics.kv_quality.num_requests=0"]


@pytest.mark.slow
def test_ramp_job_arrivals_follow_the_ramp(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "HYDRA_FULL_ERROR"))}
    env |= {"HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}
    ramp = ["workload=random", "workload.num_requests=120", "workload.input_len=16", "workload.output_len=2"]
    ramp += ["workload.request_rate=40", "workload.ramp=linear", "workload.ramp_end_rate=400"]
    cmd = [sys.executable, "run.py", f"hydra.run.dir={tmp_path / 'run'}", *TINY, *ramp]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    arrivals = pd.read_csv(tmp_path / "run" / "requests.csv").sort_values("request_id")["arrival_ms"] / 1e3
    rates = offered_rates(120, 40.0, "linear", 400.0)
    assert arrivals.tolist() == pytest.approx(arrival_offsets(120, 40.0, 1.0, 0, rates), abs=5e-4)
    local = [1 / g.mean() for g in np.array_split(np.diff(arrivals.to_numpy()), 4)]
    slope, intercept = np.polyfit([0.125, 0.375, 0.625, 0.875], local, 1)
    assert intercept == pytest.approx(40, rel=0.6) and intercept + slope == pytest.approx(400, rel=0.4)
    assert (tmp_path / "run" / "timeline.png").stat().st_size > 10_000
    summary = json.loads((tmp_path / "run" / "results.json").read_text())["summary"]
    assert summary["completed"] == 120
