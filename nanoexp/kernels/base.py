"""The attention backend contract, the per-step metadata it reads, the fp8 KV-cache convention, and
the RMSNorm a skinny GEMM can apply to its input first.

Every cache is [num_blocks, block_size, kv_heads, head_dim]. fp8 (`cache.kv_cache_dtype=fp8_e4m3`):
`torch.float8_e4m3fn` caches; each layer owns float32 [1] device tensors `k_scale`, `v_scale` (1.0
for a cache in the model's dtype). Kernels load the scales through pointers, never as Python floats,
so a captured CUDA graph stays valid when they are recalibrated in place. Readers may fold them into
scores and output.

    quantize:   cache = clamp(x.float() / scale, -FP8_MAX, FP8_MAX).to(float8_e4m3fn)  (round to nearest even)
    dequantize: x = cache.float() * scale
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import Tensor

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite float8_e4m3fn
DEFAULT_NUM_SMS = 132  # an H100/H200, for sizing launches where there is no CUDA device


@dataclass
class AttentionMetadata:
    """One model step's batch. Sequence i's new tokens are rows cu_seqlens_q[i]:cu_seqlens_q[i+1], its
    context (cached prefix plus new tokens) context_lens[i] tokens; position p lives at slot
    block_tables[i][p // block_size] * block_size + p % block_size; slot -1: not stored (padding).
    A mixed step packs num_decodes one-token decodes first; cu_seqlens_*, max_seqlen_* and
    has_cached_prefix then describe only the prefills (cu_seqlens_q[0] = 0 at row num_decodes)."""

    has_prefill: bool
    slot_mapping: Tensor  # int64 [num_tokens]
    context_lens: Tensor  # int32 [num_seqs]
    block_tables: Tensor  # int32 [num_seqs, max_blocks_per_seq], padded with 0
    cu_seqlens_q: Tensor | None = None  # int32 [num_seqs + 1], prefill only
    cu_seqlens_k: Tensor | None = None  # int32 [num_seqs + 1], prefill only
    max_seqlen_q: int = 1
    max_seqlen_k: int = 0  # bounds every context_lens entry it describes; 0: unknown (a captured graph's)
    # a prefill sequence attends to earlier steps' tokens, or (lossy cache) prefill reads K/V from the cache
    has_cached_prefix: bool = False
    num_decodes: int = 0  # leading one-token decode sequences of a prefill step (a mixed step)
    max_decode_seqlen_k: int = 0  # a mixed step's longest decode context; 0: unknown
    # A step graph's mixed step: the prefill tile table and each leading decode slot's context (0: none)
    prefill_tiles: Tensor | None = None
    decode_context_lens: Tensor | None = None

    @functools.cached_property
    def decode_part(self) -> AttentionMetadata:
        """A mixed step's leading decodes, as a decode step."""
        d = self.num_decodes
        return AttentionMetadata(
            False,
            self.slot_mapping[:d],
            self.context_lens[:d],
            self.block_tables[:d],
            max_seqlen_k=self.max_decode_seqlen_k,
        )

    @functools.cached_property
    def prefill_part(self) -> AttentionMetadata:
        """A mixed step's prefill sequences, as a prefill step of their rows."""
        d = self.num_decodes
        return AttentionMetadata(
            True,
            self.slot_mapping[d:],
            self.context_lens[d:],
            self.block_tables[d:],
            self.cu_seqlens_q,
            self.cu_seqlens_k,
            self.max_seqlen_q,
            self.max_seqlen_k,
            self.has_cached_prefix,
        )


class AttentionBackend:
    """Stores new K/V by slot mapping, then attends. An fp8 cache requires `k_scale`/`v_scale` (other
    caches ignore them); prefill without a cached prefix attends to this step's k/v as given."""

    name = "base"
    selection = ""  # why kernels/select.py chose this backend, one line
    captures_mixed_steps = False  # mixed() honours AttentionMetadata.prefill_tiles (step graphs)

    def store_kv(
        self,
        k: Tensor,
        v: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        slot_mapping: Tensor,
        k_scale: Tensor | None = None,
        v_scale: Tensor | None = None,
    ) -> None:
        raise NotImplementedError

    def qk_norm_rope_store(
        self,
        qkv: Tensor,  # [num_tokens, (num_heads + 2 * num_kv_heads) * head_dim]
        positions: Tensor,
        cos_sin: Tensor,  # [max_position, head_dim] fp32: cos halves, then sin halves
        qk_norm: tuple[Tensor, Tensor, float] | None,  # (q weight, k weight, eps)
        num_heads: int,
        num_kv_heads: int,
        k_cache: Tensor,
        v_cache: Tensor,
        slot_mapping: Tensor,
        write_k: bool,
        k_scale: Tensor | None = None,
        v_scale: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None] | None:
        """Optional fused q/k RMSNorm + RoPE + store_kv: (q, k if write_k), or None (use the torch ops)."""
        return None

    def prefill(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        md: AttentionMetadata,
        scale: float,
        k_scale: Tensor | None = None,
        v_scale: Tensor | None = None,
    ) -> Tensor:
        """Causal attention of each sequence's new tokens (q, k, v packed by token) over its context."""
        raise NotImplementedError

    def mixed(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        md: AttentionMetadata,
        scale: float,
        k_scale: Tensor | None = None,
        v_scale: Tensor | None = None,
    ) -> Tensor:
        """A mixed step: the leading md.num_decodes rows through decode, the rest through prefill."""
        d = md.num_decodes
        decoded = self.decode(q[:d], k_cache, v_cache, md.decode_part, scale, k_scale, v_scale)
        k, v = (None if t is None else t[d:] for t in (k, v))  # None: read from the cache
        prefilled = self.prefill(q[d:], k, v, k_cache, v_cache, md.prefill_part, scale, k_scale, v_scale)
        return torch.cat([decoded, prefilled])

    def decode(
        self,
        q: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        md: AttentionMetadata,
        scale: float,
        k_scale: Tensor | None = None,
        v_scale: Tensor | None = None,
    ) -> Tensor:
        """Attention of each sequence's newest token (q [seqs, heads, dim]) over its cached context."""
        raise NotImplementedError


@dataclass
class NormFirst:
    """The RMSNorm a skinny GEMM applies to its input first: RMSNorm(x + residual) * weight before the
    product; residual None: RMSNorm(x) * weight."""

    weight: Tensor
    eps: float
    residual: Tensor | None = None


def check_scales(k_cache: Tensor, k_scale: Tensor | None, v_scale: Tensor | None) -> bool:
    """Whether the cache is fp8; an fp8 cache without its scales is an error."""
    if k_cache.dtype != FP8_DTYPE:
        return False
    if k_scale is None or v_scale is None:
        raise ValueError("an fp8 KV cache needs k_scale and v_scale (float32 tensors of shape [1])")
    return True


@functools.lru_cache(maxsize=8)
def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of `device`, which kernels size their grids by."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return DEFAULT_NUM_SMS
