"""The engine factory: an EngineConfig in, an engine (LLM) out."""

from __future__ import annotations

from nanoexp.config import EngineConfig
from nanoexp.engine.llm import LLM


def build_engine(config: EngineConfig) -> LLM:
    return LLM.from_config(config)
