"""The `launch` section: how a local sweep's jobs share the machine's GPUs."""

from __future__ import annotations

from dataclasses import dataclass

from nanoexp.config.checks import integer


@dataclass
class LaunchConfig:
    # >0: each job of a local sweep takes its own slice of the visible GPUs, picked by job number
    gpus_per_job: int = 0

    def __post_init__(self) -> None:
        integer("launch.gpus_per_job", self.gpus_per_job, 0)
