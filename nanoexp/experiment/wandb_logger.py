"""Weights & Biases: one run per job, grouped per sweep; offline unless logged in.

W&B never blocks a job: `wandb.init` is bounded (INIT_TIMEOUT_S, or WANDB_INIT_TIMEOUT) and falls
back to an offline run with one warning line when the server cannot be reached; `run.finish` is
bounded too (FINISH_TIMEOUT_S, or WANDB_FINISH_TIMEOUT). W&B's cache, data, artifact staging and
temp files go under the job's output dir (`<out>/wandb/local/`) unless the user set their
WANDB_* variables; its config dir (the user's settings) is left alone. W&B's own telemetry is off
(WANDB_ERROR_REPORTING=false unless set): its exporter posts to the W&B server when the process
exits, and an unreachable server held the exit for tens of seconds.
"""

from __future__ import annotations

import netrc
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse

from nanoexp.experiment.job import JobInfo
from nanoexp.experiment.local_sink import RESULTS_FILE
from nanoexp.experiment.schema import LoggerConfig

REQUEST_TABLE = "requests"
INIT_TIMEOUT_S = 10.0  # wandb waits 90 s by default, then fails the job
FINISH_TIMEOUT_S = 300.0  # wandb's default waits for the upload forever
LOCAL_DIRS = {  # wandb's variable -> subdir of <out>/wandb/local
    "WANDB_CACHE_DIR": "cache",
    "WANDB_DATA_DIR": "data",
    "WANDB_ARTIFACT_DIR": "artifacts",
}


class WandbLogger:
    def __init__(self, cfg: LoggerConfig):
        self.cfg = cfg
        self.run = None
        self.job: JobInfo | None = None
        self.env_set: list[str] = []

    def start(self, config: dict, job: JobInfo) -> None:
        self.job = job
        job.out_dir.mkdir(parents=True, exist_ok=True)
        self.env_set = set_missing_env(job_env(job.out_dir))
        try:
            self.run, fallback = self._init(config, job, choose_mode())
        except BaseException:
            restore_env(self.env_set)
            raise
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")
        run_dir = str(Path(self.run.dir).parent)
        job.extra["wandb"] = {"id": self.run.id, "dir": run_dir, "mode": self.run.settings.mode}
        if fallback:
            print(f"wandb: warning: no online run ({fallback}); logging offline instead, "
                  f"upload later with `wandb sync {run_dir}`", file=sys.stderr)
        elif self.run.settings.mode == "offline":
            print(f"wandb: offline run; upload it with `wandb sync {run_dir}`", file=sys.stderr)

    def _init(self, config: dict, job: JobInfo, mode: str | None):
        """(run, why the online run failed or None); an online failure falls back to offline."""
        import wandb

        try:
            return self._init_mode(config, job, mode), None
        except wandb.Error as err:
            if mode == "offline":
                raise
            reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:160]
            return self._init_mode(config, job, "offline"), reason

    def _init_mode(self, config: dict, job: JobInfo, mode: str | None):
        import wandb

        with temp_dir_for_service(job.out_dir / "wandb" / "local" / "tmp"):
            return wandb.init(
                project=self.cfg.project,
                entity=self.cfg.entity,
                group=job.group,
                name=job.name,
                tags=list(self.cfg.tags) or None,
                config=config,
                dir=str(job.out_dir),
                mode=mode,
                job_type="benchmark",
                settings=wandb.Settings(console="off", silent=True, **bounded_timeouts()),
            )

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
            try:
                self.run.finish(exit_code=exit_code)
            finally:
                self.run = None
                restore_env(self.env_set)

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


def bounded_timeouts() -> dict:
    """init/finish timeouts, unless the user set wandb's own variables for them."""
    out = {}
    if "WANDB_INIT_TIMEOUT" not in os.environ:
        out["init_timeout"] = INIT_TIMEOUT_S
    if "WANDB_FINISH_TIMEOUT" not in os.environ:
        out["finish_timeout"] = FINISH_TIMEOUT_S
    return out


def job_env(out_dir: Path) -> dict[str, str]:
    """wandb's variables for this job: its local dirs under `out_dir`, its telemetry off, quiet."""
    dirs = {var: str(out_dir / "wandb" / "local" / sub) for var, sub in LOCAL_DIRS.items()}
    return dirs | {"WANDB_ERROR_REPORTING": "false", "WANDB_SILENT": "true"}


def set_missing_env(values: dict[str, str]) -> list[str]:
    """Sets the variables the user has not set; returns their names for `restore_env`."""
    missing = [k for k in values if k not in os.environ]
    os.environ.update({k: values[k] for k in missing})
    return missing


def restore_env(names: list[str]) -> None:
    for name in names:
        os.environ.pop(name, None)


@contextmanager
def temp_dir_for_service(path: Path):
    """TMPDIR for wandb's service process (its sockets), started by the first `wandb.init` of a
    process; only while init runs, so nothing else in the job sees it."""
    path.mkdir(parents=True, exist_ok=True)
    previous = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(path)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = previous


def _scalars(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if isinstance(v, int | float | str | bool)}
