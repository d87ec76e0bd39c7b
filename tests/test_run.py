"""run.py as a subprocess: results.json, the CSVs and the offline W&B run it leaves behind."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = ["model=qwen3_tiny", "cache.cpu_kv_cache_gib=0.05"]
WANDB = Path(sys.executable).with_name("wandb")


def run_py(tmp_path: Path, *overrides: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "HYDRA_FULL_ERROR"))}
    env |= {"HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}  # no API key: W&B offline
    cmd = [sys.executable, "run.py", f"hydra.run.dir={tmp_path / 'job'}", *overrides]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def read_results(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "job" / "results.json").read_text())


def read_csv(path: Path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(f))


def inspect(run_dir: Path, *flags: str) -> str:
    proc = subprocess.run(
        [str(WANDB), "leet", "inspect", "--json", *flags, str(run_dir)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_run_tiny_writes_results_and_offline_wandb_run(tmp_path: Path) -> None:
    proc = run_py(tmp_path, *TINY, "sampler=greedy")
    results = read_results(tmp_path)
    summary = results["summary"]
    assert results["status"] == "ok" and results["exit_code"] == 0
    assert summary["completed"] == 8 and summary["load_format"] == "dummy"
    for key in ("output_throughput", "total_token_throughput", "request_throughput"):
        assert summary[key] > 0
    for metric in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        for stat in ("mean", "median", "p90", "p99"):
            assert summary[f"{stat}_{metric}"] >= 0
    assert summary["weights_bytes"] > 0 and summary["num_kv_blocks"] > 0
    assert results["config"]["model"]["name"] == "qwen3_tiny"
    assert results["config"]["resolved"]["checkpoint"]["load_format"] == "dummy"
    requests = read_csv(tmp_path / "job" / "requests.csv")
    steps = read_csv(tmp_path / "job" / "steps.csv")
    assert len(requests) == 8 and len(steps) == summary["num_steps"]
    assert sum(int(r["output_len"]) for r in requests) == summary["total_output_tokens"]
    assert "output throughput" in proc.stdout and "wandb sync" in proc.stderr

    run_dir = Path(results["job"]["wandb"]["dir"])
    assert run_dir.is_relative_to(tmp_path / "job") and results["job"]["wandb"]["mode"] == "offline"
    state = json.loads(inspect(run_dir, "--summary"))
    assert state["state"] == "finished" and state["exit_code"] == 0
    assert state["config"]["model"]["name"] == "qwen3_tiny"
    assert state["summary"]["output_throughput"] == pytest.approx(summary["output_throughput"])
    assert state["summary"]["completed"] == 8
    records = [json.loads(line) for line in inspect(run_dir).splitlines()]
    history = [r for r in records if r["type"] == "history"]
    step_rows = [r for r in history if "step_time_ms" in json.dumps(r)]
    assert len(step_rows) == summary["num_steps"]
    assert any("requests" in json.dumps(r) for r in history), "per-request table not logged"
    assert any(r["type"] == "artifact" for r in records), "results.json artifact not logged"


def test_hf_baseline_runs_the_same_workload(tmp_path: Path) -> None:
    run_py(tmp_path, *TINY, "engine=hf", "logger=none", "sampler=top_k")
    summary = read_results(tmp_path)["summary"]
    assert summary["engine_kind"] == "hf" and summary["attention_backend"] == "sdpa"
    assert summary["completed"] == 8 and summary["mean_tpot_ms"] > 0
    requests = read_csv(tmp_path / "job" / "requests.csv")
    assert summary["total_output_tokens"] == sum(int(r["output_len"]) for r in requests)


def test_latency_workload_reports_iteration_percentiles(tmp_path: Path) -> None:
    overrides = ["workload=latency", "workload.num_iters=3", "workload.output_len=8", "logger=none"]
    run_py(tmp_path, *TINY, *overrides)
    summary = read_results(tmp_path)["summary"]
    assert summary["num_iters"] == 3 and summary["completed"] == 3 * 8
    assert summary["p10_latency_ms"] <= summary["p50_latency_ms"] <= summary["p99_latency_ms"]


def test_poisson_arrivals_with_shared_prefix(tmp_path: Path) -> None:
    overrides = ["workload=shared_prefix", "workload.num_requests=8", "workload.prefix_len=256"]
    overrides += ["workload.output_len=4", "workload.request_rate=20", "cache.block_size=16", "logger=none"]
    run_py(tmp_path, *TINY, *overrides)
    summary = read_results(tmp_path)["summary"]
    arrivals = [float(r["arrival_ms"]) for r in read_csv(tmp_path / "job" / "requests.csv")]
    assert summary["completed"] == 8 and max(arrivals) > 50
    assert summary["prefix_cache_hit_rate"] > 0 and summary["total_cached_tokens"] > 0


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["model.foo=1"], "model.foo"),
        (["scheduler.max_num_seqs=abc"], "scheduler.max_num_seqs"),
        (["model=qwen2_5_0_5b", "parallel=tp4"], "parallel.tensor_parallel_size=4"),
        (["cache.block_size=48"], "cache.block_size"),
        (["model.load_format=safetensors", "model.path=/nonexistent"], "model.path='/nonexistent'"),
    ],
)
def test_bad_config_fails_fast_with_one_line(tmp_path: Path, overrides: list[str], expected: str) -> None:
    proc = run_py(tmp_path, "logger=none", *overrides, check=False)
    assert proc.returncode != 0
    assert expected in proc.stderr and "Traceback" not in proc.stderr
    ours = [line for line in proc.stderr.splitlines() if line.startswith("nanoexp: error:")]
    if ours:  # our own checks: exactly one line, and nothing was built
        assert len(ours) == 1 and expected in ours[0]
        assert not (tmp_path / "job" / "steps.csv").exists()


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["+cache.no_such_key=1"], "cache.no_such_key"),
        (["+no_such_top=1"], "no_such_top"),
        (["cache.block_size=3"], "cache.block_size"),
        (["sampler.temperature=-1"], "sampler.temperature"),
    ],
)
def test_unknown_keys_and_rejected_values_exit_2_naming_the_key(tmp_path: Path, overrides, key) -> None:
    proc = run_py(tmp_path, "logger=none", "model=qwen3_tiny", *overrides, check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith(f"nanoexp: error: {key}")
    assert not (tmp_path / "job" / "steps.csv").exists()
