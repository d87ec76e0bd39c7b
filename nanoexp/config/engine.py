"""EngineConfig composes the per-concern configs; `from_kwargs` maps vLLM-style flat keywords (KEYWORDS)."""

from __future__ import annotations

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
# every keyword -> the knob's name in the config classes' messages: `<section>.<field>`, or the section's own
# prefix where it declares one (ExecutionConfig's knobs are the engine's, `engine.device`)
KNOB_NAMES = {
    keyword: f"{getattr(SECTIONS[s], 'knob_prefix', s)}.{n}" for keyword, (s, n) in KEYWORDS.items()
}
KEYWORD_OF_KNOB = {knob: keyword for keyword, knob in KNOB_NAMES.items()}


def keyword_of(knob: str) -> str:
    """The `LLM(...)` keyword of a knob as the config classes' messages name it (itself when it is none)."""
    return KEYWORD_OF_KNOB.get(knob, knob)


def as_keyword(e: KnobError) -> KnobError:
    """A config class's error (which names the knob by section, `cache.block_size`) as `LLM(...)` callers
    spell the knob (`kv_block_size`)."""
    return KnobError(keyword_of(e.knob), e.value, e.allowed, e.reason)


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
