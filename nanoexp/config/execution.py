"""Where and how the model runs: device, attention and GEMM kernels, random seed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from nanoexp.config.checks import MAX_INT64, choice, integer

DEVICES = ("auto", "cuda", "cpu")
ATTENTION_BACKENDS = ("auto", "torch", "triton", "flash_attn")
GEMM_BACKENDS = ("auto", "torch", "triton")
PDL_CHOICES = ("auto", "on", "off", "prefetch")


@dataclass
class ExecutionConfig:
    section: ClassVar[str] = "engine"

    device: str = "auto"  # auto = CUDA when present
    attention_backend: str = "auto"  # auto: first self-checked of triton, flash_attn on CUDA; torch on CPU
    # decode-sized linear layers: auto = the Triton GEMV / skinny GEMM where they were measured
    # faster than torch (cuBLAS: 1-16 rows, weights up to 12 MiB), on CUDA in bf16/fp16, torch
    # everywhere else; triton = the Triton kernels for every layer up to 256 rows (to A/B); torch
    gemm_backend: str = "auto"
    # programmatic dependent launch of the decode graphs' Triton kernels (kernels/pdl.py): each
    # launches as the previous one exits; auto = on for CUDA compute capability 9.0+; prefetch =
    # early launch with the GEMMs' weights prefetched (measured slower below ~64 rows)
    pdl: str = "auto"
    seed: int = 0  # dummy weights and unseeded sampling

    def __post_init__(self) -> None:
        choice("engine.device", self.device, DEVICES)
        choice("engine.attention_backend", self.attention_backend, ATTENTION_BACKENDS)
        choice("engine.gemm_backend", self.gemm_backend, GEMM_BACKENDS)
        choice("engine.pdl", self.pdl, PDL_CHOICES)
        integer("engine.seed", self.seed, 0, high=MAX_INT64)
