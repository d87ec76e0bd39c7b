"""What Hydra knows about the running job: output dir, overrides, sweep, a run name and group."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from nanoexp.experiment.schema import LoggerConfig, job_number


@dataclass
class JobInfo:
    out_dir: Path
    overrides: list[str]
    name: str
    group: str | None
    job_num: int = 0
    multirun: bool = False
    sweep_dir: str | None = None
    extra: dict = field(default_factory=dict)  # filled by loggers (e.g. the W&B run's id and dir)

    def as_dict(self) -> dict:
        fields = {k: v for k, v in vars(self).items() if k != "extra"}
        return fields | {"out_dir": str(self.out_dir), **self.extra}


def current_job(logger_cfg: LoggerConfig | DictConfig) -> JobInfo:
    """The job as Hydra sees it; outside Hydra (e.g. a notebook) a fresh dir under outputs/."""
    if not HydraConfig.initialized():
        out = Path("outputs") / "manual" / time.strftime("%Y-%m-%d_%H-%M-%S")
        return JobInfo(out, [], logger_cfg.name or "manual", logger_cfg.group)
    hc = HydraConfig.get()
    overrides = list(cast(list, OmegaConf.to_container(hc.overrides.task, resolve=False)))  # may hold ${...}
    multirun = hc.mode == RunMode.MULTIRUN
    sweep_dir = str(Path(hc.sweep.dir)) if multirun else None
    name = logger_cfg.name or run_name(overrides, swept_keys(sweep_dir))
    group = logger_cfg.group or (sweep_group(sweep_dir) if sweep_dir is not None else None)
    job_num = job_number(cast(DictConfig, hc.job).get("num", 0) or 0) if multirun else 0
    return JobInfo(Path(hc.runtime.output_dir), overrides, name, group, job_num, multirun, sweep_dir)


def run_name(overrides: list[str], swept: set[str] | None = None) -> str:
    """The overrides (`default` for none); in a sweep, the swept values under short keys (`block_size=16`)."""
    kept = [o for o in overrides if not o.startswith(("hydra", "logger."))]
    if not swept:
        return ",".join(kept) or "default"
    split = [o.lstrip("+~").split("=", 1) for o in kept if "=" in o]
    pairs = [(k, v) for k, v in split if k in swept]
    last = [k.rsplit(".", 1)[-1] for k, _ in pairs]
    names = [short if last.count(short) == 1 else k for short, (k, _) in zip(last, pairs)]
    return " ".join(f"{n}={v}" for n, (_, v) in zip(names, pairs)) or "default"


def swept_keys(sweep_dir: str | None) -> set[str] | None:
    """The keys a multirun sweeps, from the `multirun.yaml` it saves first; None when unknown."""
    if not sweep_dir:
        return None
    try:
        parsed = sweep_overrides(cast(DictConfig, OmegaConf.load(Path(sweep_dir) / "multirun.yaml")))
    except Exception:  # noqa: BLE001 - not saved (yet) or unreadable: a name is never worth failing a job over
        return None
    return {o.key_or_group for o in parsed if o.is_sweep_override()}


def sweep_overrides(config: DictConfig) -> list:
    """A multirun's parsed overrides: `hydra.sweeper.params` and the command line's."""
    params = [f"{k}={v}" for k, v in (config.hydra.sweeper.get("params") or {}).items()]
    return OverridesParser.create().parse_overrides(params + list(config.hydra.overrides.task))


def sweep_group(sweep_dir: str) -> str:
    """`<date>_<time>` from multirun/<date>/<time>: one W&B group per sweep."""
    path = Path(sweep_dir)
    return f"{path.parent.name}_{path.name}" if path.parent.name else path.name
