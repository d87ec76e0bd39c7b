"""The `engine` group: which engine runs the workload (ours or the transformers baseline), how the job drives
it, and the engine's execution knobs (device, kernel choices, seed). The engine's ExecutionConfig is built
from it (job/engine_factory.py)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import Enum
from typing import Any

from nanoexp.config import ExecutionConfig, KnobError
from nanoexp.experiment.schema.keys import as_hydra_key


class EngineKind(Enum):
    nanoexp = "nanoexp"  # our engine, driven step by step
    hf = "hf"  # transformers `generate`, the baseline


@dataclass
class EngineGroup:
    """The engine's ExecutionConfig knobs (their defaults and checks are its), then the job's own."""

    device: str = ExecutionConfig.device
    attention_backend: str = ExecutionConfig.attention_backend
    gemm_backend: str = ExecutionConfig.gemm_backend
    pdl: str = ExecutionConfig.pdl
    seed: int = ExecutionConfig.seed
    expert_load_stats: bool = ExecutionConfig.expert_load_stats
    kind: EngineKind = EngineKind.nanoexp
    warmup: bool = True  # one short untimed request before the workload
    use_tqdm: bool = True  # a progress line while the workload runs (only on a terminal)
    reuse: bool = True  # a sweep's next job reuses this engine when its engine settings are equal

    def __post_init__(self) -> None:
        try:
            ExecutionConfig(**self.execution_knobs())
        except KnobError as e:
            raise as_hydra_key(e) from None

    def execution_knobs(self) -> dict[str, Any]:
        """The engine's ExecutionConfig fields, as this group sets them."""
        return {f.name: getattr(self, f.name) for f in fields(ExecutionConfig)}
