"""Per-request sampling settings, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SamplingParams:
    """How one request is decoded. `temperature=0` means greedy."""

    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    min_p: float = 0.0
    max_tokens: int = 64
    ignore_eos: bool = False
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        _check(self.temperature >= 0.0, "temperature", self.temperature, ">= 0 (0 = greedy)")
        _check(self.top_k == -1 or self.top_k >= 1, "top_k", self.top_k, "-1 (off) or >= 1")
        _check(0.0 < self.top_p <= 1.0, "top_p", self.top_p, "in (0, 1]")
        _check(0.0 <= self.min_p <= 1.0, "min_p", self.min_p, "in [0, 1]")
        _check(self.max_tokens >= 1, "max_tokens", self.max_tokens, ">= 1")
        _check(self.seed is None or self.seed >= 0, "seed", self.seed, "None or >= 0")
        for token in self.stop_token_ids:
            _check(token >= 0, "stop_token_ids", self.stop_token_ids, "non-negative token ids")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _check(ok: bool, field: str, value: object, allowed: str) -> None:
    if not ok:
        raise ValueError(f"SamplingParams.{field}={value!r} is invalid: must be {allowed}")
