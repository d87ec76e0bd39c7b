"""The printed summary of real jobs against their results.json: memory, start-up and backend rows
say what the engine measured and used, and agree with each other."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nanoexp.runner.peak_memory import peak_memory_bytes, reset_peak_memory

ROOT = Path(__file__).resolve().parents[1]
TINY = ["model=qwen3_tiny", "cache.cpu_kv_cache_gib=0.05", "logger=none", "metrics.kv_quality.num_requests=0"]
LABEL_WIDTH = 30  # summary_table's label column
LINUX = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a per-job resident peak: Linux")


def run_job(tmp_path: Path, *overrides: str) -> tuple[dict[str, str], list[str], dict]:
    """The printed table (label -> cells), its header lines, and results.json's summary."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "HYDRA_FULL_ERROR"))}
    env |= {"HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "run.py", f"hydra.run.dir={tmp_path / 'job'}", *TINY, *overrides]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("-----"))
    rows = {line[:LABEL_WIDTH].strip(): line[LABEL_WIDTH:].strip() for line in lines[start + 1 :]}
    summary = json.loads((tmp_path / "job" / "results.json").read_text())["summary"]
    return rows, lines[start - 3 : start], summary


def gb(value: float) -> str:
    return f"{value / 1e9:.3g}"


def seconds(*values: float) -> str:
    return " / ".join(f"{v:.2f}" for v in values) + " s"


@LINUX
def test_engine_summary_agrees_with_results(tmp_path: Path) -> None:
    rows, header, summary = run_job(tmp_path)
    weights, kv = summary["weights_bytes"], summary["kv_cache_bytes"]
    assert rows["weights / KV cache"] == f"{gb(weights)} / {gb(kv)} GB"
    assert summary["peak_memory_kind"] == "resident"
    assert rows["peak memory (resident)"] == f"{gb(summary['peak_memory_bytes'])} GB"
    # resident: the weights are, KV blocks never written are not (a CPU cache is reserved, not touched)
    assert summary["peak_memory_bytes"] >= weights
    # on a CPU the engine neither warms up nor captures graphs; the job's warm-up request ran
    assert summary["warmup_s"] == 0 and not summary["cuda_graphs"]
    assert rows["load"] == seconds(summary["load_s"])
    assert summary["bench_warmup_s"] > 0 and rows["warm-up request"] == seconds(summary["bench_warmup_s"])
    assert header[1] == f"TP 1, block size 256, rate inf, attention {summary['attention_backend']}"


@LINUX
def test_baseline_summary_shows_no_paged_cache(tmp_path: Path) -> None:
    rows, header, summary = run_job(tmp_path, "engine=hf", "engine.warmup=false")
    assert header[1] == f"rate inf, attention {summary['attention_backend']}"  # no TP, no blocks
    assert rows["weights"] == f"{gb(summary['weights_bytes'])} GB" and "weights / KV cache" not in rows
    assert rows["peak memory (resident)"] == f"{gb(summary['peak_memory_bytes'])} GB"
    assert summary["peak_memory_bytes"] >= summary["weights_bytes"]
    assert rows["load"] == seconds(summary["load_s"])
    assert summary["bench_warmup_s"] == 0 and "warm-up request" not in rows


@LINUX
def test_resident_peak_restarts_at_a_reset() -> None:
    cpu = torch.device("cpu")
    big = torch.ones(2**27)  # 512 MiB, resident
    before = peak_memory_bytes(cpu)
    del big
    assert reset_peak_memory(cpu) == "resident"
    assert peak_memory_bytes(cpu) < before - 2**28
