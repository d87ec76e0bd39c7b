"""Multirun sweeps: the report callback's CSV/Markdown/plots, and the submitit local launcher."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = ["model=qwen3_tiny", "cache.cpu_kv_cache_gib=0.05", "logger=none", "workload.num_requests=4"]


def multirun(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "HYDRA_FULL_ERROR"))}
    env |= {"HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "run.py", "-m", f"hydra.sweep.dir={tmp_path / 'sweep'}", *TINY, *overrides]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)


def rows(sweep: Path) -> list[dict]:
    with (sweep / "sweep_summary.csv").open() as f:
        return list(csv.DictReader(f))


def test_grid_sweep_writes_report(tmp_path: Path) -> None:
    proc = multirun(tmp_path, "cache.block_size=16,32", "scheduler.max_num_seqs=4,8")
    assert proc.returncode == 0, proc.stderr[-3000:]
    sweep = tmp_path / "sweep"
    table = rows(sweep)
    assert len(table) == 4 and all(r["status"] == "ok" for r in table)
    combos = {(r["param:cache.block_size"], r["param:scheduler.max_num_seqs"]) for r in table}
    assert combos == {("16", "4"), ("16", "8"), ("32", "4"), ("32", "8")}
    assert all(float(r["output_throughput"]) > 0 for r in table)
    markdown = (sweep / "sweep_summary.md").read_text()
    assert "cache.block_size" in markdown and markdown.count("\n| ") >= 5
    for name in ("sweep_cache_block_size.png", "sweep_scheduler_max_num_seqs.png"):
        assert (sweep / name).stat().st_size > 1000


def test_failed_job_is_reported_and_sweep_exits_nonzero(tmp_path: Path) -> None:
    proc = multirun(tmp_path, "cache.block_size=16,48")
    assert proc.returncode != 0
    table = {r["param:cache.block_size"]: r for r in rows(tmp_path / "sweep")}
    assert table["16"]["status"] == "ok" and table["48"]["status"] == "failed"
    assert "cache.block_size" in table["48"]["error"]


def test_submitit_local_launcher_two_jobs(tmp_path: Path) -> None:
    proc = multirun(tmp_path, "hydra/launcher=local", "sampler=greedy,top_p")
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-2000:]
    table = rows(tmp_path / "sweep")
    assert sorted(r["param:sampler"] for r in table) == ["greedy", "top_p"]
    for job_dir in (tmp_path / "sweep").glob("[0-9]*"):
        results = json.loads((job_dir / "results.json").read_text())
        assert results["status"] == "ok" and results["job"]["multirun"]
