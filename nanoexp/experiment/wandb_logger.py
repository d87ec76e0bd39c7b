"""Weights & Biases: one run per job, grouped per sweep; offline unless logged in."""

from __future__ import annotations

import netrc
import os
import sys
from pathlib import Path
from urllib.parse import urlparse

from nanoexp.experiment.job import JobInfo
from nanoexp.experiment.local_sink import RESULTS_FILE
from nanoexp.experiment.schema import LoggerConfig

REQUEST_TABLE = "requests"


class WandbLogger:
    def __init__(self, cfg: LoggerConfig):
        self.cfg = cfg
        self.run = None
        self.job: JobInfo | None = None

    def start(self, config: dict, job: JobInfo) -> None:
        import wandb

        self.job = job
        mode = choose_mode()
        job.out_dir.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=self.cfg.project,
            entity=self.cfg.entity,
            group=job.group,
            name=job.name,
            tags=list(self.cfg.tags) or None,
            config=config,
            dir=str(job.out_dir),
            mode=mode,
            job_type="benchmark",
            settings=wandb.Settings(console="off", silent=True),
        )
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")
        run_dir = str(Path(self.run.dir).parent)
        job.extra["wandb"] = {"id": self.run.id, "dir": run_dir, "mode": self.run.settings.mode}
        if self.run.settings.mode == "offline":
            print(f"wandb: offline run; upload it with `wandb sync {run_dir}`", file=sys.stderr)

    def log_step(self, step: int, row: dict) -> None:
        if step % self.cfg.log_every_n_steps == 0:
            self.run.log(row)

    def log_requests(self, rows: list[dict]) -> None:
        import wandb

        if rows:
            columns = list(rows[0])
            table = wandb.Table(columns=columns, data=[[r[c] for c in columns] for r in rows])
            self.run.log({REQUEST_TABLE: table})

    def finish(self, summary: dict, exit_code: int = 0) -> None:
        if self.run is None:
            return
        try:
            self.run.summary.update(_scalars(summary))
            self._upload_results()
        finally:
            self.run.finish(exit_code=exit_code)
            self.run = None

    def _upload_results(self) -> None:
        import wandb

        path = self.job.out_dir / RESULTS_FILE if self.job else None
        if self.cfg.upload_results and path is not None and path.is_file():
            artifact = wandb.Artifact(f"results-{self.run.id}", type="results")
            artifact.add_file(str(path))
            self.run.log_artifact(artifact)


def choose_mode() -> str | None:
    """None when WANDB_MODE is set (wandb honours it), online with an API key, else offline."""
    if os.environ.get("WANDB_MODE"):
        return None
    os.environ.pop("WANDB_MODE", None)  # an empty value would fail wandb's settings validation
    return "online" if has_api_key() else "offline"


def has_api_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        return netrc.netrc(os.environ.get("NETRC")).authenticators(host or "") is not None
    except (FileNotFoundError, netrc.NetrcParseError):
        return False


def _scalars(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if isinstance(v, int | float | str | bool)}
