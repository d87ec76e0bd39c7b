"""The `model` group: which model a job runs (a name, where its checkpoint is, its typed architecture) and
the engine's model knobs. The engine's ModelConfig is built from it and the checkpoint found
(job/engine_factory.py)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from omegaconf import MISSING

from nanoexp.config import KnobError, ModelConfig
from nanoexp.config.checks import choice
from nanoexp.config.model import LOAD_FORMATS
from nanoexp.experiment.schema.keys import as_hydra_key

DUMMY_IF_MISSING = "dummy_if_missing"
# the engine's formats, and the default: dummy weights, loudly, when no checkpoint is found
MODEL_LOAD_FORMATS = (*LOAD_FORMATS, DUMMY_IF_MISSING)


@dataclass
class ArchConfig:
    """The architecture fields of the model's config.json (the engine's `model.arch` with dummy weights)."""

    architectures: list[str] = MISSING
    model_type: str = MISSING
    hidden_size: int = MISSING
    intermediate_size: int = MISSING
    num_hidden_layers: int = MISSING
    num_attention_heads: int = MISSING
    num_key_value_heads: int = MISSING
    head_dim: int = MISSING
    vocab_size: int = MISSING
    max_position_embeddings: int = MISSING
    rope_theta: float = MISSING
    rms_norm_eps: float = MISSING
    tie_word_embeddings: bool = MISSING
    attention_bias: bool = MISSING
    hidden_act: str = "silu"
    bos_token_id: int = MISSING
    eos_token_id: int = MISSING
    # Qwen3-MoE only (None: absent from the model's config)
    num_experts: int | None = None
    num_experts_per_tok: int | None = None
    moe_intermediate_size: int | None = None
    norm_topk_prob: bool | None = None
    decoder_sparse_step: int | None = None
    mlp_only_layers: list[int] | None = None

    def as_dict(self) -> dict[str, Any]:
        """The config.json fields the model has (those left None are not its own)."""
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass
class ModelGroup:
    """The engine's model knobs (dtype, quantization), where the weights come from (model.path, else the
    local hub cache by `hub_id`; load_format) and the typed `arch` dummy weights are built from. The engine's
    fields come first, in its order, as the logged config has always listed them."""

    path: str | None = ModelConfig.path
    dtype: str = ModelConfig.dtype
    load_format: str = DUMMY_IF_MISSING
    arch: ArchConfig = field(default_factory=ArchConfig)
    quantization: str = ModelConfig.quantization
    name: str = MISSING
    hub_id: str | None = None  # Hugging Face repo id, looked up in the local hub cache only

    def __post_init__(self) -> None:
        try:  # the engine's checks of the knobs it shares; its weights are the checkpoint found
            ModelConfig(
                path=self.path, dtype=self.dtype, arch=self.arch.as_dict(), quantization=self.quantization
            )
        except KnobError as e:
            raise as_hydra_key(e) from None
        choice("model.load_format", self.load_format, MODEL_LOAD_FORMATS)
