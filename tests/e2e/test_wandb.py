"""W&B never blocks or orphans a job: an unreachable server means an offline run after a bounded
wait and one warning line; W&B's files stay under the job's dir; the fan-out finishes every
logger even when one of them raises."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from helpers import ROOT

from nanoexp.experiment.runtime.job_info import JobInfo
from nanoexp.experiment.sinks.local import RESULTS_FILE, FanoutLogger, LocalSink
from nanoexp.experiment.sinks.wandb_sink import INIT_TIMEOUT_S


@pytest.fixture
def silent_server():
    """A W&B 'server' on loopback that accepts connections and never answers."""
    server = socket.create_server(("127.0.0.1", 0))
    held, stop = [], threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


def unreachable_env(tmp_path: Path, base_url: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "TMPDIR"))}
    for name in ("home", "tmp"):
        (tmp_path / name).mkdir()
    return env | {
        "WANDB_BASE_URL": base_url,
        "WANDB_API_KEY": "0" * 40,
        "HOME": str(tmp_path / "home"),
        "TMPDIR": str(tmp_path / "tmp"),
        "PYTHONPATH": str(ROOT),
    }


LOGGER_JOB = """
import sys
from pathlib import Path
from nanoexp.experiment.runtime.job_info import JobInfo
from nanoexp.experiment.sinks.local import LocalSink
from nanoexp.experiment.sinks.local import FanoutLogger
from nanoexp.experiment.schema import LoggerConfig
from nanoexp.experiment.sinks.wandb_sink import WandbLogger

job = JobInfo(Path(sys.argv[1]), [], "silent-server", None)
logger = FanoutLogger([WandbLogger(LoggerConfig(upload_results=True)), LocalSink()])
logger.start({"x": 1}, job)
for step in range(3):
    logger.log_step(step, {"step": step, "tokens": 10 * step})
logger.log_requests([{"request": 0, "output_len": 4}])
logger.finish({"completed": 1}, 0)
"""


def test_unreachable_server_falls_back_offline_after_the_bounded_wait(tmp_path, silent_server):
    """The wait is bounded in the code (wandb's init timeout, INIT_TIMEOUT_S), which the warning
    names; no wall clock is asserted (a busy machine is slow, not wrong)."""
    env = unreachable_env(tmp_path, silent_server)
    proc = subprocess.run(
        [sys.executable, "-c", LOGGER_JOB, str(tmp_path / "job")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    warnings = [ln for ln in proc.stderr.splitlines() if "offline" in ln]
    assert f"no online run within {INIT_TIMEOUT_S:g} s (Timed out" in warnings[0], proc.stderr
    assert len(warnings) == 1 and "warning" in warnings[0], proc.stderr
    results = json.loads((tmp_path / "job" / RESULTS_FILE).read_text())
    assert results["status"] == "ok" and results["job"]["wandb"]["mode"] == "offline"
    assert Path(results["job"]["wandb"]["dir"]).is_relative_to(tmp_path / "job")
    assert_nothing_left_outside(tmp_path)


def assert_nothing_left_outside(tmp_path: Path) -> None:
    left = [p for name in ("home", "tmp") for p in (tmp_path / name).rglob("*")]
    assert not left, f"W&B left files outside the job dir: {left[:5]}"


def test_run_py_with_unreachable_server_finishes_offline(tmp_path, silent_server):
    env = unreachable_env(tmp_path, silent_server) | {"WANDB_INIT_TIMEOUT": "5"}
    cmd = [
        sys.executable,
        "run.py",
        f"hydra.run.dir={tmp_path / 'job'}",
        "model=qwen3_tiny",
        "cache.cpu_kv_cache_gib=0.05",
        "workload.num_requests=2",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp_path / "job" / RESULTS_FILE).read_text())
    assert results["summary"]["completed"] == 2 and results["job"]["wandb"]["mode"] == "offline"
    warnings = [ln for ln in proc.stderr.splitlines() if "offline" in ln]
    assert len(warnings) == 1 and "no online run within 5 s (Timed out" in warnings[0], proc.stderr
    assert_nothing_left_outside(tmp_path)


class Recorder:
    def __init__(self, calls: list, name: str, fail: str | None = None):
        self.calls, self.name, self.fail = calls, name, fail

    def _do(self, what: str, *args) -> None:
        self.calls.append((self.name, what, *args))
        if what == self.fail:
            raise RuntimeError(f"{self.name} {what} failed")

    def start(self, config, job):
        self._do("start")

    def log_step(self, step, row):
        self._do("log_step")

    def log_requests(self, rows):
        self._do("log_requests")

    def finish(self, summary, exit_code=0):
        self._do("finish", exit_code)


def fanout(*fails):
    calls: list = []
    loggers = [Recorder(calls, f"l{i}", fail) for i, fail in enumerate(fails)]
    return FanoutLogger(loggers), calls


def job(tmp_path) -> JobInfo:
    return JobInfo(tmp_path / "job", [], "t", None)


def test_every_finish_runs_when_one_raises_and_the_first_error_is_raised(tmp_path):
    logger, calls = fanout(None, "finish", "finish")
    logger.start({}, job(tmp_path))
    with pytest.raises(RuntimeError, match="l2 finish failed"):
        logger.finish({}, 0)
    assert [c[0] for c in calls if c[1] == "finish"] == ["l2", "l1", "l0"]


def test_a_failing_log_call_still_reaches_every_logger(tmp_path):
    logger, calls = fanout("log_step", None)
    logger.start({}, job(tmp_path))
    with pytest.raises(RuntimeError, match="l0 log_step"):
        logger.log_step(0, {})
    assert ("l1", "log_step") in calls
    logger.finish({}, 1)
    assert {c[0] for c in calls if c[1] == "finish"} == {"l0", "l1"}


def test_a_failed_start_finishes_the_loggers_that_started(tmp_path):
    logger, calls = fanout(None, "start", None)
    with pytest.raises(RuntimeError, match="l1 start failed"):
        logger.start({}, job(tmp_path))
    finished = [c for c in calls if c[1] == "finish"]
    assert finished == [("l2", "finish", 1), ("l0", "finish", 1)]
    logger.finish({}, 1)  # nothing left to finish twice
    assert len([c for c in calls if c[1] == "finish"]) == 2


def test_sink_writes_results_when_another_logger_finish_raises(tmp_path):
    calls: list = []
    logger = FanoutLogger([Recorder(calls, "wandb", "finish"), LocalSink()])
    logger.start({"a": 1}, job(tmp_path))
    with pytest.raises(RuntimeError):
        logger.finish({"completed": 3}, 0)
    assert json.loads((tmp_path / "job" / RESULTS_FILE).read_text())["summary"]["completed"] == 3


def test_wandb_finishes_when_results_json_cannot_be_written(tmp_path):
    calls: list = []
    logger = FanoutLogger([Recorder(calls, "wandb"), LocalSink()])
    logger.start({}, job(tmp_path))
    (tmp_path / "job" / RESULTS_FILE).mkdir()  # a directory where the file should go
    with pytest.raises(IsADirectoryError):
        logger.finish({"completed": 3}, 0)
    assert ("wandb", "finish", 0) in calls
