"""Paged attention layer: stores this step's K/V in the cache, then attends via the backend."""

from __future__ import annotations

import torch
from torch import nn

from nanoexp.kernels.base import AttentionBackend, AttentionMetadata


class Attention(nn.Module):
    """Backend-agnostic; the runner binds `backend`, `k_cache` and `v_cache` before use.

    `k_scale`/`v_scale` are this layer's fp8 KV-cache scales (float32 [1] on the model's device,
    see kernels/base.py): 1.0 until the runner calibrates them, and updated only in place, since
    CUDA graphs hold their addresses."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = scale
        self.backend: AttentionBackend | None = None
        self.k_cache = self.v_cache = torch.empty(0)
        self.k_scale = torch.ones(1, dtype=torch.float32)
        self.v_scale = torch.ones(1, dtype=torch.float32)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, md: AttentionMetadata
    ) -> torch.Tensor:
        backend, k_scale, v_scale = self.backend, self.k_scale, self.v_scale
        if self.k_cache.numel():  # no cache before it is sized (memory profiling): store nothing
            backend.store_kv(k, v, self.k_cache, self.v_cache, md.slot_mapping, k_scale, v_scale)
        if md.is_prefill:
            return backend.prefill(q, k, v, self.k_cache, self.v_cache, md, self.scale, k_scale, v_scale)
        return backend.decode(q, self.k_cache, self.v_cache, md, self.scale, k_scale, v_scale)


def attention_layers(model: nn.Module) -> list[Attention]:
    return [m for m in model.modules() if isinstance(m, Attention)]
