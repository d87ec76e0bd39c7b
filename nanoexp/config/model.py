"""Which weights the engine runs and in which precision."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nanoexp.config.checks import KnobError, choice

DTYPES = ("auto", "bfloat16", "float16", "float32")
LOAD_FORMATS = ("auto", "safetensors", "dummy")
QUANTIZATIONS = ("none", "fp8")


@dataclass
class ModelConfig:
    path: str | None = None  # a checkpoint directory (or a hub id); None with dummy weights and `arch`
    dtype: str = "auto"  # auto = the checkpoint's; on a CPU float32 unless bfloat16 is native there
    # auto = safetensors: the checkpoint at `path`, an error when it has none; dummy: random weights
    load_format: str = "auto"
    arch: dict[str, Any] | None = None  # config.json fields; replace the checkpoint's config when set
    # weights' precision: none = the checkpoint's dtype (an FP8 checkpoint runs in fp8 regardless);
    # fp8 = block-scaled e4m3 (128 x 128 blocks, activations per token and 128-group), quantized at load
    quantization: str = "none"

    def __post_init__(self) -> None:
        choice("model.dtype", self.dtype, DTYPES)
        choice("model.load_format", self.load_format, LOAD_FORMATS)
        choice("model.quantization", self.quantization, QUANTIZATIONS)
        if self.path is None and self.arch is None:
            raise KnobError("model.path", None, "a checkpoint directory or hub id (or give model.arch)")
