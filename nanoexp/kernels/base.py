"""The contract every attention backend implements, and the per-step metadata it reads."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    """Describes one model step's batch; prepared once per step by the runner.

    Tokens of all sequences are packed along dim 0. For sequence i, its new (query) tokens are
    rows cu_seqlens_q[i]:cu_seqlens_q[i+1]; its whole context (cached prefix plus new tokens)
    has context_lens[i] tokens, stored in the paged cache at the blocks of block_tables[i].
    A new token at position p of sequence i lives at slot
    block_tables[i][p // block_size] * block_size + p % block_size; slot -1 means "do not store"
    (padding rows, e.g. CUDA-graph padding).
    """

    is_prefill: bool
    slot_mapping: torch.Tensor  # int64 [num_tokens]
    context_lens: torch.Tensor  # int32 [num_seqs]
    block_tables: torch.Tensor  # int32 [num_seqs, max_blocks_per_seq], padded with 0
    cu_seqlens_q: torch.Tensor | None = None  # int32 [num_seqs + 1], prefill only
    cu_seqlens_k: torch.Tensor | None = None  # int32 [num_seqs + 1], prefill only
    max_seqlen_q: int = 1
    max_seqlen_k: int = 0
    has_cached_prefix: bool = False  # some prefill sequence attends to tokens from earlier steps


class AttentionBackend:
    """Stores new K/V by slot mapping, then attends.

    Caches are [num_blocks, block_size, kv_heads, head_dim]."""

    name = "base"

    def store_kv(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        raise NotImplementedError

    def fused_qk_norm_rope_store(
        self,
        qkv: torch.Tensor,  # [num_tokens, (num_heads + 2 * num_kv_heads) * head_dim]
        positions: torch.Tensor,
        cos_sin: torch.Tensor,  # [max_position, head_dim] fp32: cos halves, then sin halves
        qk_norm: tuple[torch.Tensor, torch.Tensor, float] | None,  # (q weight, k weight, eps)
        num_heads: int,
        num_kv_heads: int,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
        write_k: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """Optional: per-head q/k RMSNorm (if qk_norm), RoPE and store_kv as one op.

        Returns (q, k), k only if write_k, or None where this backend (or device) has no such op:
        the caller then runs the torch ops and store_kv."""
        return None

    def prefill(
        self,
        q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim] (this step's new tokens)
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        md: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        """Causal attention of each sequence's new tokens over its whole context."""
        raise NotImplementedError

    def decode(
        self,
        q: torch.Tensor,  # [num_seqs, num_heads, head_dim], one new token per sequence
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        md: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:  # [num_seqs, num_heads, head_dim]
        """Attention of each sequence's newest token over its context_lens[i] cached tokens."""
        raise NotImplementedError
