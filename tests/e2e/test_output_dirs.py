"""Faults of the output directory never cost or corrupt a result: a second sweep into a live
sweep's dir is refused, results files are whole or absent (a full disk), results.json never says
`ok` for a job that failed, an unwritable run dir is one line, and job dirs stay in the sweep dir."""

from __future__ import annotations

import csv
import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT, error_lines, job_env
from helpers import TINY_JOB as TINY
from hydra.experimental.callback import Callback

from nanoexp.experiment.launch.sweep_callback import lock_sweep_dir
from nanoexp.experiment.runtime.job_info import JobInfo
from nanoexp.experiment.sinks.local import LocalSink

QUICK = [
    *TINY,
    "logger=none",
    "workload.num_requests=2",
    "workload.output_len=2",
    "metrics.kv_quality.num_requests=0",
]


def run_py(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = job_env(tmp_path / "home")
    cmd = [sys.executable, "run.py", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_a_second_sweep_into_a_live_sweeps_dir_is_refused(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    lock = lock_sweep_dir(sweep)  # this process is the live sweep
    try:
        proc = run_py(tmp_path, "-m", f"hydra.sweep.dir={sweep}", *QUICK, "workload.seed=0,1")
    finally:
        lock.close()
    lines = error_lines(proc)
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert "another sweep" in lines[0] and f"pid {os.getpid()}" in lines[0]
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in sweep.iterdir()) == [".sweep.lock"]  # no job of it ran


class NoSpace:
    """A stand-in for a full disk: every write of a file fails with ENOSPC after the file was
    created, as the kernel does once the disk has inodes but no blocks."""

    def __init__(self, monkeypatch) -> None:
        opened = Path.open

        def open_full(path, mode="r", *args, **kwargs):
            f = opened(path, mode, *args, **kwargs)
            if "w" in mode or "a" in mode:
                f.write = self.fail
            return f

        monkeypatch.setattr(Path, "open", open_full)

    @staticmethod
    def fail(*args) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_full_disk_leaves_no_empty_or_half_written_results(tmp_path: Path, monkeypatch) -> None:
    sink = LocalSink()
    sink.start({"k": 1}, JobInfo(tmp_path, [], "job", None))
    sink.log_step(0, {"step": 0})
    NoSpace(monkeypatch)
    with pytest.raises(OSError, match="No space left"):
        sink.log_requests([{"request_id": 0}])
    with pytest.raises(OSError, match="No space left"):
        sink.finish({"output_throughput": 1.0})
    assert list(tmp_path.iterdir()) == []


class FullDiskAfterResults(Callback):
    """Test-only: the disk fills up after the loggers wrote results.json, while the job appends
    its summary to run.log."""

    def on_job_start(self, config, **kwargs) -> None:
        main = sys.modules["nanoexp.experiment.job.main"]  # the package's `main` attribute is the function

        def append_run_log(job, text) -> None:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(job.out_dir / "run.log"))

        main.append_run_log = append_run_log


def test_results_never_say_ok_for_a_job_that_failed_after_writing_them(tmp_path: Path) -> None:
    job = tmp_path / "job"
    callback = "+hydra.callbacks.full._target_=tests.e2e.test_output_dirs.FullDiskAfterResults"
    proc = run_py(tmp_path, f"hydra.run.dir={job}", callback, *QUICK)
    assert proc.returncode == 1, proc.stderr[-2000:]
    results = json.loads((job / "results.json").read_text())
    assert results["status"] == "failed" and results["exit_code"] == 1
    assert "No space left on device" in results["summary"]["error"]
    assert results["summary"]["output_throughput"] > 0  # what the job measured is kept


def test_an_unwritable_run_dir_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("")  # a stand-in that fails the same mkdir as a read-only dir
    proc = run_py(tmp_path, f"hydra.run.dir={blocker / 'job'}", *QUICK)
    lines = error_lines(proc)
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr[-2000:]
    assert "cannot write" in lines[0] and str(blocker) in lines[0]
    assert "Traceback" not in proc.stderr


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only dirs")
def test_a_read_only_run_dir_is_one_line(tmp_path: Path) -> None:
    job = tmp_path / "job"
    job.mkdir()
    job.chmod(0o555)
    try:
        proc = run_py(tmp_path, f"hydra.run.dir={job}", *QUICK)
    finally:
        job.chmod(0o755)
    lines = error_lines(proc)
    assert proc.returncode == 1 and len(lines) == 1 and "Permission denied" in lines[0], proc.stderr


def test_swept_values_with_dots_and_slashes_stay_inside_the_sweep_dir(tmp_path: Path) -> None:
    sweep = tmp_path / "a" / "b" / "sweep"
    proc = run_py(tmp_path, "-m", f"hydra.sweep.dir={sweep}", *QUICK, "notes=../../../escape,x/y")
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("results.json"))
    assert len(found) == 2 and all(p.parent.parent == Path("a/b/sweep") for p in found), found
    with (sweep / "sweep_summary.csv").open() as f:
        assert [r["status"] for r in csv.DictReader(f)] == ["ok", "ok"]


def test_a_sweep_dir_holding_earlier_results_is_refused_unless_appending(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    earlier = sweep / "0_workload.seed=5"
    earlier.mkdir(parents=True)
    (earlier / "results.json").write_text('{"status": "ok", "job": {"job_num": 0}, "summary": {}}')
    proc = run_py(tmp_path, "-m", f"hydra.sweep.dir={sweep}", *QUICK, "workload.seed=0")
    lines = error_lines(proc)
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert "already holds an earlier sweep's results (0_workload.seed=5/results.json)" in lines[0]
    assert "append_to_sweep=true" in lines[0]
    proc = run_py(
        tmp_path, "-m", f"hydra.sweep.dir={sweep}", *QUICK, "workload.seed=0", "append_to_sweep=true"
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(list(sweep.glob("*/results.json"))) == 2
