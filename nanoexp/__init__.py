"""nanoexp: a compact, fast Qwen3 inference engine and the experiments around it."""

from nanoexp.engine.llm import LLM
from nanoexp.config import SamplingParams

__all__ = ["LLM", "SamplingParams"]
