"""run.py's error path: one line, exit code, error.txt, run.log, results.json and a finished W&B
run for every failed job; configs Hydra rejects before any job starts are one line, exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = ["model=qwen3_tiny", "cache.cpu_kv_cache_gib=0.05"]
WANDB = Path(sys.executable).with_name("wandb")


def run_py(tmp_path: Path, *overrides: str, env: dict | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "HYDRA_FULL_ERROR"))}
    base |= {"HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)} | (env or {})  # no key: offline
    cmd = [sys.executable, "run.py", f"hydra.run.dir={tmp_path / 'job'}", *overrides]
    return subprocess.run(cmd, cwd=ROOT, env=base, capture_output=True, text=True, timeout=300)


def error_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [ln for ln in proc.stderr.splitlines() if ln.startswith("nanoexp: error:")]


def wandb_state(results: dict) -> dict:
    run_dir = results["job"]["wandb"]["dir"]
    proc = subprocess.run(
        [str(WANDB), "leet", "inspect", "--json", "--summary", run_dir], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def assert_failed_job_recorded(job: Path, code: int, needle: str) -> dict:
    results = json.loads((job / "results.json").read_text())
    assert results["status"] == "failed" and results["exit_code"] == code
    assert needle in results["summary"]["error"]
    error_txt = (job / "error.txt").read_text()
    assert error_txt.splitlines()[0].startswith(needle) or needle in error_txt.splitlines()[0]
    assert "Traceback (most recent call last)" in error_txt
    assert needle in (job / "run.log").read_text()
    return results


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["cache.block_size=3"], "cache.block_size=3 is invalid"),  # found by our config checks
        (["+no_such_top=1"], "no_such_top: no such config key"),  # found while typing the config
        (["model.load_format=safetensors", "model.path=/nonexistent"], "model.path='/nonexistent'"),
    ],
)
def test_config_failures_leave_results_error_txt_run_log_and_a_finished_wandb_run(
    tmp_path: Path, overrides: list[str], needle: str
) -> None:
    proc = run_py(tmp_path, *TINY, "logger=wandb", *overrides)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = error_lines(proc)
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in proc.stderr
    results = assert_failed_job_recorded(tmp_path / "job", 2, needle)
    state = wandb_state(results)
    assert state["state"] == "failed" and state["exit_code"] == 2  # ended, with the exit code
    assert needle in state["summary"]["error"]
    assert not (tmp_path / "job" / "steps.csv").exists()


def test_a_logger_failing_at_the_end_does_not_hide_the_jobs_error(tmp_path: Path) -> None:
    (tmp_path / "job" / "results.json.partial").mkdir(parents=True)  # the sink cannot write
    proc = run_py(tmp_path, *TINY, "logger=wandb", "workload.request_rate=nan")
    lines = error_lines(proc)
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert "workload.request_rate=nan is invalid" in lines[0]
    assert "failed too" in lines[0] and "results.json.partial" in lines[0]
    results = assert_failed_job_recorded(tmp_path / "job", 2, "workload.request_rate=nan is invalid")
    state = wandb_state(results)
    assert state["state"] == "failed" and state["exit_code"] == 2  # ended, with the exit code


def test_an_unreadable_logger_section_still_leaves_results_and_error_txt(tmp_path: Path) -> None:
    proc = run_py(tmp_path, *TINY, "logger=wandb", "logger.project=${nope}")
    lines = error_lines(proc)
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert "logger.project: Interpolation key 'nope' not found" in lines[0]
    assert_failed_job_recorded(tmp_path / "job", 2, "logger.project: Interpolation key 'nope' not found")
    assert not (tmp_path / "job" / "wandb").exists(), "documented: no W&B run without logger settings"


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("model=nope", "Could not find 'model/nope' (available: qwen2_5_0_5b,"),
        ("cache.block_size=abc", "cache.block_size=abc: Value 'abc' of type 'str' could not be converted"),
        ("nosuch.key=1", "Could not override 'nosuch.key': Key 'nosuch' not in 'NanoexpConfig'"),
        ("logger.kind=bogus", "logger.kind=bogus: Invalid value 'bogus', expected one of [wandb, none]"),
        ("a==b", "Error parsing override 'a==b': extraneous input"),
    ],
)
def test_configs_hydra_rejects_are_one_line_exit_2(tmp_path: Path, override: str, needle: str) -> None:
    proc = run_py(tmp_path, "logger=none", override)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("nanoexp: error: ") and needle in lines[0], lines
    assert not (tmp_path / "job").exists(), "Hydra rejects these before the job dir exists"


def test_hydra_full_error_keeps_hydras_own_report(tmp_path: Path) -> None:
    proc = run_py(tmp_path, "logger=none", "model=nope", env={"HYDRA_FULL_ERROR": "1"})
    assert proc.returncode == 1
    assert "Traceback (most recent call last)" in proc.stderr and "MissingConfigException" in proc.stderr
    assert not error_lines(proc)


def test_runtime_failure_exits_1_pointing_at_error_txt(tmp_path: Path) -> None:
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps({"model_type": "qwen3", "hidden_size": 64}))
    (checkpoint / "model.safetensors").write_bytes(b"not a safetensors file")
    proc = run_py(tmp_path, *TINY, "logger=none", f"model.path={checkpoint}", "model.load_format=safetensors")
    lines = error_lines(proc)
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr[-2000:]
    assert lines[0].endswith(f"(traceback: {tmp_path / 'job' / 'error.txt'})")
    error = lines[0].removeprefix("nanoexp: error: ").split(" (traceback")[0]
    assert_failed_job_recorded(tmp_path / "job", 1, error)
