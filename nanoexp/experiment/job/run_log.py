"""The job's run.log, which Hydra's job logging writes too: the summary table or the error line go there."""

from __future__ import annotations

from nanoexp.experiment.runtime.job_info import JobInfo


def append_run_log(job: JobInfo, text: str) -> None:
    """Appends to `<out>/run.log`, which Hydra's job logging writes too (run.py's job is named `run`)."""
    with (job.out_dir / "run.log").open("a") as f:
        f.write(text.rstrip("\n") + "\n")
