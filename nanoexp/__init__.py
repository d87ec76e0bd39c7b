"""nanoexp: a compact, fast Qwen3 inference engine and the experiments around it."""

from nanoexp.config import SamplingParams
from nanoexp.engine.llm import LLM

__all__ = ["LLM", "SamplingParams"]
