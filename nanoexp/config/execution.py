"""Where and how the model runs: device, the kernel choices (attention backend, GEMM backend, PDL)
and the random seed. Messages name these knobs `engine.<field>`, the engine's own knobs (the API's
callers see their keywords: config/engine.py as_keyword)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from nanoexp.config.checks import MAX_INT64, boolean, choice, integer


@dataclass
class ExecutionConfig:
    knob_prefix: ClassVar[str] = "engine"  # as the runner and the kernels name these knobs too

    device: str = "auto"  # auto = CUDA when present
    # kernel choices, to compare in a sweep (with parallel.all_reduce, parallel.sharded_sampling and
    # cache.kv_cache_dtype); auto = what measured fastest on the machine
    attention_backend: str = "auto"  # auto: first self-checked of triton, flash_attn on CUDA; torch on CPU
    # decode-sized linear layers: auto = the Triton GEMV / skinny GEMM where they were measured
    # faster than torch (cuBLAS: 1-16 rows, weights up to 12 MiB or of up to 2,048 outputs), on CUDA in
    # bf16/fp16, torch everywhere else; triton = the Triton kernels for every layer up to 256 rows (to
    # A/B); torch = cuBLAS only
    gemm_backend: str = "auto"
    # programmatic dependent launch of the decode graphs' Triton kernels (kernels/pdl.py): each
    # launches as the previous one exits; auto = on for CUDA compute capability 9.0+
    pdl: str = "auto"
    seed: int = 0  # dummy weights and unseeded sampling
    # MoE models: tokens routed to each expert per layer, counted on the device each step and read back
    # with the sampled ids (StepStats' expert_load_* fields); no effect on a dense model
    expert_load_stats: bool = True

    def __post_init__(self) -> None:
        engine = self.knob_prefix
        choice(f"{engine}.device", self.device, ("auto", "cuda", "cpu"))
        choice(
            f"{engine}.attention_backend", self.attention_backend, ("auto", "torch", "triton", "flash_attn")
        )
        choice(f"{engine}.gemm_backend", self.gemm_backend, ("auto", "torch", "triton"))
        choice(f"{engine}.pdl", self.pdl, ("auto", "on", "off"))
        integer(f"{engine}.seed", self.seed, 0, high=MAX_INT64)
        boolean(f"{engine}.expert_load_stats", self.expert_load_stats)
