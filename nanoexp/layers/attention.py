"""Paged attention layer: stores this step's K/V in the cache, then attends via the backend."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from nanoexp.kernels.base import AttentionBackend, AttentionMetadata


class Attention(nn.Module):
    """Backend-agnostic; the runner binds `backend`, `k_cache` and `v_cache` before use.
    `k_scale`/`v_scale`: the fp8 cache's scales (kernels/base.py), 1.0 until calibrated, updated
    only in place (CUDA graphs hold their addresses)."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = scale
        self.backend: AttentionBackend | None = None
        self.k_cache = self.v_cache = torch.empty(0)
        self.k_scale = torch.ones(1, dtype=torch.float32)
        self.v_scale = torch.ones(1, dtype=torch.float32)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, md: AttentionMetadata) -> Tensor:
        assert self.backend is not None, "the runner binds the backend before the first forward"
        if self.k_cache.numel():  # no cache before it is sized (memory profiling): store nothing
            scales = self.k_scale, self.v_scale
            self.backend.store_kv(k, v, self.k_cache, self.v_cache, md.slot_mapping, *scales)
        return self._attend(q, k, v, md)

    def forward_qkv(
        self,
        qkv: Tensor,
        positions: Tensor,
        cos_sin: Tensor,
        qk_norm: tuple[Tensor, Tensor, float] | None,
        md: AttentionMetadata,
    ) -> Tensor | None:
        """From the fused qkv projection: q/k norm + RoPE + K/V store in one backend op, then
        attention; None when the backend has no such op (the caller runs the unfused path)."""
        if not self.k_cache.numel():  # memory profiling and fp8 calibration take the unfused path
            return None
        assert self.backend is not None
        # Prefill without a cached prefix attends over this step's packed k, not the cache.
        write_k = md.has_prefill and not md.has_cached_prefix
        qk = self.backend.qk_norm_rope_store(
            qkv,
            positions,
            cos_sin,
            qk_norm,
            self.num_heads,
            self.num_kv_heads,
            self.k_cache,
            self.v_cache,
            md.slot_mapping,
            write_k,
            self.k_scale,
            self.v_scale,
        )
        if qk is None:
            return None
        q, k = qk
        v = qkv[:, qkv.shape[1] - self.num_kv_heads * self.head_dim :]
        return self._attend(q, k, v.view(-1, self.num_kv_heads, self.head_dim), md)

    def _attend(self, q, k, v, md: AttentionMetadata) -> Tensor:
        assert self.backend is not None
        caches, scales = (self.k_cache, self.v_cache), (self.k_scale, self.v_scale)
        if not md.has_prefill:
            return self.backend.decode(q, *caches, md, self.scale, *scales)
        attend = self.backend.mixed if md.num_decodes else self.backend.prefill  # mixed: decodes first
        return attend(q, k, v, *caches, md, self.scale, *scales)


def attention_layers(model: nn.Module) -> list[Attention]:
    return [m for m in model.modules() if isinstance(m, Attention)]
