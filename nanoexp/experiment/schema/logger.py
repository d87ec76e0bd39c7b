"""The `logger` group: where a job's results go besides the local files (W&B, or nowhere else)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from nanoexp.config.checks import integer


class LoggerKind(Enum):
    wandb = "wandb"
    none = "none"


@dataclass
class LoggerConfig:
    kind: LoggerKind = LoggerKind.wandb
    project: str = "nanoexp"
    entity: str | None = None
    group: str | None = None  # default: the sweep directory's name in multirun, none otherwise
    name: str | None = None  # default: the job's overrides
    tags: list[str] = field(default_factory=list)
    log_every_n_steps: int = 1
    upload_results: bool = True  # results.json as a W&B artifact

    def __post_init__(self) -> None:
        integer("logger.log_every_n_steps", self.log_every_n_steps, 1)
