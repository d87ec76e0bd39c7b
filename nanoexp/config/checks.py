"""One-line validation errors that name the knob, its value and what is allowed."""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Callable
from typing import TypeGuard


class KnobError(ValueError):
    """A knob set to a value it cannot take. `knob` is its dotted name (`cache.block_size`)."""

    def __init__(self, knob: str, value: object, allowed: str, reason: str | None = None):
        """`reason`: what the value cannot do, in place of "is invalid: must be <allowed>"."""
        self.knob, self.value, self.allowed, self.reason = knob, value, allowed, reason
        super().__init__(
            f"{knob}={value!r} {reason}" if reason else f"{knob}={value!r} is invalid: must be {allowed}"
        )


MAX_INT64 = 2**63 - 1  # seeds and other integers that reach torch or numpy as int64


def is_int(value: object) -> TypeGuard[int]:
    """Python or numpy integers; not bools, not floats such as 2.5 or 2.0."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value: object) -> TypeGuard[float]:
    """Python or numpy ints and floats (inf and nan too); not bools or strings."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def is_number(value: object) -> TypeGuard[float]:
    """A finite real number: Python or numpy ints and floats, not bools, strings or nan/inf."""
    return is_real(value) and math.isfinite(value)


def choice(knob: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise KnobError(knob, value, f"one of {', '.join(allowed)}")


def integer(knob: str, value: object, low: int, note: str = "", high: int | None = None) -> None:
    """An integer in [low, high] (no upper bound when `high` is None)."""
    if not is_int(value) or value < low or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise KnobError(knob, value, f"an integer {bounds}{note}")


def boolean(knob: str, value: object) -> None:
    if not isinstance(value, bool):
        raise KnobError(knob, value, "true or false")


def number(knob: str, value: object, ok: Callable[[float], bool], allowed: str) -> None:
    """A finite int or float for which `ok` holds."""
    if not (is_number(value) and ok(value)):
        raise KnobError(knob, value, allowed)


def machine_memory_gb() -> float:
    """This machine's physical memory in GiB (inf where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        return math.inf
