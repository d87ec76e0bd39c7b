"""Trace replay through run.py: arrivals are the trace's timestamps (scaled), lengths its lengths, and a
Mooncake trace's shared hash_ids blocks are served from the prefix cache, exactly."""

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


def run_job(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "HYDRA_FULL_ERROR"))}
    env |= {"HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "run.py", f"hydra.run.dir={tmp_path / 'run'}", *TINY, *overrides]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def requests_csv(tmp_path: Path) -> pd.DataFrame:
    return pd.read_csv(tmp_path / "run" / "requests.csv").sort_values("request_id")


AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,40,5
2023-11-16 18:15:46.7005900,12,3
2023-11-16 18:15:46.9105901,80,7
2023-11-16 18:15:47.1234567,33,4
"""
BURSTGPT = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
100.0,ChatGPT,20,5,25,Conversation log
100.05,GPT-4,30,9,39,Conversation log
100.3,ChatGPT,16,2,18,API log
100.45,GPT-4,50,11,61,Conversation log
"""


@pytest.mark.parametrize(
    ("name", "text", "knobs", "offsets", "lengths"),
    [
        ("a.csv", AZURE, [], [0.0, 0.02, 0.2300001, 0.4428667], [(40, 5), (12, 3), (80, 7), (33, 4)]),
        ("b.csv", BURSTGPT, ["workload.model_filter=GPT-4"], [0.0, 0.4], [(30, 9), (50, 11)]),
    ],
)
def test_csv_trace_arrivals_and_lengths(tmp_path: Path, name, text, knobs, offsets, lengths) -> None:
    (tmp_path / name).write_text(text)
    proc = run_job(
        tmp_path, "workload=trace", f"workload.path={tmp_path / name}", "workload.time_scale=1.5", *knobs
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = requests_csv(tmp_path)
    assert rows["arrival_ms"].tolist() == pytest.approx([1.5e3 * t for t in offsets], abs=0.5)
    assert list(zip(rows["prompt_len"], rows["output_len"])) == lengths
    summary = json.loads((tmp_path / "run" / "results.json").read_text())["summary"]
    assert summary["offered_request_rate"] == pytest.approx((len(offsets) - 1) / (1.5 * offsets[-1]))


@pytest.mark.slow
def test_mooncake_shared_blocks_come_from_the_prefix_cache(tmp_path: Path) -> None:
    keys = ("timestamp", "input_length", "output_length", "hash_ids")
    rows = [
        (0, 101, 3, [1, 2, 3]),
        (800, 105, 2, [1, 2, 7]),
        (1600, 120, 2, [1, 2, 3, 9]),
        (2400, 40, 2, [5]),
    ]
    path = tmp_path / "mooncake.jsonl"
    path.write_text("".join(json.dumps(dict(zip(keys, r))) + "\n" for r in rows))
    proc = run_job(
        tmp_path,
        "workload=trace",
        f"workload.path={path}",
        "workload.trace_block_size=32",
        "cache.block_size=16",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = requests_csv(tmp_path)
    assert out["arrival_ms"].tolist() == pytest.approx([0, 800, 1600, 2400], abs=0.5)
    assert out["prompt_len"].tolist() == [101, 105, 120, 40]
    assert out["num_cached_tokens"].tolist() == [0, 2 * 32, 3 * 32, 0]  # k blocks of the trace, exactly
    assert out["origin"].tolist() == [f"mooncake.jsonl:{i}" for i in range(1, 5)]


def test_a_trace_missing_a_column_is_one_line_and_exit_2(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46,3\n")
    proc = run_job(tmp_path, "workload=trace", f"workload.path={tmp_path / 'a.csv'}", "workload.format=azure")
    assert proc.returncode == 2
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("nanoexp: error:")]
    assert "workload.format=azure" in line and "lacks the column(s) GeneratedTokens" in line
