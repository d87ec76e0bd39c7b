"""Where and how the model runs: device, attention kernels, random seed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from nanoexp.config.checks import choice, integer

DEVICES = ("auto", "cuda", "cpu")
ATTENTION_BACKENDS = ("auto", "torch", "triton", "flash_attn")


@dataclass
class ExecutionConfig:
    section: ClassVar[str] = "engine"

    device: str = "auto"  # auto = CUDA when present
    attention_backend: str = "auto"  # auto: first self-checked of triton, flash_attn on CUDA; torch on CPU
    seed: int = 0  # dummy weights and unseeded sampling

    def __post_init__(self) -> None:
        choice("engine.device", self.device, DEVICES)
        choice("engine.attention_backend", self.attention_backend, ATTENTION_BACKENDS)
        integer("engine.seed", self.seed, 0)
