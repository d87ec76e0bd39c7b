"""A job's failures, handled in one place: whatever ends a job early, it ends with one line (stderr and
run.log; exit 2 for config errors, 128 + n for a signal, else 1), error.txt, its loggers finished with the
failure, and a results.json whose status and exit code agree with the process's. In a sweep the job's
code is returned, so the next job runs."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from nanoexp.config import KnobError
from nanoexp.experiment.job.build import build_logger
from nanoexp.experiment.job.engine_logs import phrase_engine_logs
from nanoexp.experiment.job.run_log import append_run_log
from nanoexp.experiment.runtime import interrupts
from nanoexp.experiment.runtime.atomic_files import write_atomically
from nanoexp.experiment.runtime.job_info import JobInfo, current_job
from nanoexp.experiment.schema import ConfigError, LoggerConfig, LoggerKind, to_plain
from nanoexp.experiment.schema.keys import in_hydra_keys
from nanoexp.experiment.sinks.local import RESULTS_FILE, FanoutLogger, first_line, read_results

CONFIG_EXIT, RUNTIME_EXIT = 2, 1
FULL_ERROR = "HYDRA_FULL_ERROR"
CLI_FULL_ERROR = "NANOEXP_CLI_SET_HYDRA_FULL_ERROR"  # marks FULL_ERROR as set by `cli`, not the user
SUBMITIT_EXECUTOR = "SUBMITIT_EXECUTOR"  # set in the jobs submitit starts (local or slurm)
CONFIG_ERRORS = (ConfigError, KnobError, OmegaConfBaseException)  # KnobError: a value the engine rejects


@dataclass
class JobState:
    """How far the job got: what its failure is recorded with."""

    cfg: DictConfig
    job: JobInfo | None = None  # known once Hydra's job is read
    logger: FanoutLogger | None = None  # set once the loggers started
    facts: dict = field(default_factory=dict)  # kept in a failed job's summary (e.g. the load format chosen)
    summarized: bool = False  # the loggers got the job's summary: a later failure only rewrites results.json

    def finish_loggers(self, summary: dict) -> None:
        """Finishes the started loggers with the job's summary (exit code 0)."""
        assert self.logger is not None, "the job's loggers are started before they finish"
        self.summarized = True
        self.logger.finish(summary, 0)


def handled(job_body: Callable[[DictConfig, JobInfo, JobState], None]) -> Callable[[DictConfig], int]:
    """`main(cfg)` from the job's body: returns 0, or records the failure and exits non-zero with one line
    (in a sweep, returns the code; a signal in a sweep's own process stops the sweep too)."""

    @functools.wraps(job_body)
    def main(cfg: DictConfig) -> int:
        state, code = JobState(cfg), 0
        interrupts.install()
        phrase_engine_logs()
        if os.environ.get(SUBMITIT_EXECUTOR) == "local":
            interrupts.die_with_sweep()
        try:
            # the job before its typed config, so a sweep lists its config errors
            state.job = job = current_job(cfg.logger)
            job_body(cfg, job, state)
        except Exception as e:  # noqa: BLE001 - every failure becomes one line and an exit code
            fail_loggers(state, e)
            code = report_error(e, state.job)
        except KeyboardInterrupt as e:  # recorded as failed; in a sweep's own process it stops the sweep too
            fail_loggers(state, e)
            interrupt = interrupts.as_interrupted(e)
            code = report_error(interrupt, state.job)
            if state.job is not None and state.job.multirun and SUBMITIT_EXECUTOR not in os.environ:
                interrupt.reported = True
                raise interrupt from None
        if code and not (state.job and state.job.multirun):
            sys.exit(code)
        return code

    return main


def fail_loggers(state: JobState, error: BaseException) -> None:
    """Finishes the loggers with the failure; a job that failed before they started starts them first, so
    it too leaves results (with only the local sink when the logger section is what is invalid)."""
    if state.job is None or state.summarized:
        return
    try:
        logger = state.logger or start_loggers(state.cfg, state.job)
        logger.finish(state.facts | failure_summary(error), exit_code(error))
    except Exception as err:  # noqa: BLE001 - the job's own error is the one to raise
        note = f"recording the failure failed too: {one_line(err)}"
        if sys.version_info >= (3, 11):
            error.add_note(note)
        else:  # what add_note does
            setattr(error, "__notes__", [*getattr(error, "__notes__", []), note])  # noqa: B010 - 3.10's mypy


def start_loggers(cfg: DictConfig, job: JobInfo) -> FanoutLogger:
    """The job's loggers, started with its config as far as it resolves (the local sink alone when the logger
    section is what is invalid)."""
    try:
        logger_cfg = cast(LoggerConfig, OmegaConf.to_object(cfg.logger))
    except Exception:  # noqa: BLE001 - the logger section is what is invalid: the local sink alone
        logger_cfg = LoggerConfig(kind=LoggerKind.none)
    logger = build_logger(logger_cfg)
    try:
        plain = to_plain(cfg)
    except Exception:  # noqa: BLE001 - resolving it is what failed: log it unresolved
        plain = cast(dict, OmegaConf.to_container(cfg, resolve=False, enum_to_str=True))
    logger.start(plain, job)
    return logger


def report_error(e: BaseException, job: JobInfo | None) -> int:
    """The one line (stderr and run.log), error.txt and results.json; never raises."""
    notes = [(n.strip().splitlines() or [""])[0] for n in getattr(e, "__notes__", [])]  # e.g. a logger's
    code, line = exit_code(e), "; ".join([one_line(e), *filter(None, notes)])
    if user_wants_full_error():
        traceback.print_exc()
    where = ""
    if job is not None:
        with contextlib.suppress(OSError):
            job.out_dir.mkdir(parents=True, exist_ok=True)
            write_atomically(job.out_dir / "error.txt", f"{line}\n\n{traceback.format_exc()}")
            where = f" (traceback: {job.out_dir / 'error.txt'})" if code == RUNTIME_EXIT else ""
            append_run_log(job, f"nanoexp: error: {line}")
        record_failure(job, code, failure_summary(e, line))
    print(f"nanoexp: error: {line}{where}", file=sys.stderr)
    return code


def record_failure(job: JobInfo, code: int, failure: dict) -> None:
    """A results.json whose status and exit code agree with the process's (the loggers' kept, if any)."""
    path, status = job.out_dir / RESULTS_FILE, "terminated" if "signal" in failure else "failed"
    written = read_results(path)  # {} when missing or unreadable
    if written.get("exit_code") == code:
        return
    summary = written.get("summary", {}) | failure
    results = written | {"status": status, "exit_code": code, "job": job.as_dict(), "summary": summary}
    with contextlib.suppress(OSError):  # else the error line on stderr is all that is left to report
        # its own temporary name: the loggers' may be what could not be written
        write_atomically(path, json.dumps(results, indent=2) + "\n", ".failure.partial")


def failure_summary(error: BaseException, line: str | None = None) -> dict:
    """A failed job's summary: its error line and, for a job stopped by a signal, the signal's name."""
    signal = (
        {"signal": interrupts.as_interrupted(error).signal_name}
        if isinstance(error, KeyboardInterrupt)
        else {}
    )
    return {"error": one_line(error) if line is None else line, **signal}


def exit_code(e: BaseException) -> int:
    if isinstance(e, KeyboardInterrupt):
        return interrupts.as_interrupted(e).exit_code
    return CONFIG_EXIT if isinstance(e, CONFIG_ERRORS) else RUNTIME_EXIT


def one_line(e: BaseException) -> str:
    """The error's first line, naming knobs by the keys run.py's users type (the engine's messages name
    its keywords); OmegaConf's errors name their key on a later line, so it leads."""
    line = in_hydra_keys(first_line(e, limit=None))
    key = getattr(e, "full_key", None) if isinstance(e, CONFIG_ERRORS) else None
    return f"{key}: {line}" if key and key not in line else line


def user_wants_full_error() -> bool:
    return os.environ.get(FULL_ERROR) == "1" and os.environ.get(CLI_FULL_ERROR) != "1"
