"""Programmatic dependent launch (PDL, `engine.pdl`): on Hopper and newer, a Triton kernel captured
in a CUDA graph is launched as its predecessor exits, overlapping that one's last memory flush.

The rule: every such kernel first calls `griddepcontrol.wait`, so dependencies stay transitive. None
launches dependents early: that made the batch-1 step 20% slower on an H200, launching at exit 4%
faster (experiments/nanovllm_bench/README.md). Eager launches (sampler, prefill) measured slower
with PDL and do not use it; kernels without it (torch's, cuBLAS) serialize as usual."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from nanoexp.config.checks import KnobError

MIN_CAPABILITY = (9, 0)

_enabled = False
_graph_launches = False


@functools.lru_cache(maxsize=8)
def supported(device: torch.device) -> bool:
    """Whether `device` can launch dependents early: a CUDA GPU of compute capability 9.0+ (Hopper on)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= MIN_CAPABILITY


def configure(choice: str, device: torch.device, has_triton: bool) -> bool:
    """Apply `engine.pdl` (auto = on where supported, on, off); returns whether PDL is on."""
    global _enabled
    usable = has_triton and supported(device)
    if choice == "on" and not usable:
        why = f"needs Triton and a CUDA GPU of compute capability >= 9.0, got {device}; use 'auto' or 'off'"
        raise KnobError("engine.pdl", "on", "auto or off", why)
    _enabled = usable and choice != "off"
    return _enabled


def enabled() -> bool:
    return _enabled


@contextmanager
def graph_launches() -> Iterator[None]:
    """Launches in this block are the CUDA graphs' (capture and its warm-up run): PDL when it is on."""
    global _graph_launches
    _graph_launches = True
    try:
        yield
    finally:
        _graph_launches = False


def launch_options() -> dict:
    """A Triton launch's PDL constexpr, plus the launch attribute for graph launches with PDL on."""
    if _enabled and _graph_launches:
        return {"PDL": True, "launch_pdl": True}
    return {"PDL": False}
