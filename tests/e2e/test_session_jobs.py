"""Multi-turn sessions through run.py: TTFT and prefix-cache hit rate by turn in results.json and in the
sweep report, with prefix caching on and off."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = ["model=qwen3_tiny", "cache.cpu_kv_cache_gib=0.05", "logger=none", "metrics.kv_quality.num_requests=0"]
SESSIONS = ["workload=multi_turn", "workload.num_sessions=3", "workload.num_turns=3", "workload.input_len=24"]
SESSIONS += [
    "workload.output_len=8",
    "workload.think_time_s=0.02",
    "workload.request_rate=20",
    "cache.block_size=16",
]


@pytest.mark.slow
def test_turn_metrics_reach_results_and_the_sweep_report(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "HYDRA_FULL_ERROR"))}
    env |= {"HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "run.py", "-m", f"hydra.sweep.dir={sweep}", *TINY, *SESSIONS]
    cmd += ["cache.enable_prefix_caching=true,false"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [json.loads(p.read_text()) for p in sorted(sweep.glob("*/results.json"))]
    on, off = (r["summary"] for r in results)
    assert on["turn1_prefix_hit_rate"] == 0 and on["turn3_prefix_hit_rate"] > 0.5
    assert off["followup_prefix_hit_rate"] == 0 and on["followup_prefix_hit_rate"] > 0.4
    assert all(f"turn{k}_mean_ttft_ms" in on for k in (1, 2, 3))
    requests = pd.read_csv(next(sweep.glob("0_*/requests.csv")))
    assert sorted(zip(requests["session"], requests["turn"])) == [(s, t) for s in range(3) for t in (1, 2, 3)]
    table = pd.read_csv(sweep / "sweep_summary.csv")
    assert {"turn1_mean_ttft_ms", "turn3_prefix_hit_rate", "followup_prefix_hit_rate"} <= set(table.columns)
    assert "turn3_prefix_hit_rate" in (sweep / "sweep_summary.md").read_text()
