"""Every engine knob, validated once."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

DEVICES = ("auto", "cuda", "cpu")
DTYPES = ("auto", "bfloat16", "float16", "float32")
LOAD_FORMATS = ("auto", "safetensors", "dummy")
ATTENTION_BACKENDS = ("auto", "torch", "triton", "flash_attn")


@dataclass
class EngineConfig:
    """Engine settings. `LLM(model, **kwargs)` maps its kwargs onto these fields."""

    model: str
    device: str = "auto"
    dtype: str = "auto"
    tensor_parallel_size: int = 1
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 16384
    max_model_len: int = 4096
    gpu_memory_utilization: float = 0.9
    cpu_kv_cache_gb: float = 2.0
    kvcache_block_size: int = 256
    num_kvcache_blocks: int = -1
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    enforce_eager: bool = False
    async_scheduling: bool | None = None  # overlap step n+1 with step n; None = on with one rank only
    fused_prefill: bool = True  # CUDA: compiled norm/RoPE/SwiGLU kernels in prefill too, not only decode
    sampler_kernel: bool = True  # CUDA: one-pass Triton sampling kernel for rows without top-k/p, min-p
    load_format: str = "auto"
    attention_backend: str = "auto"
    seed: int = 0
    hf_config: dict | None = None  # architecture fields used instead of the checkpoint's config.json

    def __post_init__(self) -> None:
        _choice("device", self.device, DEVICES)
        _choice("dtype", self.dtype, DTYPES)
        _choice("load_format", self.load_format, LOAD_FORMATS)
        _choice("attention_backend", self.attention_backend, ATTENTION_BACKENDS)
        _at_least("tensor_parallel_size", self.tensor_parallel_size, 1)
        _at_least("max_num_seqs", self.max_num_seqs, 1)
        _at_least("max_num_batched_tokens", self.max_num_batched_tokens, 1)
        _at_least("max_model_len", self.max_model_len, 1)
        bs = self.kvcache_block_size
        if not (isinstance(bs, int) and 1 <= bs <= 1024 and bs & (bs - 1) == 0):
            raise ValueError(
                f"kvcache_block_size={bs!r} is invalid: must be a power of two from 1 to 1024"
            )
        if self.num_kvcache_blocks != -1:
            _at_least("num_kvcache_blocks", self.num_kvcache_blocks, 1, "(or -1 = from memory)")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"gpu_memory_utilization={self.gpu_memory_utilization!r} is invalid: "
                "must be in (0, 1]"
            )
        if not self.cpu_kv_cache_gb > 0:
            raise ValueError(f"cpu_kv_cache_gb={self.cpu_kv_cache_gb!r} is invalid: must be > 0")
        if self.async_scheduling is None:
            self.async_scheduling = self.tensor_parallel_size == 1
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"max_num_batched_tokens={self.max_num_batched_tokens} is smaller than "
                f"max_model_len={self.max_model_len}: enable chunked prefill or raise the budget"
            )

    @classmethod
    def from_kwargs(cls, model: str, **kwargs: Any) -> EngineConfig:
        known = {f.name for f in fields(cls)} - {"model"}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise TypeError(
                f"unknown engine argument(s) {', '.join(unknown)}; allowed: {', '.join(sorted(known))}"
            )
        return cls(model=model, **kwargs)


def _choice(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is invalid: must be one of {', '.join(allowed)}")


def _at_least(name: str, value: object, low: int, extra: str = "") -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name}={value!r} is invalid: must be an integer >= {low} {extra}".strip())
