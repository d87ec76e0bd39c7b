"""Weights & Biases: one run per job, grouped per sweep, offline unless logged in; it never blocks a job
(bounded init and finish, offline when the server is unreachable) and keeps its files in the job dir."""

from __future__ import annotations

import atexit
import netrc
import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse

from nanoexp.experiment.job import JobInfo
from nanoexp.experiment.loggers import RESULTS_FILE, first_line
from nanoexp.experiment.profiling import PROFILE_DIR
from nanoexp.experiment.schema import LoggerConfig

MAX_SOCKET_DIR = 60  # characters; a Unix socket's path has room for about 107
# the process tree's system metrics every second: W&B's default of 15 s leaves a short job none
SYSTEM_METRICS = {"x_stats_sampling_interval": 1.0, "x_stats_track_process_tree": True}
INIT_TIMEOUT_S = 10.0  # wandb waits 90 s by default, then fails the job
FINISH_TIMEOUT_S = 300.0  # wandb's default waits for the upload forever
TIMEOUTS = {"init_timeout": ("WANDB_INIT_TIMEOUT", INIT_TIMEOUT_S)}  # setting -> wandb's variable, ours
TIMEOUTS["finish_timeout"] = ("WANDB_FINISH_TIMEOUT", FINISH_TIMEOUT_S)
# wandb's variable -> subdir of <out>/wandb/local
LOCAL_DIRS = {"WANDB_CACHE_DIR": "cache", "WANDB_DATA_DIR": "data", "WANDB_ARTIFACT_DIR": "artifacts"}
STEP_PREFIX = "step/"
STEP_AXIS = STEP_PREFIX + "index"
STEP_SUMMARIES = {"step_time_ms": "min,max,mean", "num_waiting": "max"}  # in the run's summary
STEP_SUMMARIES |= dict.fromkeys(("tokens_per_s", "kv_cache_usage", "num_seqs"), "max,mean")


class WandbLogger:
    """One W&B run per job: totals in the summary, per-step series under `step/` against `step/index`."""

    def __init__(self, cfg: LoggerConfig):
        self.cfg, self.run, self.job, self.env_set = cfg, None, None, []  # set at start

    def start(self, config: dict, job: JobInfo) -> None:
        self.job = job
        self.run, self.env_set = start_run(self.cfg, job.out_dir, config, job.group, job.name, "benchmark")
        self.run.define_metric(STEP_AXIS)
        self.run.define_metric(STEP_PREFIX + "*", step_metric=STEP_AXIS)
        for key, ops in STEP_SUMMARIES.items():
            self.run.define_metric(STEP_PREFIX + key, step_metric=STEP_AXIS, summary=ops)
        job.extra["wandb"] = {"id": self.run.id, "dir": run_dir(self.run), "mode": self.run.settings.mode}

    def log_step(self, step: int, row: dict) -> None:
        if step % self.cfg.log_every_n_steps == 0:
            self.run.log({STEP_AXIS: step} | {STEP_PREFIX + k: v for k, v in row.items() if k != "step"})

    def log_requests(self, rows: list[dict]) -> None:
        import wandb

        if rows:  # every row has the same keys, in the same order
            table = wandb.Table(columns=list(rows[0]), data=[list(row.values()) for row in rows])
            self.run.log({"requests": table})

    def finish(self, summary: dict, exit_code: int = 0) -> None:
        try:
            logged = lambda k, v: isinstance(v, int | float | str | bool) or k == "per_repeat"
            self.run.summary.update({k: v for k, v in summary.items() if logged(k, v)})
            self._upload_results()
        finally:
            finish_run(self.run, self.env_set, exit_code)

    def _upload_results(self) -> None:
        """results.json and the profile.trace_steps Chrome traces as artifacts."""
        import wandb

        results = [self.job.out_dir / RESULTS_FILE] if self.cfg.upload_results else []
        traces = sorted((self.job.out_dir / PROFILE_DIR).glob("*.json"))
        for kind, files in (("results", [p for p in results if p.is_file()]), ("profile", traces)):
            if files:
                artifact = wandb.Artifact(f"{kind}-{self.run.id}", type=kind)
                for path in files:
                    artifact.add_file(str(path))
                self.run.log_artifact(artifact)


def start_run(cfg: LoggerConfig, out_dir: Path, config: dict, group: str | None, name: str, job_type: str):
    """A W&B run under `out_dir`, offline when online fails; returns it and the env variables it set."""
    out_dir.mkdir(parents=True, exist_ok=True)
    # wandb's local dirs under `out_dir`, its telemetry off, quiet: where the user has not set them
    env = {var: str(out_dir / "wandb" / "local" / sub) for var, sub in LOCAL_DIRS.items()}
    env |= {"WANDB_ERROR_REPORTING": "false", "WANDB_SILENT": "true"}
    env_set = [k for k in env if k not in os.environ]
    os.environ.update({k: env[k] for k in env_set})
    try:
        run, fallback = _init(cfg, out_dir, dict(config=config, group=group, name=name, job_type=job_type))
    except BaseException:
        for var in env_set:
            os.environ.pop(var, None)
        raise
    where = run_dir(run)
    if fallback:  # the offline run's settings hold the timeout the online one had
        print(
            f"wandb: warning: no online run within {run.settings.init_timeout:g} s ({fallback}); logging "
            f"offline instead, upload later with `wandb sync {where}`",
            file=sys.stderr,
        )
    elif run.settings.mode == "offline":
        print(f"wandb: offline run; upload it with `wandb sync {where}`", file=sys.stderr)
    return run, env_set


def run_dir(run) -> str:
    """The run's own dir (`<out>/wandb/offline-run-...` or `run-...`)."""
    return str(Path(run.dir).parent)


def _init(cfg: LoggerConfig, out_dir: Path, fields: dict):
    """(run, why the online run failed or None); an online failure falls back to offline."""
    import wandb

    def init(mode: str | None):
        timeouts = {k: v for k, (var, v) in TIMEOUTS.items() if var not in os.environ}  # else the user's
        settings = wandb.Settings(console="off", silent=True, **timeouts, **SYSTEM_METRICS)
        tags = list(cfg.tags) or None
        return wandb.init(
            project=cfg.project,
            entity=cfg.entity,
            tags=tags,
            dir=str(out_dir),
            mode=mode,
            settings=settings,
            **fields,
        )

    mode = choose_mode()
    with temp_dir_for_service(out_dir / "wandb" / "local" / "tmp"):
        try:
            return init(mode), None
        except wandb.Error as err:
            if mode == "offline":
                raise
            return init("offline"), first_line(err)


def choose_mode() -> str | None:
    """None when WANDB_MODE is set (wandb honours it), online with an API key, else offline."""
    if os.environ.get("WANDB_MODE"):
        return None
    os.environ.pop("WANDB_MODE", None)  # an empty value would fail wandb's settings validation
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        return "online" if netrc.netrc(os.environ.get("NETRC")).authenticators(host or "") else "offline"
    except (FileNotFoundError, netrc.NetrcParseError):
        return "offline"


def finish_run(run, env_set: list[str], exit_code: int = 0) -> None:
    """Finishes a run from `start_run` and unsets the variables set for it, however the finish ends."""
    try:
        run.finish(exit_code=exit_code)
    finally:
        for var in env_set:
            os.environ.pop(var, None)


@contextmanager
def temp_dir_for_service(path: Path):
    """TMPDIR for wandb's service (its sockets) while init runs: short enough for a Unix socket path."""
    previous = os.environ.get("TMPDIR")
    if len(str(path)) > MAX_SOCKET_DIR:
        path = Path(tempfile.mkdtemp(prefix="nanoexp-wandb-", dir=previous))
        atexit.register(shutil.rmtree, path, ignore_errors=True)  # registered before wandb.s: runs after
    path.mkdir(parents=True, exist_ok=True)
    os.environ["TMPDIR"] = str(path)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = previous
