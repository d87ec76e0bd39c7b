"""Programmatic dependent launch (PDL, `engine.pdl`): on Hopper and newer, a kernel captured in a
decode CUDA graph is launched as its predecessor exits instead of after the graph's usual
kernel-to-kernel gap, so its launch overlaps the predecessor's last memory flush.

Every Triton kernel of the decode step follows one rule when launched this way: its first act is
`griddepcontrol.wait` (returns once the previous kernel has finished and its writes are
visible). Waiting first in every kernel keeps dependencies transitive: a kernel cannot finish
before the one it follows. No kernel calls `griddepcontrol.launch_dependents` early: letting the
next kernel launch right after the wait made the batch-1 step 20% slower on an H200, launching
at exit 4% faster (experiments/nanovllm_bench/notes.md, run 15). Only launches inside a CUDA
graph capture use PDL; eager ones (the sampler, prefill) do not, where it measured slower.
Kernels launched without PDL (torch's own, cuBLAS) serialize as usual.

`engine.pdl=prefetch` is a variant to A/B against `on`: every kernel lets its successor launch as
soon as its own wait returns, and the skinny GEMM, whose weights no kernel writes, asks for its
weight tile in L2 before it waits. Dependencies stay transitive: a kernel releases its successor
only after its own predecessor has finished. Measured on an H200 (notes.md, run 24): the decode
graph 27% slower at batch 1, 13% at 16, 4% faster at 64, so `auto` means `on`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

MIN_CAPABILITY = (9, 0)
# The `PDL` constexpr of the kernels: 0 off, 1 launch at exit, 2 early launch with prefetch.
MODES = {"off": 0, "on": 1, "prefetch": 2}

_mode = 0
_graph_launches = False


def supported(device: torch.device) -> bool:
    """Whether `device` can launch dependents early (a CUDA GPU of compute capability 9.0+)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= MIN_CAPABILITY


def configure(choice: str, device: torch.device, has_triton: bool) -> bool:
    """Apply `engine.pdl` (auto, on, prefetch or off) to this process's kernels; returns whether
    PDL is on. auto = on where supported."""
    global _mode
    usable = has_triton and supported(device)
    if choice in ("on", "prefetch") and not usable:
        raise ValueError(
            f"engine.pdl={choice!r} needs Triton and a CUDA GPU of compute capability >= 9.0, got {device}; "
            "use 'auto' or 'off'"
        )
    _mode = MODES["on" if choice == "auto" else choice] if usable else 0
    return _mode > 0


def enabled() -> bool:
    return _mode > 0


def mode() -> str:
    """off, on or prefetch: what `configure` settled on."""
    return next(name for name, value in MODES.items() if value == _mode)


@contextmanager
def graph_launches() -> Iterator[None]:
    """Launches in this block are the decode graphs' (their capture and its warm-up run, which
    compiles the PDL variants outside the capture): they use PDL when it is on."""
    global _graph_launches
    _graph_launches = True
    try:
        yield
    finally:
        _graph_launches = False


def launch_options() -> dict:
    """Keyword arguments for a Triton launch: the PDL constexpr (see MODES), plus the launch
    attribute for the decode graphs' launches with PDL on."""
    if _mode and _graph_launches:
        return {"PDL": _mode, "launch_pdl": True}
    return {"PDL": False}
