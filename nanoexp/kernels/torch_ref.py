"""Pure-torch attention backend: the reference every other backend is tested against."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nanoexp.kernels.base import FP8_DTYPE, FP8_MAX, AttentionBackend, AttentionMetadata, check_scales


def quantize_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The fp8 cache's store rule (kernels/base.py): clamp(x / scale, +-448) as float8_e4m3fn."""
    return torch.clamp(x.float() / scale, -FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def dequantize_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x.float() * scale


def readable(cache: torch.Tensor, scale: torch.Tensor | None, fp8: bool) -> torch.Tensor:
    """The cache (or a gather of it) in a dtype attention can read: dequantized when fp8."""
    return dequantize_fp8(cache, scale) if fp8 else cache


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

    def prefill(self, q, k, v, k_cache, v_cache, md: AttentionMetadata, scale: float,
                k_scale=None, v_scale=None):
        fp8 = check_scales(k_cache, k_scale, v_scale)
        out = torch.empty_like(q)
        cu_q = md.cu_seqlens_q.tolist()
        ctx = md.context_lens.tolist()
        for i in range(len(ctx)):
            q_i = q[cu_q[i] : cu_q[i + 1]]
            if md.has_cached_prefix:
                k_i, v_i = gather_context(k_cache, v_cache, md.block_tables[i], ctx[i])
                k_i, v_i = readable(k_i, k_scale, fp8).to(q.dtype), readable(v_i, v_scale, fp8).to(q.dtype)
            else:
                k_i, v_i = k[cu_q[i] : cu_q[i + 1]], v[cu_q[i] : cu_q[i + 1]]
            out[cu_q[i] : cu_q[i + 1]] = causal_attention(q_i, k_i, v_i, scale)
        return out

    def decode(self, q, k_cache, v_cache, md: AttentionMetadata, scale: float, k_scale=None, v_scale=None):
        fp8 = check_scales(k_cache, k_scale, v_scale)
        num_seqs, _, head_dim = q.shape
        block_size = k_cache.shape[1]
        max_len = md.block_tables.shape[1] * block_size
        positions = torch.arange(max_len, device=q.device)
        mask = positions[None, :] < md.context_lens[:, None].to(positions.dtype)  # [B, L]
        valid = mask[:, :, None, None]  # slots past the context may hold stale bytes, even NaN
        k = readable(k_cache[md.block_tables], k_scale, fp8).to(q.dtype)
        v = readable(v_cache[md.block_tables], v_scale, fp8).to(q.dtype)
        k = k.reshape(num_seqs, max_len, -1, head_dim).where(valid, 0)
        v = v.reshape(num_seqs, max_len, -1, head_dim).where(valid, 0)
        out = F.scaled_dot_product_attention(
            q.unsqueeze(2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask[:, None, None, :],
            scale=scale, enable_gqa=True,
        )
        return out.squeeze(2)


def gather_context(k_cache, v_cache, block_table, length: int):
    """The first `length` cached K/V rows of one sequence, in position order."""
    block_size = k_cache.shape[1]
    blocks = block_table[: (length + block_size - 1) // block_size].long()
    k = k_cache[blocks].flatten(0, 1)[:length]
    v = v_cache[blocks].flatten(0, 1)[:length]
    return k, v


def causal_attention(q, k, v, scale: float):
    """q [Lq, H, D] attends to k/v [Lk, Hkv, D]; query j sits at position Lk - Lq + j."""
    lq = q.shape[0]
    lk = k.shape[0]
    k, v = k.transpose(0, 1), v.transpose(0, 1)
    q_pos = torch.arange(lk - lq, lk, device=q.device)
    mask = torch.arange(lk, device=q.device)[None, :] <= q_pos[:, None]
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k, v, attn_mask=mask, scale=scale, enable_gqa=True
    )
    return out.transpose(0, 1)
