"""One-line validation errors that name the knob, its value and what is allowed."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable


class KnobError(ValueError):
    """A knob set to a value it cannot take. `knob` is its dotted name (`cache.block_size`)."""

    def __init__(self, knob: str, value: object, allowed: str):
        self.knob, self.value, self.allowed = knob, value, allowed
        super().__init__(f"{knob}={value!r} is invalid: must be {allowed}")

    def renamed(self, knob: str) -> KnobError:
        return KnobError(knob, self.value, self.allowed)


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    """A finite real number: Python or numpy ints and floats, not bools, strings or nan/inf."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def choice(knob: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise KnobError(knob, value, f"one of {', '.join(allowed)}")


def integer(knob: str, value: object, low: int, note: str = "") -> None:
    if not is_int(value) or value < low:
        raise KnobError(knob, value, f"an integer >= {low}{note}")


def boolean(knob: str, value: object) -> None:
    if not isinstance(value, bool):
        raise KnobError(knob, value, "true or false")


def number(knob: str, value: object, ok: Callable[[float], bool], allowed: str) -> None:
    """A finite int or float for which `ok` holds."""
    if not (is_number(value) and ok(value)):
        raise KnobError(knob, value, allowed)
