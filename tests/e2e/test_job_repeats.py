"""repeats=N: N timed passes on one engine, each headline metric with mean, std and a 95% CI."""

from __future__ import annotations

import csv
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT, TINY_JOB, job_env

from nanoexp.experiment.metrics.summarize import aggregate_repeats

TINY = [*TINY_JOB, "logger=none", "workload.num_requests=4"]


def run_py(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = job_env(tmp_path / "home")
    cmd = [sys.executable, "run.py", f"hydra.run.dir={tmp_path / 'job'}", *TINY, *overrides]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_aggregate_gives_mean_std_and_student_t_interval() -> None:
    summaries = [{"output_throughput": v, "completed": 8, "model": "m"} for v in (11.0, 12.0, 13.0)]
    out = aggregate_repeats(summaries)
    half = 4.302652729911275 / math.sqrt(3)  # t(0.975, df=2) * s / sqrt(n), s = 1
    assert out["repeats"] == 3 and out["completed"] == 8 and out["model"] == "m"
    assert out["output_throughput"] == 12.0 and out["output_throughput_std"] == pytest.approx(1.0)
    assert out["output_throughput_ci95_low"] == pytest.approx(12.0 - half)
    assert out["output_throughput_ci95_high"] == pytest.approx(12.0 + half)
    assert "completed_std" not in out  # counts are not headline metrics


def test_intervals_stay_inside_what_the_metric_can_be() -> None:
    """A t-interval of three noisy TTFTs reaches below zero; the interval stops at 0 (and a
    fraction's at 1) and keeps the mean inside; the table then prints the bounds."""
    from nanoexp.experiment.sinks.summary_table import format_summary

    ttft, attained = [1.0, 1.0, 30.0], [0.8, 1.0, 1.0]
    out = aggregate_repeats([{"mean_ttft_ms": t, "slo_attainment": a} for t, a in zip(ttft, attained)])
    half = 4.302652729911275 * statistics.stdev(ttft) / math.sqrt(3)
    low, high = out["mean_ttft_ms_ci95_low"], out["mean_ttft_ms_ci95_high"]
    assert out["mean_ttft_ms"] - half < 0 and low == 0.0 and high == pytest.approx(out["mean_ttft_ms"] + half)
    assert out["slo_attainment_ci95_high"] == 1.0
    assert 0 < out["slo_attainment_ci95_low"] < out["slo_attainment"]
    p99 = {"p99_ttft_ms": 30.0, "p99_ttft_ms_ci95_low": 20.0, "p99_ttft_ms_ci95_high": 40.0}
    row = f"TTFT mean / p99               10.7 [0.0, {high:.1f}] / 30.0 ± 10.0 ms"
    assert row in format_summary(out | p99).splitlines()


def test_one_repeat_has_no_spread() -> None:
    out = aggregate_repeats([{"output_throughput": 5.0}])
    assert out == {"repeats": 1, "output_throughput": 5.0}


def test_repeats_run_on_one_engine_and_carry_intervals(tmp_path: Path) -> None:
    proc = run_py(
        tmp_path,
        "repeats=2",
        "workload.output_len=8",
        "workload.range_ratio=0",
        "workload.output_range_ratio=0",
        "save_outputs=true",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    job = tmp_path / "job"
    summary = json.loads((job / "results.json").read_text())["summary"]
    assert summary["repeats"] == 2 and len(summary["per_repeat"]) == 2
    # a rate over repeats is total tokens over total time, so rate, tokens and duration agree
    rate = summary["total_output_tokens"] / summary["duration_s"]
    assert summary["output_throughput"] == pytest.approx(rate) and "total" in summary["rates_over_repeats"]
    low, high = summary["output_throughput_ci95_low"], summary["output_throughput_ci95_high"]
    assert low <= high and all(r["output_throughput"] > 0 for r in summary["per_repeat"])
    assert summary["completed"] == 4 and summary["total_output_tokens"] == 32  # per repeat
    with (job / "requests.csv").open() as f:
        requests = list(csv.DictReader(f))
    assert sorted({r["repeat"] for r in requests}) == ["0", "1"] and len(requests) == 8
    with (job / "steps.csv").open() as f:
        assert {r["repeat"] for r in csv.DictReader(f)} == {"0", "1"}
    assert "±" in proc.stdout and "over 2 repeats" in proc.stdout
    outputs = [json.loads(line) for line in (job / "outputs.jsonl").read_text().splitlines()]
    assert sorted(r["repeat"] for r in outputs) == [0] * 4 + [1] * 4  # the knob, on for a random workload
    assert summary["load_s"] > 0 and "load_s_std" not in summary  # one engine, built once


def test_bad_repeats_is_one_line_exit_2(tmp_path: Path) -> None:
    proc = run_py(tmp_path, "repeats=0")
    assert proc.returncode == 2
    line = "nanoexp: error: repeats=0 is invalid: must be an integer >= 1"
    assert proc.stderr.strip().splitlines() == [line]
    assert line in (tmp_path / "job" / "run.log").read_text()


def test_each_repeat_starts_with_an_empty_prefix_cache(tmp_path: Path) -> None:
    """Identical prompts in every repeat: without emptying the cache between repeats, the second
    would be served from what the first cached and its TTFT would not be comparable."""
    proc = run_py(
        tmp_path,
        "repeats=2",
        "reseed_repeats=false",
        "cache.block_size=16",
        "workload.input_len=64",
        "workload.output_len=4",
        "workload.range_ratio=0",
        "workload.output_range_ratio=0",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with (tmp_path / "job" / "requests.csv").open() as f:
        cached = {(r["repeat"], r["request_id"]): int(r["num_cached_tokens"]) for r in csv.DictReader(f)}
    assert len(cached) == 8 and sum(cached.values()) == 0, cached
