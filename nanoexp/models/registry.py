"""Maps a checkpoint's `architectures` entry to our model class."""

from __future__ import annotations

from torch import nn
from transformers import PretrainedConfig

from nanoexp.models.qwen3 import Qwen2ForCausalLM, Qwen3ForCausalLM

MODELS: dict[str, type[nn.Module]] = {
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
}


def model_class(config: PretrainedConfig) -> type[nn.Module]:
    for arch in getattr(config, "architectures", None) or []:
        if arch in MODELS:
            return MODELS[arch]
    raise ValueError(
        f"unsupported architecture {getattr(config, 'architectures', None)}; supported: {', '.join(MODELS)}"
    )
