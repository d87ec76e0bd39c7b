"""The device calls' scripts in their CPU smoke mode (SMOKE=1: qwen3_tiny, a handful of requests, the
tests only collected): every part runs end to end, leaves at most the files the device returns (8, two
folders deep) under $OUT, and logs its progress in elapsed seconds, so a GPU call does not die on a typo,
a missing override or a wrong path."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT


def smoke(script: str, tmp_path: Path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path / "out"
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "HYDRA_FULL_ERROR"))}
    full_env |= {"SMOKE": "1", "OUT": str(out), "PYTHON": sys.executable, "HOME": str(tmp_path / "home")}
    full_env |= {"WORK": str(tmp_path / "work"), "TMPDIR": str(tmp_path), "PYTHONPATH": str(ROOT)} | env
    cmd = ["bash", str(ROOT / script), *args]
    proc = subprocess.run(cmd, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=600)
    return proc, out


def returned_files(out: Path) -> list[Path]:
    files = [p for p in out.rglob("*") if p.is_file()]
    assert all(len(p.relative_to(out).parts) <= 3 for p in files)  # $OUT/a/b/file at most
    return files


@pytest.mark.slow
def test_reliability_check_smoke_runs_every_part(tmp_path: Path) -> None:
    proc, out = smoke("experiments/reliability/gpu_check.sh", tmp_path, "load", "step", "tests")
    log = (out / "reliability.log").read_text()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for part in ("load", "step", "tests"):
        assert re.search(rf"^\[\+\d+s\] {part} exit 0$", log, re.M), log[-3000:]
    assert "check / load:" in log and "with/without" in log and "tests collected" in log
    assert [p.name for p in returned_files(out)] == ["reliability.log"]


@pytest.mark.slow
def test_workloads_study_smoke_runs_every_part(tmp_path: Path) -> None:
    proc, out = smoke("experiments/serving/gpu_workloads.sh", tmp_path, RATES="16,inf")
    log = (out / "workloads.log").read_text()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = re.findall(r"^\[\+\d+s\] .*: rc (\d+) wall \d+ ms$", log, re.M)
    assert runs == ["0"] * 6, log[-3000:]  # 2 rate sweeps, 2 x 3 seeds, the trace sweep, the search
    assert "greedy tokens equal, fresh vs reused engine: 2 of 2 jobs" in log
    assert "greedy tokens equal, fresh vs reused engine: 3 of 3 jobs" in log
    verdicts = [row.rsplit("|", 2)[1].strip() for row in (out / "aa.md").read_text().splitlines()[4:]]
    assert len(verdicts) == 5 and set(verdicts) <= {"within noise", "**differs**"}, verdicts
    assert re.search(r"^capacity: ", log, re.M)
    assert sorted(p.name for p in returned_files(out)) == ["aa.md", "workloads.log", "workloads.tgz"]


@pytest.mark.slow
def test_fused_fp8_before_after_smoke_runs_every_step(tmp_path: Path) -> None:
    proc, out = smoke("experiments/fp8/gpu_fused.sh", tmp_path, BASE=str(ROOT), BASE_LABEL="base")
    log = (out / "fused.log").read_text()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    steps = re.findall(r"^\[\+\d+s\] (.+): rc (\d+) wall \d+ s", log, re.M)
    assert steps == [
        ("tests", "0"),
        ("base tpot", "0"),
        ("new tpot", "0"),
        ("base prefill", "0"),
        ("new prefill", "0"),
        ("bench", "0"),
        ("gemv tests", "0"),
        ("gemv", "0"),
    ], log[-3000:]
    for name in ("fused_tests.log", "gemv.log"):  # -m gpu: the GPU tests only
        collected = [line for line in (out / name).read_text().splitlines() if "::" in line]
        assert collected and all("::test_gpu_" in line for line in collected), name
    rows = [line.split("|")[1:-1] for line in log.splitlines() if line.startswith("| ")]
    numbers = [row for row in rows if row[1].strip() in ("none", "fp8", "fp8 / none")]
    assert len(numbers) == 9 and all(float(row[2]) > 0 and float(row[3]) > 0 for row in numbers), log[-3000:]
    assert sorted(p.name for p in returned_files(out)) == [
        "fused.log",
        "fused_runs.tgz",
        "fused_tests.log",
        "gemv.log",
        "kernel_bench.log",
    ]


def test_fused_fp8_before_after_refuses_a_missing_base(tmp_path: Path) -> None:
    proc, out = smoke("experiments/fp8/gpu_fused.sh", tmp_path, BASE=str(tmp_path / "nowhere"))
    assert proc.returncode == 2 and "BASE=<dir>" in (out / "fused.log").read_text()
