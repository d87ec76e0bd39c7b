"""Sweeps that keep the engine: a rate sweep builds one engine (its jobs say `engine_reused`), gives the
same greedy tokens as fresh engines, and a sweep over an engine setting still builds one per job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = ["model=qwen3_tiny", "cache.cpu_kv_cache_gib=0.05", "logger=none", "metrics.kv_quality.num_requests=0"]
WORK = [
    "sampler=greedy",
    "save_outputs=true",
    "workload.num_requests=4",
    "workload.output_len=6",
    "repeats=2",
]


def sweep(tmp_path: Path, name: str, *overrides: str) -> list[dict]:
    """Each job's summary and output tokens, in job order."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "HYDRA_FULL_ERROR"))}
    env |= {"HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "run.py", "-m", f"hydra.sweep.dir={tmp_path / name}", *TINY, *WORK, *overrides]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = sorted(
        (p.parent for p in (tmp_path / name).glob("*/results.json")), key=lambda d: int(d.name.split("_")[0])
    )
    out = []
    for job in jobs:
        summary = json.loads((job / "results.json").read_text())["summary"]
        rows = [json.loads(line) for line in (job / "outputs.jsonl").read_text().splitlines()]
        tokens = [(r["repeat"], r["request_id"], r["output_token_ids"]) for r in rows]
        out.append(summary | {"tokens": tokens})
    return out


@pytest.mark.slow
def test_a_six_point_rate_sweep_builds_one_engine_and_matches_fresh_engines(tmp_path: Path) -> None:
    rates = "workload.request_rate=40,80,160,320,640,inf"
    reused = sweep(tmp_path, "reused", rates)
    fresh = sweep(tmp_path, "fresh", rates, "engine.reuse=false")
    assert [float(j["offered_request_rate"]) for j in reused] == [40, 80, 160, 320, 640, float("inf")]
    assert [j["engine_reused"] for j in reused] == [False] + [True] * 5
    assert [j["engine_id"] for j in reused] == [1] * 6  # one engine built in the sweep's process
    assert [j["engine_reused"] for j in fresh] == [False] * 6
    assert [j["engine_id"] for j in fresh] == [1, 2, 3, 4, 5, 6]  # a fresh engine per job
    for a, b in zip(reused, fresh):
        assert a["tokens"] == b["tokens"]  # greedy, request ids and all
        assert a["prefix_cache_hit_rate"] == b["prefix_cache_hit_rate"] == 0  # cache reset between jobs
    assert all(j["build_s"] < 0.1 * reused[0]["build_s"] + 0.05 for j in reused[1:])


@pytest.mark.slow
def test_a_sweep_over_an_engine_setting_rebuilds(tmp_path: Path) -> None:
    jobs = sweep(tmp_path, "blocks", "cache.block_size=16,32", "workload.request_rate=inf")
    assert [j["engine_reused"] for j in jobs] == [False, False] and [j["engine_id"] for j in jobs] == [1, 2]
    assert [j["kv_block_size"] for j in jobs] == [16, 32]
