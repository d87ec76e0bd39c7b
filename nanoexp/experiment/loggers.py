"""The logger protocol, the no-op logger, and a fan-out that drives several loggers as one."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from nanoexp.experiment.job import JobInfo


class Logger(Protocol):
    def start(self, config: dict, job: JobInfo) -> None: ...

    def log_step(self, step: int, row: dict) -> None: ...

    def log_requests(self, rows: list[dict]) -> None: ...

    def finish(self, summary: dict, exit_code: int = 0) -> None: ...


class NoneLogger:
    """Logs nothing (the local sink still writes results)."""

    def start(self, config: dict, job: JobInfo) -> None:
        pass

    def log_step(self, step: int, row: dict) -> None:
        pass

    def log_requests(self, rows: list[dict]) -> None:
        pass

    def finish(self, summary: dict, exit_code: int = 0) -> None:
        pass


class FanoutLogger:
    """Starts loggers in order and finishes them in reverse, so the first one finishes last.

    Put W&B first and the local sink second: the sink then records the W&B run it started,
    and W&B uploads the results file the sink has written. One logger's error never skips
    another: each call reaches every logger and the first error is raised after all of them ran.
    A failed start finishes the loggers that did start (exit code 1), so none is left open.
    """

    def __init__(self, loggers: Sequence[Logger]):
        self.loggers = list(loggers)
        self.started: list[Logger] = []

    def start(self, config: dict, job: JobInfo) -> None:
        errors = []
        for logger in self.loggers:
            try:
                logger.start(config, job)
                self.started.append(logger)
            except Exception as err:  # noqa: BLE001 - raised below, after the others started
                errors.append(err)
        if errors:
            first_line = (str(errors[0]).strip().splitlines() or [type(errors[0]).__name__])[0]
            _call_each(reversed(self.started), lambda lg: lg.finish({"error": first_line}, 1))
            self.started.clear()
            raise errors[0]

    def log_step(self, step: int, row: dict) -> None:
        _raise_first(_call_each(self.started, lambda lg: lg.log_step(step, row)))

    def log_requests(self, rows: list[dict]) -> None:
        _raise_first(_call_each(self.started, lambda lg: lg.log_requests(rows)))

    def finish(self, summary: dict, exit_code: int = 0) -> None:
        started, self.started = self.started, []
        _raise_first(_call_each(reversed(started), lambda lg: lg.finish(summary, exit_code)))


def _call_each(loggers: Iterable[Logger], call: Callable[[Logger], None]) -> list[Exception]:
    errors = []
    for logger in loggers:
        try:
            call(logger)
        except Exception as err:  # noqa: BLE001 - every logger gets its call; the caller raises
            errors.append(err)
    return errors


def _raise_first(errors: list[Exception]) -> None:
    if errors:
        raise errors[0]
