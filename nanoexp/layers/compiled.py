"""Small elementwise ops (norms, RoPE, SwiGLU, sampling) as plain functions; `compilable` routes calls to
a `torch.compile`d copy while `use_compiled(True)` is active (the runner turns it on for CUDA-graph capture
and sampling), and to the plain function otherwise (CPU, eager mode, prefill). An op compiled as a whole
composes the plain functions, `op.__wrapped__`."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any, Generic, ParamSpec, Protocol, TypeVar

import torch

_enabled = False
P = ParamSpec("P")
R = TypeVar("R")


class CompilableOp(Protocol, Generic[P, R]):
    """A `compilable` op: called with the plain function's positional arguments; the plain function
    stays reachable as `__wrapped__`."""

    __wrapped__: Callable[P, R]

    def __call__(self, *args: Any) -> R: ...


@contextlib.contextmanager
def use_compiled(on: bool) -> Iterator[None]:
    global _enabled
    previous, _enabled = _enabled, on
    try:
        yield
    finally:
        _enabled = previous


def compilable(fn: Callable[P, R]) -> CompilableOp[P, R]:
    compiled = None

    @functools.wraps(fn)
    def dispatch(*args):
        nonlocal compiled
        if not _enabled:
            return fn(*args)
        if compiled is None:
            # one process may serve several models and dtypes (tests do): allow their variants
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
            compiled = torch.compile(fn, dynamic=True, fullgraph=True)
        return compiled(*args)

    return dispatch
