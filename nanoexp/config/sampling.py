"""Per-request sampling settings, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass

from nanoexp.config.checks import MAX_INT64, KnobError, is_int, is_number


@dataclass(frozen=True)
class SamplingParams:
    """How one request is decoded. `temperature=0` means greedy."""

    temperature: float = 1.0
    top_k: int = -1  # -1 = off
    top_p: float = 1.0
    min_p: float = 0.0
    max_tokens: int = 64
    ignore_eos: bool = False
    seed: int | None = None  # makes this request's tokens reproducible whatever else is batched
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        self._check("temperature", float, lambda t: t >= 0, ">= 0 (0 = greedy)")
        self._check("top_k", int, lambda k: k == -1 or k >= 1, "-1 (off) or an integer >= 1")
        self._check("top_p", float, lambda p: 0 < p <= 1, "a number in (0, 1]")
        self._check("min_p", float, lambda p: 0 <= p <= 1, "a number in [0, 1]")
        self._check("max_tokens", int, lambda n: n >= 1, "an integer >= 1")
        if not isinstance(self.ignore_eos, bool):
            raise KnobError("SamplingParams.ignore_eos", self.ignore_eos, "True or False")
        if self.seed is not None:
            self._check("seed", int, lambda s: 0 <= s <= MAX_INT64, f"None or an integer in [0, {MAX_INT64}]")
        ids = self.stop_token_ids
        iterable = hasattr(ids, "__iter__") and not isinstance(ids, str | bytes)
        ids = tuple(ids) if iterable else ids
        if not iterable or not all(is_int(t) and t >= 0 for t in ids):
            raise KnobError("SamplingParams.stop_token_ids", ids, "a sequence of token ids >= 0")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in ids))

    def _check(self, name: str, cast: type, ok, allowed: str) -> None:
        """Stores the field as a plain `cast` (a finite number for float, an integer for int)."""
        value = getattr(self, name)
        if not ((is_number(value) if cast is float else is_int(value)) and ok(value)):
            raise KnobError(f"SamplingParams.{name}", value, allowed)
        object.__setattr__(self, name, cast(value))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
