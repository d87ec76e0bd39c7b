"""The model class of a checkpoint's `architectures` entry."""

from __future__ import annotations

from transformers import PretrainedConfig

from nanoexp.models.qwen3 import Qwen2ForCausalLM, Qwen3ForCausalLM
from nanoexp.models.qwen3_moe import Qwen3MoeForCausalLM

MODELS: dict[str, type[Qwen3ForCausalLM]] = {
    cls.__name__: cls for cls in (Qwen3ForCausalLM, Qwen2ForCausalLM, Qwen3MoeForCausalLM)
}


def model_class(config: PretrainedConfig) -> type[Qwen3ForCausalLM]:
    """Our model class for a checkpoint's `architectures` entry."""
    archs = getattr(config, "architectures", None)
    for arch in archs or []:
        if arch in MODELS:
            return MODELS[arch]
    raise ValueError(f"unsupported architecture {archs}; supported: {', '.join(MODELS)}")
