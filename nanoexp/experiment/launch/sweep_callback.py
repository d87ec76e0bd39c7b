"""The sweep's Hydra callback: locks the sweep dir and reports every job of a multirun when it ends, even
after an abort. Hydra builds it in every job too, so the report (pandas, plots) is imported only then."""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import re
import signal
import sys
import time
from functools import partial
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from nanoexp.experiment.runtime import interrupts
from nanoexp.experiment.runtime.atomic_files import unwritable
from nanoexp.experiment.schema import JOB_NUM_OFFSET
from nanoexp.experiment.sinks.local import RESULTS_FILE

JOB_DIR = re.compile(r"^(\d+)(_|$)")  # a job dir's name: its number, then its overrides

STOP_GRACE_S = 30.0  # a signalled sweep's jobs get this long to record themselves


class SweepReport(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        from nanoexp.experiment.report import sweep_report

        self.sweep_dir = Path(config.hydra.sweep.dir)
        self.lock = lock_sweep_dir(self.sweep_dir, bool(config.get("append_to_sweep", False)))
        offset = next_job_number(self.sweep_dir)  # 0 for a new sweep dir
        os.environ[JOB_NUM_OFFSET] = str(offset)  # read as the jobs resolve their dirs (schema.job_number)
        metrics = list(config.report.metrics) if config.get("report") is not None else []
        expected, wandb = sweep_report.expected_jobs(config), sweep_report.wandb_target(config)
        # the earlier jobs' overrides are unknown here: the report lists their dirs as they are
        expected = None if expected is None else [[] for _ in range(offset)] + expected
        self.report = partial(sweep_report.report, self.sweep_dir, expected, wandb, metrics)
        wait_s = 60.0 * float(config.hydra.launcher.get("timeout_min", 0) or 0) + 60.0
        atexit.register(self._report_after_abort, wait_s)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        atexit.unregister(self._report_after_abort)
        if self._report():
            sys.exit(1)

    def _report(self) -> int:
        """The report; jobs failed or vanished. A report that cannot be written (a full disk) is one error
        line and exit 1 here: Hydra would turn the callback's exception into a warning and exit 0."""
        try:
            return self.report()
        except Exception as err:  # noqa: BLE001 - every failure of the report is the sweep's error
            reason = unwritable(err.filename or self.sweep_dir, err) if isinstance(err, OSError) else err
            print(f"nanoexp: error: the sweep report in {self.sweep_dir} failed: {reason}", file=sys.stderr)
            sys.exit(1)

    def _report_after_abort(self, wait_s: float) -> None:
        """The launcher raised, so on_multirun_end never ran: report what the jobs left."""
        if interrupts.received:  # the sweep was signalled: its jobs stop too
            stop_local_jobs(self.sweep_dir, STOP_GRACE_S)
        else:
            wait_for_local_jobs(self.sweep_dir, wait_s)
        with contextlib.suppress(SystemExit):  # exiting already, with the launcher's error
            self._report()


def next_job_number(sweep_dir: Path) -> int:
    """One past the highest job number in the sweep dir (its `<n>_...` or `<n>` dirs); 0 when empty."""
    nums = [int(m.group(1)) for p in sweep_dir.iterdir() if p.is_dir() and (m := JOB_DIR.match(p.name))]
    return max(nums, default=-1) + 1


def lock_sweep_dir(sweep_dir: Path, append: bool = False):
    """Holds a lock file in the sweep dir while the sweep lives; a second sweep into it, or one into a dir
    with earlier results (unless `append`), exits 2 with one line (a callback's raise only warns)."""
    try:
        sweep_dir.mkdir(parents=True, exist_ok=True)
        lock = (sweep_dir / ".sweep.lock").open("a+")
    except OSError as err:  # the same line and exit code as a single job's unwritable dir
        _refuse(unwritable(err.filename or sweep_dir, err, "hydra.sweep.dir"), code=1)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "another process"
        _refuse(
            f"hydra.sweep.dir={sweep_dir}: another sweep ({holder}) is writing there; "
            "wait for it or choose another hydra.sweep.dir"
        )
    earlier = None if append else next(sweep_dir.rglob(RESULTS_FILE), None)
    if earlier is not None:
        _refuse(
            f"hydra.sweep.dir={sweep_dir} already holds an earlier sweep's results "
            f"({earlier.relative_to(sweep_dir)}); choose another hydra.sweep.dir, or add this "
            "sweep's jobs to it with append_to_sweep=true"
        )
    lock.truncate(0)  # its writes go to the end, now its start
    lock.write(f"pid {os.getpid()}\n")
    lock.flush()
    return lock


def _refuse(line: str, code: int = 2) -> None:
    print(f"nanoexp: error: {line}", file=sys.stderr, flush=True)
    sys.exit(code)


def wait_for_local_jobs(sweep_dir: Path, wait_s: float) -> list[int]:
    """Waits at most `wait_s` for this process's submitit jobs, then terminates them; returns those."""
    deadline = time.monotonic() + wait_s
    pids = [int(p.name) for p in (sweep_dir / ".submitit").glob("*") if p.name.isdigit()]
    while (pids := [pid for pid in pids if _running_child(pid)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
    return pids


def stop_local_jobs(sweep_dir: Path, grace_s: float) -> None:
    """SIGTERM to this process's submitit jobs, then after `grace_s` SIGKILL to what is left of them."""
    wait_for_local_jobs(sweep_dir, 0.0)  # SIGTERM to the running ones now
    for pid in wait_for_local_jobs(sweep_dir, grace_s):
        for member in interrupts.process_tree(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(member, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def _running_child(pid: int) -> bool:
    try:
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:  # not our child, or already reaped
        return False
