"""Pure-torch attention backend: the reference every other backend is tested against."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nanoexp.kernels.base import FP8_DTYPE, FP8_MAX, AttentionBackend, AttentionMetadata, check_scales


def quantize_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The fp8 cache's store rule (kernels/base.py): clamp(x / scale, +-448) as float8_e4m3fn."""
    return torch.clamp(x.float() / scale, -FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def readable(cache: torch.Tensor, scale: torch.Tensor | None, fp8: bool) -> torch.Tensor:
    """The cache (or a gather of it) in a dtype attention can read: dequantized when fp8."""
    return cache.float() * scale if fp8 else cache


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
        fp8 = check_scales(k_cache, k_scale, v_scale)
        out = torch.empty_like(q)
        cu_q = md.cu_seqlens_q.tolist()
        ctx = md.context_lens.tolist()
        for i in range(len(ctx)):
            rows = slice(cu_q[i], cu_q[i + 1])
            if md.has_cached_prefix:
                k_i, v_i = gather_context(k_cache, v_cache, md.block_tables[i], ctx[i])
                k_i, v_i = readable(k_i, k_scale, fp8).to(q.dtype), readable(v_i, v_scale, fp8).to(q.dtype)
            else:
                k_i, v_i = k[rows], v[rows]
            out[rows] = causal_attention(q[rows], k_i, v_i, scale)
        return out

    def decode(self, q, k_cache, v_cache, md: AttentionMetadata, scale: float, k_scale=None, v_scale=None):
        fp8 = check_scales(k_cache, k_scale, v_scale)
        num_seqs, _, head_dim = q.shape
        width = md.max_seqlen_k or md.block_tables.shape[1] * k_cache.shape[1]
        slots, mask = context_slots(md.block_tables, md.context_lens, k_cache.shape[1], width)
        k = readable(rows_at(k_cache, slots), k_scale, fp8).to(q.dtype).view(num_seqs, width, -1, head_dim)
        v = readable(rows_at(v_cache, slots), v_scale, fp8).to(q.dtype).view(num_seqs, width, -1, head_dim)
        out = F.scaled_dot_product_attention(
            q.unsqueeze(2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask[:, None, None, :],
            scale=scale, enable_gqa=True,
        )  # fmt: skip
        return out.squeeze(2)


def context_slots(block_tables, context_lens, block_size: int, width: int):
    """Flat cache slots of each sequence's first `width` positions, and the [num_seqs, width] mask of
    those in its context. Positions past it read its last token: a slot never written may hold NaN,
    which the mask alone would not keep out of the softmax or of P @ V."""
    positions = torch.arange(width, device=context_lens.device)[None, :]
    lens = context_lens.long()[:, None]
    read = torch.minimum(positions, (lens - 1).clamp(min=0))
    blocks = block_tables.long().gather(1, read // block_size)
    return (blocks * block_size + read % block_size).flatten(), positions < lens


def rows_at(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """The cache's rows [len(slots), kv_heads, head_dim] at flat slot indices (block * block_size +
    offset): one index_select (advanced indexing costs ~5x more)."""
    return cache.flatten(0, 1).index_select(0, slots)


def gather_context(k_cache, v_cache, block_table, length: int):
    """The first `length` cached K/V rows of one sequence, in position order."""
    blocks = block_table[: -(-length // k_cache.shape[1])].long()
    return k_cache[blocks].flatten(0, 1)[:length], v_cache[blocks].flatten(0, 1)[:length]


def causal_attention(q, k, v, scale: float):
    """q [Lq, H, D] attends to k/v [Lk, Hkv, D]; query j sits at position Lk - Lq + j."""
    lq, lk = q.shape[0], k.shape[0]
    q_pos = torch.arange(lk - lq, lk, device=q.device)
    mask = torch.arange(lk, device=q.device)[None, :] <= q_pos[:, None]
    q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    return out.transpose(0, 1)
