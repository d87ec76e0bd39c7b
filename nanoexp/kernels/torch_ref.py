"""Pure-torch attention backend: the reference every other backend is tested against."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nanoexp.kernels.base import FP8_DTYPE, FP8_MAX, AttentionBackend, AttentionMetadata, check_scales


def quantize_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The fp8 cache's store rule (kernels/base.py): clamp(x / scale, +-448) as float8_e4m3fn."""
    return torch.clamp(x.float() / scale, -FP8_MAX, FP8_MAX).to(FP8_DTYPE)


class TorchAttentionBackend(AttentionBackend):
    name = "torch"

    def store_kv(self, k, v, k_cache, v_cache, slot_mapping, k_scale=None, v_scale=None) -> None:
        if check_scales(k_cache, k_scale, v_scale):
            k, v = quantize_fp8(k, k_scale), quantize_fp8(v, v_scale)
        keep = slot_mapping >= 0
        slots = slot_mapping[keep]
        blocks, offsets = slots // k_cache.shape[1], slots % k_cache.shape[1]
        k_cache[blocks, offsets] = k[keep]
        v_cache[blocks, offsets] = v[keep]

    def prefill(
        self, q, k, v, k_cache, v_cache, md: AttentionMetadata, scale: float, k_scale=None, v_scale=None
    ):
        out = torch.empty_like(q)
        assert md.cu_seqlens_q is not None  # set for every step with prefill tokens
        cu_q = md.cu_seqlens_q.tolist()
        ctx = md.context_lens.tolist()
        if md.has_cached_prefix:  # k, v: each sequence's context, read from the cache
            k, v, _ = cached_context(k_cache, v_cache, md, max(ctx), k_scale, v_scale, q.dtype)
        for i in range(len(ctx)):
            rows = slice(cu_q[i], cu_q[i + 1])
            k_i, v_i = (k[i, : ctx[i]], v[i, : ctx[i]]) if md.has_cached_prefix else (k[rows], v[rows])
            out[rows] = causal_attention(q[rows], k_i, v_i, scale)
        return out

    def decode(self, q, k_cache, v_cache, md: AttentionMetadata, scale: float, k_scale=None, v_scale=None):
        width = md.max_seqlen_k or md.block_tables.shape[1] * k_cache.shape[1]
        k, v, mask = cached_context(k_cache, v_cache, md, width, k_scale, v_scale, q.dtype)
        out = F.scaled_dot_product_attention(
            q.unsqueeze(2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            attn_mask=mask[:, None, None, :],
            scale=scale,
            enable_gqa=True,
        )
        return out.squeeze(2)


def cached_context(k_cache, v_cache, md: AttentionMetadata, width: int, k_scale, v_scale, dtype: torch.dtype):
    """Each sequence's first `width` cached K/V rows ([seqs, width, kv_heads, head_dim] in `dtype`,
    dequantized when fp8) and the [seqs, width] mask of those in its context. Positions past it read its
    last token: a slot never written may hold NaN, which the mask alone would not keep out of the
    softmax or of P @ V."""
    fp8 = check_scales(k_cache, k_scale, v_scale)
    block_size = k_cache.shape[1]
    positions = torch.arange(width, device=md.context_lens.device)[None, :]
    lens = md.context_lens.long()[:, None]
    read = torch.minimum(positions, (lens - 1).clamp(min=0))
    slots = md.block_tables.long().gather(1, read // block_size) * block_size + read % block_size
    # one index_select per cache (advanced indexing costs ~5x more)
    k, v = (cache.flatten(0, 1).index_select(0, slots.flatten()) for cache in (k_cache, v_cache))
    if fp8:
        k, v = k.float() * k_scale, v.float() * v_scale
    shape = (*slots.shape, *k_cache.shape[2:])
    return k.to(dtype).view(shape), v.to(dtype).view(shape), positions < lens


def causal_attention(q, k, v, scale: float):
    """q [Lq, H, D] attends to k/v [Lk, Hkv, D]; query j sits at position Lk - Lq + j."""
    lq, lk = q.shape[0], k.shape[0]
    q_pos = torch.arange(lk - lq, lk, device=q.device)
    mask = torch.arange(lk, device=q.device)[None, :] <= q_pos[:, None]
    q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    return out.transpose(0, 1)
