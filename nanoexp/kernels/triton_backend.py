"""Attention backend built on the Triton kernels (paged KV, split-K decode, varlen prefill)."""

from __future__ import annotations

import torch

from nanoexp.kernels.base import AttentionBackend
from nanoexp.kernels.triton_attention import paged_decode, varlen_prefill
from nanoexp.kernels.triton_kv import store_kv
from nanoexp.kernels.triton_qk_norm_rope import qk_norm_rope_store


class TritonAttentionBackend(AttentionBackend):
    name = "triton"
    captures_mixed_steps = True
    # The fused q/k norm + RoPE + KV store; None = on CUDA only (the CPU interpreter is slower than torch)
    fuse_qk_norm_rope: bool | None = None
    store_kv = staticmethod(store_kv)

    def qk_norm_rope_store(
        self,
        qkv,
        positions,
        cos_sin,
        qk_norm,
        num_heads,
        num_kv_heads,
        k_cache,
        v_cache,
        slot_mapping,
        write_k,
        k_scale=None,
        v_scale=None,
    ):
        fuse = self.fuse_qk_norm_rope
        if not (qkv.is_cuda if fuse is None else fuse):
            return None
        q_weight, k_weight, eps = qk_norm or (None, None, 0.0)
        return qk_norm_rope_store(
            qkv,
            positions,
            cos_sin,
            q_weight,
            k_weight,
            eps,
            num_heads,
            num_kv_heads,
            k_cache,
            v_cache,
            slot_mapping,
            write_k,
            k_scale,
            v_scale,
        )

    def prefill(self, q, k, v, k_cache, v_cache, md, scale, k_scale=None, v_scale=None) -> torch.Tensor:
        if md.prefill_tiles is not None:  # a step graph's step without decodes
            return self.mixed(q, k, v, k_cache, v_cache, md, scale, k_scale, v_scale)
        num_seqs = md.cu_seqlens_q.shape[0] - 1
        if md.max_seqlen_q * num_seqs < q.shape[0]:
            raise ValueError(
                f"AttentionMetadata.max_seqlen_q={md.max_seqlen_q} is too small for "
                f"{q.shape[0]} tokens in {num_seqs} sequences"
            )
        if md.has_cached_prefix:
            return varlen_prefill(
                q,
                k_cache,
                v_cache,
                md.cu_seqlens_q,
                md.max_seqlen_q,
                md.context_lens,
                md.block_tables,
                scale,
                k_scale=k_scale,
                v_scale=v_scale,
            )
        return varlen_prefill(q, k, v, md.cu_seqlens_q, md.max_seqlen_q, None, None, scale)

    def mixed(self, q, k, v, k_cache, v_cache, md, scale, k_scale=None, v_scale=None) -> torch.Tensor:
        """With md.prefill_tiles (step graphs): decode then prefill kernel, fixed grids, one output."""
        if md.prefill_tiles is None:
            return super().mixed(q, k, v, k_cache, v_cache, md, scale, k_scale, v_scale)
        slots = md.decode_context_lens.shape[0]  # 0: a graph of steps without decodes
        out = torch.empty_like(q)
        if slots:  # the decode rows are copied in, not the whole step (as torch.cat would)
            out[:slots] = paged_decode(
                q[:slots],
                k_cache,
                v_cache,
                md.block_tables[:slots],
                md.decode_context_lens,
                scale,
                k_scale=k_scale,
                v_scale=v_scale,
            )
        return varlen_prefill(
            q,
            k_cache,
            v_cache,
            md.cu_seqlens_q,
            md.max_seqlen_q,
            md.context_lens,
            md.block_tables,
            scale,
            k_scale=k_scale,
            v_scale=v_scale,
            tiles=md.prefill_tiles,
            out=out,
        )

    def decode(self, q, k_cache, v_cache, md, scale, k_scale=None, v_scale=None) -> torch.Tensor:
        # The split count (by default) is a function of static shapes only: CUDA-graph capture stays valid.
        return paged_decode(
            q, k_cache, v_cache, md.block_tables, md.context_lens, scale, k_scale=k_scale, v_scale=v_scale
        )
