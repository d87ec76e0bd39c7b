"""Programmatic dependent launch (PDL, `engine.pdl`): on Hopper and newer, a kernel may be launched
while its predecessor in the stream still runs, so its launch and start-up overlap the
predecessor's tail instead of following it. Captured into CUDA graphs as programmatic edges.

Every Triton kernel of the decode step follows one rule when launched this way: its first act
is `griddepcontrol.wait` (returns once the previous kernel has finished and its writes are
visible), then `griddepcontrol.launch_dependents` (lets the next kernel start launching). Waiting
first in every kernel keeps dependencies transitive: a kernel cannot finish before the one it
follows, so the kernel after it never sees a half-done grandparent. Kernels launched without PDL
(torch's own, cuBLAS) serialize as usual, and a PDL launch after one of them simply starts when
it ends.
"""

from __future__ import annotations

import os

import torch

MIN_CAPABILITY = (9, 0)

_enabled = False


def supported(device: torch.device) -> bool:
    """Whether `device` can launch dependents early (a CUDA GPU of compute capability 9.0+)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= MIN_CAPABILITY


def configure(choice: str, device: torch.device, has_triton: bool) -> bool:
    """Apply `engine.pdl` (on or off) to this process's kernels; returns the state."""
    global _enabled
    if choice == "on" and not (has_triton and supported(device)):
        raise ValueError(
            f"engine.pdl='on' needs Triton and a CUDA GPU of compute capability >= 9.0, got {device}; "
            "use 'off'"
        )
    _enabled = choice == "on"
    return _enabled


def enabled() -> bool:
    return _enabled


def launch_options() -> dict:
    """Keyword arguments for a Triton launch: the PDL constexpr, and the launch attribute when on.
    NANOEXP_PDL_RELEASE=exit (a measurement switch) lets the next kernel launch only as each one
    exits rather than right after its wait."""
    if not _enabled:
        return {"PDL": 0}
    return {"PDL": 1 if os.environ.get("NANOEXP_PDL_RELEASE") == "exit" else 2, "launch_pdl": True}
