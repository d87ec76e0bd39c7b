"""Small elementwise ops (norms, RoPE, SwiGLU) compiled into fused kernels on GPUs.

Each op is a plain function; `fusable` routes calls to a `torch.compile`d copy once the runner
turns fusion on (CUDA, not eager), and to the function itself otherwise (CPU, tests, eager)."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

_enabled = False


def enable_fusion(on: bool = True) -> None:
    global _enabled
    _enabled = on


def fusable(fn: Callable) -> Callable:
    compiled = None

    @functools.wraps(fn)
    def dispatch(*args):
        nonlocal compiled
        if not _enabled:
            return fn(*args)
        if compiled is None:
            compiled = torch.compile(fn, dynamic=True, fullgraph=True)
        return compiled(*args)

    return dispatch
