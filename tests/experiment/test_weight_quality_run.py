"""`metrics.weight_quality` through run.py: an fp8 job reports its weights' cost against the unquantized
model beside its speed; an unquantized job reports none."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # a run.py job
def test_fp8_job_reports_weight_quality_beside_speed(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "offline", "HOME": str(tmp_path)}
    cmd = [
        sys.executable,
        "run.py",
        "-m",
        "model=qwen3_tiny",
        "model.quantization=none,fp8",
        "workload=latency",
        "workload.batch_size=2",
        "workload.input_len=12",
        "workload.output_len=4",
        "workload.num_iters=1",
        "workload.num_iters_warmup=0",
        "metrics.weight_quality.num_requests=2",
        "metrics.weight_quality.num_tokens=3",
        "logger=none",
        "cache.cpu_kv_cache_gib=0.05",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        "hydra.sweep.subdir=${hydra.job.num}",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    none, fp8 = (
        json.loads((tmp_path / "sweep" / str(i) / "results.json").read_text())["summary"] for i in (0, 1)
    )
    assert not any(k.startswith("weight_quality/") for k in none) and none["weight_quantization"] == "none"
    assert fp8["weight_quantization"] == "fp8" and fp8["weights_bytes"] < none["weights_bytes"]
    assert fp8["weight_quality/num_positions"] == 6 and fp8["weight_quality/num_requests"] == 2
    assert 0.0 <= fp8["weight_quality/greedy_agreement"] <= 1.0 and fp8["weight_quality/kl_mean"] >= 0.0
    assert fp8["mean_tpot_ms"] > 0


@pytest.mark.slow  # a run.py job
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.quantization=int4"], "model.quantization='int4' is invalid: must be one of none, fp8"),
        (
            ["model.quantization=fp8", "engine=hf"],
            "model.quantization='fp8' is invalid: must be 'none' with engine=hf",
        ),
    ],
)
def test_bad_quantization_is_one_line_exit_2(tmp_path, overrides, message):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "offline", "HOME": str(tmp_path)}
    cmd = [sys.executable, "run.py", "model=qwen3_tiny", *overrides, f"hydra.run.dir={tmp_path}"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert message in proc.stderr
