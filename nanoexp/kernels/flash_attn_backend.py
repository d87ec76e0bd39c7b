"""Attention backend on the `flash_attn` package (CUDA, fp16/bf16, paged KV in blocks of 256*k, no fp8).

Prefill: `flash_attn_varlen_func` (split-KV kernels with `block_table` after a cached prefix, else
plain forward); decode: `flash_attn_with_kvcache`. flash-attn drops the causal mask for a single
query, so causal and non-causal kernels are used: experiments/kernels/build_flash_attn.sh's lean
build keeps exactly these, for head dim 128."""

from __future__ import annotations

import importlib.util

import torch

from nanoexp.config.checks import KnobError
from nanoexp.kernels.base import AttentionBackend

FLASH_ATTN_PAGE_MULTIPLE = 256


def flash_attn_available() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


class FlashAttnBackend(AttentionBackend):
    name = "flash_attn"

    def __init__(self, block_size: int, kv_cache_dtype: str = "auto", device: torch.device | None = None):
        """Refuses what flash-attn cannot serve: an fp8 cache, a CPU `device`, pages not of 256*k."""
        page = FLASH_ATTN_PAGE_MULTIPLE
        refusals = [
            (
                kv_cache_dtype != "auto",
                f"does not support kv_cache_dtype={kv_cache_dtype!r}; use "
                "attention_backend='triton' (or 'auto') or kv_cache_dtype='auto'",
            ),
            (
                device is not None and device.type != "cuda",
                f"needs a CUDA device, got {device}; use 'torch' or 'auto'",
            ),
            (not flash_attn_available(), "needs the flash_attn package; use 'triton' or 'auto'"),
            (
                block_size % page != 0,
                f"needs kv_block_size divisible by {page} (paged KV in "
                f"flash-attn), got {block_size}; use attention_backend='triton' for other block sizes",
            ),
        ]
        for refused, why in refusals:
            if refused:
                raise KnobError("engine.attention_backend", "flash_attn", "torch, triton or auto", why)

    def store_kv(self, k, v, k_cache, v_cache, slot_mapping, k_scale=None, v_scale=None) -> None:
        from nanoexp.kernels.triton_kv import store_kv

        store_kv(k, v, k_cache, v_cache, slot_mapping)

    def prefill(self, q, k, v, k_cache, v_cache, md, scale, k_scale=None, v_scale=None) -> torch.Tensor:
        from flash_attn import flash_attn_varlen_func

        if not md.has_cached_prefix:
            return flash_attn_varlen_func(
                q,
                k,
                v,
                md.cu_seqlens_q,
                md.cu_seqlens_q,
                md.max_seqlen_q,
                md.max_seqlen_q,
                softmax_scale=scale,
                causal=True,
            )
        max_k = md.max_seqlen_k or int(md.context_lens.max())
        # flash-attn aligns the causal mask bottom-right, i.e. query j sits at ctx - q_len + j.
        return flash_attn_varlen_func(
            q,
            k_cache,
            v_cache,
            md.cu_seqlens_q,
            md.cu_seqlens_k,
            md.max_seqlen_q,
            max_k,
            softmax_scale=scale,
            causal=True,
            block_table=md.block_tables,
        )

    def decode(self, q, k_cache, v_cache, md, scale, k_scale=None, v_scale=None) -> torch.Tensor:
        from flash_attn import flash_attn_with_kvcache

        out = flash_attn_with_kvcache(
            q.unsqueeze(1),
            k_cache,
            v_cache,
            cache_seqlens=md.context_lens,
            block_table=md.block_tables,
            softmax_scale=scale,
            causal=True,
        )
        return out.squeeze(1)
