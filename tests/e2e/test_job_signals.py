"""SIGTERM and SIGINT (what `timeout`, Slurm, submitit and Ctrl-C send) end a job of run.py as a
failure like any other: one line, an exit code of 128 + the signal that results.json agrees with,
error.txt, a finished W&B run; a signalled sweep reports the jobs that finished, and the jobs of a
local-launcher sweep do not outlive it."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import ROOT, job_env, wandb_state
from helpers import TINY_JOB as TINY
from hydra.experimental.callback import Callback

READY = "waiting.marker"
# one request now, the next in ~100 s: the job is in its timed pass, waiting, when it is signalled
SLOW = ["workload.num_requests=2", "workload.output_len=2", "metrics.kv_quality.num_requests=0"]
WAITS = "workload.request_rate=0.01"


class MarkWaiting(Callback):
    """Test-only Hydra callback: the job writes READY into its dir when its workload first waits
    for a request's arrival, so the test signals it inside the timed pass, never by a clock."""

    def on_job_start(self, config, **kwargs) -> None:
        from hydra.core.hydra_config import HydraConfig

        import nanoexp.experiment.measure.driver as driver

        marker, sleep = Path(HydraConfig.get().runtime.output_dir) / READY, driver.sleep_until

        def marked_sleep(t: float) -> None:
            marker.touch()
            sleep(t)

        driver.sleep_until = marked_sleep


CALLBACK = "+hydra.callbacks.mark._target_=tests.e2e.test_job_signals.MarkWaiting"


def start(tmp_path: Path, *args: str) -> subprocess.Popen:
    env = job_env(tmp_path / "home")
    return subprocess.Popen(
        [sys.executable, "run.py", *args, CALLBACK, *TINY, *SLOW],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def wait_for(
    patterns: list[str], proc: subprocess.Popen, under: Path, timeout_s: float = 240.0
) -> list[Path]:
    """The job dirs (one per glob pattern under `under`) once each holds READY."""
    deadline = time.monotonic() + timeout_s
    while not all(list(under.glob(f"{p}/{READY}")) for p in patterns):
        if proc.poll() is not None or time.monotonic() > deadline:
            out, err = finish(proc)
            pytest.fail(f"the job never got to its workload (rc={proc.returncode}): {err[-3000:]}")
        time.sleep(0.1)
    return [next(under.glob(f"{p}/{READY}")).parent for p in patterns]


def finish(proc: subprocess.Popen, timeout_s: float = 120.0) -> tuple[str, str]:
    """Waits for the process; whatever is left of its session is killed, so no test leaks one."""
    try:
        return proc.communicate(timeout=timeout_s)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def processes_left(proc: subprocess.Popen) -> bool:
    """Whether any process of the job's session (its process group) is still alive."""
    try:
        os.killpg(proc.pid, 0)
    except ProcessLookupError:
        return False
    return True


def assert_terminated(job: Path, sig: signal.Signals) -> dict:
    results = json.loads((job / "results.json").read_text())
    assert results["status"] == "terminated" and results["exit_code"] == 128 + sig
    assert results["summary"]["signal"] == sig.name
    assert results["summary"]["error"] == f"interrupted by {sig.name}"
    assert (job / "error.txt").read_text().startswith(f"interrupted by {sig.name}")
    return results


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_a_signalled_job_records_itself_terminated(tmp_path: Path, sig: signal.Signals) -> None:
    job = tmp_path / "job"
    proc = start(tmp_path, f"hydra.run.dir={job}", "logger=wandb", WAITS)
    wait_for(["."], proc, job)
    proc.send_signal(sig)
    _, err = finish(proc)
    assert proc.returncode == 128 + sig, err[-3000:]
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.startswith("nanoexp: error:")]
    assert len(lines) == 1 and f"interrupted by {sig.name}" in lines[0]
    state = wandb_state(assert_terminated(job, sig))
    assert state["state"] == "failed" and state["exit_code"] == 128 + sig


def test_a_signalled_sweep_reports_the_jobs_that_finished(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    # job 0 runs its two requests at once; job 1 waits for its second request and is signalled
    proc = start(tmp_path, "-m", f"hydra.sweep.dir={sweep}", "logger=none", "workload.request_rate=inf,0.01")
    (job,) = wait_for(["1_*"], proc, sweep)
    proc.send_signal(signal.SIGTERM)
    _, err = finish(proc)
    assert proc.returncode == 143, err[-3000:]
    assert "Traceback" not in err
    assert_terminated(job, signal.SIGTERM)
    with (sweep / "sweep_summary.csv").open() as f:
        statuses = [r["status"] for r in csv.DictReader(f)]
    assert statuses == ["ok", "terminated"]


def test_the_jobs_of_a_signalled_local_sweep_stop_with_it(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    proc = start(
        tmp_path,
        "-m",
        f"hydra.sweep.dir={sweep}",
        "hydra/launcher=local",
        "logger=none",
        "workload.seed=0,1",
        WAITS,
    )
    jobs = wait_for(["0_*", "1_*"], proc, sweep)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    left = processes_left(proc)
    finish(proc)
    assert proc.returncode == 143, err[-3000:]
    assert not left, "a job outlived its sweep"
    for job in jobs:
        assert_terminated(job, signal.SIGTERM)
    assert (sweep / "sweep_summary.md").is_file()


def test_a_local_sweep_job_stops_when_its_sweep_is_killed(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    proc = start(
        tmp_path,
        "-m",
        f"hydra.sweep.dir={sweep}",
        "hydra/launcher=local",
        "logger=none",
        "workload.seed=0",
        WAITS,
    )
    (job,) = wait_for(["0_*"], proc, sweep)
    proc.kill()  # no handler runs: the job itself notices that its sweep is gone
    proc.communicate(timeout=60)
    try:
        deadline = time.monotonic() + 120
        while processes_left(proc) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not processes_left(proc), "a job outlived its killed sweep"
    finally:
        finish(proc)
    assert_terminated(job, signal.SIGTERM)
