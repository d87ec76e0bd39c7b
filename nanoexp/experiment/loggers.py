"""The logger protocol, the no-op logger, and a fan-out that drives several loggers as one."""

from __future__ import annotations

from collections.abc import Sequence
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
    and W&B uploads the results file the sink has written.
    """

    def __init__(self, loggers: Sequence[Logger]):
        self.loggers = list(loggers)
        self.started: list[Logger] = []

    def start(self, config: dict, job: JobInfo) -> None:
        for logger in self.loggers:
            logger.start(config, job)
            self.started.append(logger)

    def log_step(self, step: int, row: dict) -> None:
        for logger in self.started:
            logger.log_step(step, row)

    def log_requests(self, rows: list[dict]) -> None:
        for logger in self.started:
            logger.log_requests(rows)

    def finish(self, summary: dict, exit_code: int = 0) -> None:
        for logger in reversed(self.started):
            logger.finish(summary, exit_code)
        self.started.clear()
