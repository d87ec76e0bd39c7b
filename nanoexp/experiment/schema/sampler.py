"""The `sampler` group: the sampling knobs a workload's requests share, checked as the engine checks them."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from nanoexp.config import KnobError, SamplingParams


@dataclass
class SamplerConfig:
    """The sampling knobs a workload's requests share; checked by building a SamplingParams."""

    name: str = "default"
    temperature: float = SamplingParams.temperature
    top_k: int = SamplingParams.top_k
    top_p: float = SamplingParams.top_p
    min_p: float = SamplingParams.min_p
    seed: int | None = SamplingParams.seed  # request i gets seed + i

    def __post_init__(self) -> None:
        try:
            SamplingParams(**self.knobs())
        except KnobError as e:
            raise KnobError("sampler." + e.knob.rsplit(".", 1)[-1], e.value, e.allowed) from None

    def knobs(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "name"}
