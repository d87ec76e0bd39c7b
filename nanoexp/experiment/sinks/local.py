"""The logger base, the fan-out of several loggers, and the local sink (results.json, CSVs, outputs)."""

from __future__ import annotations

import contextlib
import csv
import json
import math
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from nanoexp.experiment.measure.driver import RunRecord
from nanoexp.experiment.runtime.atomic_files import atomic_open, write_atomically
from nanoexp.experiment.runtime.job_info import JobInfo

RESULTS_FILE = "results.json"


class Logger:
    """The protocol every logger follows; this one logs nothing."""

    def start(self, config: dict, job: JobInfo) -> None: ...

    def log_step(self, step: int, row: dict) -> None: ...

    def log_requests(self, rows: list[dict]) -> None: ...

    def finish(self, summary: dict, exit_code: int = 0) -> None: ...


class FanoutLogger:
    """Starts loggers in order, finishes them in reverse; every call reaches every logger."""

    def __init__(self, loggers: Sequence[Logger]):
        self.loggers = list(loggers)
        self.started: list[Logger] = []

    def start(self, config: dict, job: JobInfo) -> None:
        def start(logger: Logger) -> None:
            logger.start(config, job)
            self.started.append(logger)

        try:
            _call_each(self.loggers, start)
        except Exception as err:
            with contextlib.suppress(Exception):  # the start's error is the one to raise
                self.finish({"error": first_line(err, limit=None)}, 1)
            raise

    def log_step(self, step: int, row: dict) -> None:
        _call_each(self.started, lambda lg: lg.log_step(step, row))

    def log_requests(self, rows: list[dict]) -> None:
        _call_each(self.started, lambda lg: lg.log_requests(rows))

    def finish(self, summary: dict, exit_code: int = 0) -> None:
        started, self.started = self.started, []
        _call_each(reversed(started), lambda lg: lg.finish(summary, exit_code))


def _call_each(loggers: Iterable[Logger], call: Callable[[Logger], None]) -> None:
    """Every logger gets its call; then the first error is raised."""
    errors = []
    for logger in loggers:
        try:
            call(logger)
        except Exception as err:  # noqa: BLE001 - raised below, after the others
            errors.append(err)
    if errors:
        raise errors[0]


def first_line(err: BaseException, limit: int | None = 160) -> str:
    """The error's first non-blank line (its type's name when it has none), cut to `limit`."""
    return next((ln.strip() for ln in str(err).splitlines() if ln.strip()), type(err).__name__)[:limit]


class LocalSink(Logger):
    def __init__(self) -> None:
        self.config: dict = {}  # set at start
        self.job: JobInfo | None = None
        self.steps: list[dict] = []  # as they come

    def start(self, config: dict, job: JobInfo) -> None:
        self.config, self.job = config, job
        job.out_dir.mkdir(parents=True, exist_ok=True)

    def log_step(self, step: int, row: dict) -> None:
        self.steps.append(row)

    def log_requests(self, rows: list[dict]) -> None:
        assert self.job is not None, "started first"
        write_csv(self.job.out_dir / "requests.csv", rows)

    def finish(self, summary: dict, exit_code: int = 0) -> None:
        assert self.job is not None, "started first"
        write_csv(self.job.out_dir / "steps.csv", self.steps)
        results = {
            "status": "ok" if exit_code == 0 else "terminated" if summary.get("signal") else "failed",
            "exit_code": exit_code,
            "finished_at": time.time(),
            "job": self.job.as_dict(),
            "config": self.config,
            "summary": summary,
        }
        write_atomically(self.job.out_dir / RESULTS_FILE, json.dumps(json_safe(results), indent=2) + "\n")


def read_results(path: Path) -> dict:
    """A results.json as written; {} when it is missing or unreadable."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def write_csv(path: Path, rows: list[dict]) -> None:
    if rows:
        with atomic_open(path, newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


def json_safe(value):
    """NaN becomes null and inf "inf", so results.json stays strict JSON."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else "inf" if value > 0 else "-inf"
    return value


def write_outputs(
    path: Path, records: list[RunRecord], tokenizer=None, workloads: list | None = None
) -> None:
    """outputs.jsonl: one object per request and repeat (with its text when there is a tokenizer); a request
    from a prompts file names its `source_file` and `source_line`, one that ended in error its `error`."""
    with atomic_open(path) as f:
        for record in records:
            requests = workloads[record.repeat].requests if workloads else []
            for o in record.outputs:
                row = {
                    "request_id": o.request_id,
                    "repeat": record.repeat,
                    "prompt_len": len(o.prompt_token_ids),
                    "output_token_ids": list(o.token_ids),
                    "finish_reason": o.finish_reason,
                }
                source = (
                    requests[o.request_id % len(requests)] if requests else None
                )  # latency: per iteration
                if source is not None and source.source_file:
                    row |= {"source_file": source.source_file, "source_line": source.source_line}
                if o.error:
                    row["error"] = o.error
                if tokenizer is not None:
                    row["text"] = tokenizer.decode(o.token_ids, skip_special_tokens=True)
                f.write(json.dumps(row) + "\n")
