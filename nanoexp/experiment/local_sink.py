"""The always-on local sink: results.json, requests.csv and steps.csv in the job's output dir."""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from nanoexp.experiment.job import JobInfo

RESULTS_FILE = "results.json"


class LocalSink:
    def __init__(self) -> None:
        self.config: dict = {}
        self.job: JobInfo | None = None
        self.steps: list[dict] = []

    def start(self, config: dict, job: JobInfo) -> None:
        self.config, self.job = config, job
        job.out_dir.mkdir(parents=True, exist_ok=True)

    def log_step(self, step: int, row: dict) -> None:
        self.steps.append(row)

    def log_requests(self, rows: list[dict]) -> None:
        write_csv(self.out_dir / "requests.csv", rows)

    def finish(self, summary: dict, exit_code: int = 0) -> None:
        write_csv(self.out_dir / "steps.csv", self.steps)
        results = {
            "status": status(exit_code, summary),
            "exit_code": exit_code,
            "finished_at": time.time(),
            "job": self.job.as_dict() if self.job else {},
            "config": self.config,
            "summary": summary,
        }
        write_atomically(self.out_dir / RESULTS_FILE, json.dumps(_json_safe(results), indent=2) + "\n")

    @property
    def out_dir(self) -> Path:
        assert self.job is not None, "LocalSink.start() was not called"
        return self.job.out_dir


def status(exit_code: int, summary: dict) -> str:
    """ok, failed, or terminated (stopped by the signal the summary names)."""
    if exit_code == 0:
        return "ok"
    return "terminated" if summary.get("signal") else "failed"


def write_atomically(path: Path, text: str, partial_suffix: str = ".partial") -> None:
    """A job killed while writing, or a write that fails (a full disk), leaves the old file or
    none, never half a file or an empty one."""
    with atomic_open(path, partial_suffix=partial_suffix) as f:
        f.write(text)


@contextlib.contextmanager
def atomic_open(path: Path, newline: str | None = None, partial_suffix: str = ".partial") -> Iterator[TextIO]:
    """A text file written under a temporary name (`path` + `partial_suffix`) and renamed into
    place once whole; on any error the temporary file is removed and the error raised."""
    partial = path.with_name(path.name + partial_suffix)
    try:
        with partial.open("w", newline=newline) as f:
            yield f
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(OSError):
            partial.unlink()
        raise


def write_csv(path: Path, rows: list[dict]) -> None:
    if not rows:
        return
    with atomic_open(path, newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _json_safe(value):
    """NaN becomes null and inf "inf", so results.json stays strict JSON."""
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value
