"""One Triton kernel from the qkv projection to attention inputs: per-head RMSNorm of q and k
(Qwen3; skipped for Qwen2), NeoX RoPE, q written out, roped k and raw v stored in the paged cache.
Rounds as the torch ops it replaces (`qk_norm_rope` / `apply_rope`, then `store_kv`) round."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nanoexp.kernels.base import check_scales
from nanoexp.kernels.pdl import launch_options
from nanoexp.kernels.triton_kv import quantize_fp8
from nanoexp.kernels.triton_pdl import wait_for_previous
from nanoexp.kernels.triton_splits import sum_combine


@triton.jit
def _norm_heads(x, w, rstd, DT: tl.constexpr):
    """layers/norm.rms_norm: (x * rstd) cast to the model dtype, times the weight, in the model dtype."""
    return ((x * rstd[:, None]).to(DT).to(tl.float32) * w.to(tl.float32)).to(DT).to(tl.float32)


@triton.jit
def _head_weight(q_weight_ptr, k_weight_ptr, is_q, offsets, mask):
    q_weight = tl.load(q_weight_ptr + offsets, mask=mask)
    return tl.where(is_q, q_weight, tl.load(k_weight_ptr + offsets, mask=mask))


@triton.jit
def _store_cache(cache_ptr, offsets, x, scale_ptr, mask, FP8: tl.constexpr):
    if FP8:
        x = quantize_fp8(x, tl.load(scale_ptr), cache_ptr.dtype.element_ty)
    tl.store(cache_ptr + offsets, x.to(cache_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _qk_norm_rope_store_kernel(
    qkv_ptr,
    positions_ptr,
    cos_sin_ptr,
    q_weight_ptr,
    k_weight_ptr,
    q_out_ptr,
    k_out_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    k_scale_ptr,
    v_scale_ptr,
    eps,
    stride_qkv,
    stride_cos,
    stride_cb,
    stride_cp,
    stride_ch,
    stride_vb,
    stride_vp,
    stride_vh,
    stride_vd,
    NUM_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HALF_PAD: tl.constexpr,
    HEADS_BLOCK: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    NORM: tl.constexpr,
    WRITE_K: tl.constexpr,
    FP8: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """One token, HEADS_BLOCK heads of the combined [q heads, k heads] range of its qkv row, each head as
    its two halves (NeoX RoPE rotates element i with element i + HEAD_DIM / 2): no element loaded twice
    (the whole head and its rotated copy were: 25.8 -> 21.8 us at 4,096 tokens on an H200, 4.6 -> 3.6 at
    512, 2.1 -> 2.0 at 16)."""
    wait_for_previous(PDL)
    HALF: tl.constexpr = HEAD_DIM // 2
    token = tl.program_id(0).to(tl.int64)
    heads = (tl.program_id(1) * HEADS_BLOCK + tl.arange(0, HEADS_BLOCK))[:, None]
    half = tl.arange(0, HALF_PAD)[None, :]
    in_half = half < HALF
    mask = (heads < NUM_HEADS + NUM_KV_HEADS) & in_half
    DT = q_out_ptr.dtype.element_ty

    row = qkv_ptr + token * stride_qkv + heads * HEAD_DIM
    x1 = tl.load(row + half, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(row + HALF + half, mask=mask, other=0.0).to(tl.float32)
    if NORM:
        is_q = heads < NUM_HEADS
        w1 = _head_weight(q_weight_ptr, k_weight_ptr, is_q, half, in_half)
        w2 = _head_weight(q_weight_ptr, k_weight_ptr, is_q, HALF + half, in_half)
        squares = tl.reduce(x1 * x1, 1, sum_combine) + tl.reduce(x2 * x2, 1, sum_combine)
        rstd = tl.math.rsqrt(squares / HEAD_DIM + eps)
        x1, x2 = _norm_heads(x1, w1, rstd, DT), _norm_heads(x2, w2, rstd, DT)

    pos = tl.load(positions_ptr + token).to(tl.int64)
    cos = tl.load(cos_sin_ptr + pos * stride_cos + half, mask=in_half, other=0.0)
    sin = tl.load(cos_sin_ptr + pos * stride_cos + HALF + half, mask=in_half, other=0.0)
    roped1 = (x1 * cos - x2 * sin).to(DT)
    roped2 = (x2 * cos + x1 * sin).to(DT)

    q_mask = mask & (heads < NUM_HEADS)
    q_dst = q_out_ptr + token * NUM_HEADS * HEAD_DIM + heads * HEAD_DIM + half
    tl.store(q_dst, roped1, mask=q_mask)
    tl.store(q_dst + HALF, roped2, mask=q_mask)

    kv_heads = heads - NUM_HEADS
    k_mask = mask & (kv_heads >= 0)
    if WRITE_K:
        k_dst = k_out_ptr + token * NUM_KV_HEADS * HEAD_DIM + kv_heads * HEAD_DIM + half
        tl.store(k_dst, roped1, mask=k_mask)
        tl.store(k_dst + HALF, roped2, mask=k_mask)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    store_mask = k_mask & (slot >= 0)
    slot = tl.maximum(slot, 0)
    block, offset = slot // BLOCK_SIZE, slot % BLOCK_SIZE
    k_dst = block * stride_cb + offset * stride_cp + kv_heads * stride_ch + half
    _store_cache(k_cache_ptr, k_dst, roped1, k_scale_ptr, store_mask, FP8)
    _store_cache(k_cache_ptr, k_dst + HALF, roped2, k_scale_ptr, store_mask, FP8)
    v_row = row + NUM_KV_HEADS * HEAD_DIM + half
    v_dst = block * stride_vb + offset * stride_vp + kv_heads * stride_vh + half * stride_vd
    v1 = tl.load(v_row, mask=store_mask, other=0.0)
    v2 = tl.load(v_row + HALF, mask=store_mask, other=0.0)
    _store_cache(v_cache_ptr, v_dst, v1, v_scale_ptr, store_mask, FP8)
    _store_cache(v_cache_ptr, v_dst + HALF * stride_vd, v2, v_scale_ptr, store_mask, FP8)


def qk_norm_rope_store(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos_sin: torch.Tensor,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None,
    eps: float,
    num_heads: int,
    num_kv_heads: int,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    write_k: bool = False,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    heads_block: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """qkv [T, (H + 2 Hkv) * D] -> (q [T, H, D], roped k [T, Hkv, D] if write_k else None); k and
    raw v stored at slot_mapping (-1: not). cos_sin: [max_pos, D] fp32, cos halves then sin halves."""
    num_tokens, width = qkv.shape
    head_dim = cos_sin.shape[1]
    assert width == (num_heads + 2 * num_kv_heads) * head_dim and head_dim % 2 == 0
    assert qkv.stride(1) == 1 and cos_sin.dtype == torch.float32 and cos_sin.stride(1) == 1
    assert k_cache.stride(-1) == 1 and k_cache.shape == v_cache.shape  # V: own strides (kernels/base.py)
    assert k_cache.shape[2:] == (num_kv_heads, head_dim) and slot_mapping.is_contiguous()
    norm = q_weight is not None
    assert q_weight is None or (
        k_weight is not None
        and q_weight.dtype == k_weight.dtype == qkv.dtype
        and q_weight.shape == (head_dim,)
    )
    fp8 = check_scales(k_cache, k_scale, v_scale)
    assert fp8 or k_cache.dtype == qkv.dtype, f"cache dtype {k_cache.dtype} != model dtype {qkv.dtype}"
    q = qkv.new_empty((num_tokens, num_heads, head_dim))
    k = qkv.new_empty((num_tokens, num_kv_heads, head_dim)) if write_k else None
    if num_tokens == 0:
        return q, k
    total = num_heads + num_kv_heads
    # few heads per program while tokens are few (one token spread over many SMs), more later
    want = 1 if num_tokens <= 16 else 2 if num_tokens <= 64 else 8
    heads_block = heads_block or min(want, triton.next_power_of_2(total))
    _qk_norm_rope_store_kernel[(num_tokens, triton.cdiv(total, heads_block))](
        qkv,
        positions,
        cos_sin,
        q_weight if norm else cos_sin,
        k_weight if norm else cos_sin,
        q,
        k if write_k else q,
        k_cache,
        v_cache,
        slot_mapping,
        k_scale if fp8 else cos_sin,
        v_scale if fp8 else cos_sin,
        eps,
        qkv.stride(0),
        cos_sin.stride(0),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        *v_cache.stride(),
        NUM_HEADS=num_heads,
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        HALF_PAD=triton.next_power_of_2(head_dim // 2),
        HEADS_BLOCK=heads_block,
        BLOCK_SIZE=k_cache.shape[1],
        NORM=norm,
        WRITE_K=write_k,
        FP8=fp8,
        num_warps=1 if heads_block <= 2 else 4,
        **launch_options(),
    )
    return q, k
