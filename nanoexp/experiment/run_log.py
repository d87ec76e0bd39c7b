"""run.log, the job's log file (Hydra's job logging writes it): the summary table and the error
line are appended to it, so the log alone tells what a job did."""

from __future__ import annotations

import logging
from pathlib import Path

from nanoexp.experiment.job import JobInfo


def run_log_path(job: JobInfo) -> Path:
    """The file Hydra's job logging writes (`<job name>.log`), else `<out>/run.log`."""
    for handler in logging.getLogger().handlers:
        if (
            isinstance(handler, logging.FileHandler)
            and Path(handler.baseFilename).parent == job.out_dir.resolve()
        ):
            return Path(handler.baseFilename)
    return job.out_dir / "run.log"


def append_run_log(job: JobInfo, text: str) -> None:
    job.out_dir.mkdir(parents=True, exist_ok=True)
    with run_log_path(job).open("a") as f:
        f.write(text.rstrip("\n") + "\n")
