"""Hydra-free settings, one dataclass per concern; each holds its defaults and checks its fields. Every
layer may import these; they import no other layer. The experiment layer's Hydra config groups are these
classes or hold their knobs, and `LLM(model, **kwargs)` maps its flat keywords onto them."""

from nanoexp.config.cache import CacheConfig
from nanoexp.config.checks import KnobError
from nanoexp.config.engine import EngineConfig
from nanoexp.config.execution import ExecutionConfig
from nanoexp.config.model import ModelConfig
from nanoexp.config.parallel import ParallelConfig
from nanoexp.config.sampling import SamplingParams
from nanoexp.config.scheduler import SchedulerConfig

__all__ = [
    "CacheConfig",
    "EngineConfig",
    "ExecutionConfig",
    "KnobError",
    "ModelConfig",
    "ParallelConfig",
    "SamplingParams",
    "SchedulerConfig",
]
