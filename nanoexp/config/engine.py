"""EngineConfig composes the per-concern configs; `from_kwargs` maps vLLM-style flat keywords (KEYWORDS)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from typing import Any

from nanoexp.config import aliases
from nanoexp.config.cache import CacheConfig
from nanoexp.config.checks import KnobError
from nanoexp.config.execution import ExecutionConfig
from nanoexp.config.model import ModelConfig
from nanoexp.config.parallel import ParallelConfig
from nanoexp.config.scheduler import SchedulerConfig

SECTIONS = {
    "model": ModelConfig,
    "cache": CacheConfig,
    "scheduler": SchedulerConfig,
    "parallel": ParallelConfig,
    "execution": ExecutionConfig,
}
# field -> flat keyword, where the field's name needs its group's word (docs/internals.md's glossary)
RENAMED = {
    ("cache", "block_size"): "kv_block_size",
    ("cache", "num_blocks"): "num_kv_blocks",
    ("model", "arch"): "hf_config",
}
# every keyword `LLM(model, **kwargs)` accepts -> the field it sets
KEYWORDS = {
    RENAMED.get((section, f.name), f.name): (section, f.name)
    for section, cls in SECTIONS.items()
    for f in fields(cls)
    if (section, f.name) != ("model", "path") and f.name not in aliases.KEYWORDS
}
KNOB_PREFIX = {"execution": "engine"}  # a section whose knobs are named after another (the Hydra group)
# every keyword -> the key run.py's users type for the same knob (the Hydra config's dotted key)
HYDRA_KEYS = {keyword: f"{KNOB_PREFIX.get(s, s)}.{n}" for keyword, (s, n) in KEYWORDS.items()}


def _keyword_pattern() -> re.Pattern:
    """A keyword as a message names a knob: `keyword=...`, or bare where it cannot be a plain word (it has
    an underscore); never inside a dotted key (`engine.device`) or another identifier."""
    names = sorted(HYDRA_KEYS, key=len, reverse=True)
    bare = "|".join(re.escape(k) for k in names if "_" in k)
    assigned = "|".join(re.escape(k) for k in names)
    return re.compile(rf"(?<![\w./=-])(?:(?:{assigned})(?=\s*=)|(?:{bare})(?![\w]))")


KEYWORD_PATTERN = _keyword_pattern()


def as_keyword(e: KnobError) -> KnobError:
    """A config class's error (which names the Hydra key, `cache.block_size`) as `LLM(...)` callers
    spell the knob (`kv_block_size`); the inverse of `in_hydra_keys`, from the same table."""
    keyword = {key: keyword for keyword, key in HYDRA_KEYS.items()}.get(e.knob, e.knob)
    return KnobError(keyword, e.value, e.allowed, e.reason)


def in_hydra_keys(message: str) -> str:
    """An engine message (phrased with `LLM(**kwargs)`'s keywords) phrased with the Hydra keys run.py's
    users type: `num_kv_blocks` -> `cache.num_blocks`, `device='cuda'` -> `engine.device='cuda'`.
    The one place where the two spellings meet; run.py's error path applies it to every error line."""
    return KEYWORD_PATTERN.sub(lambda m: HYDRA_KEYS[m.group(0)], message)


@dataclass
class EngineConfig:
    model: ModelConfig
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    execution: ExecutionConfig = field(default_factory=ExecutionConfig)

    @classmethod
    def from_kwargs(cls, model: str | None, **kwargs: Any) -> EngineConfig:
        """`LLM(model, **kwargs)`: unknown keywords and invalid values are errors naming the keyword."""
        kwargs = aliases.rename_keywords(kwargs)
        unknown = sorted(set(kwargs) - set(KEYWORDS))
        if unknown:
            allowed = ", ".join(sorted(KEYWORDS))
            raise TypeError(f"unknown engine argument(s) {', '.join(unknown)}; allowed: {allowed}")
        values: dict[str, dict[str, Any]] = {section: {} for section in SECTIONS}
        values["model"]["path"] = model
        for keyword, value in kwargs.items():
            section, name = KEYWORDS[keyword]
            values[section][name] = value
        try:
            return cls(**{s: SECTIONS[s](**v) for s, v in values.items()})
        except KnobError as e:
            raise as_keyword(e) from None
