"""Triton kernel writing new K/V rows into the paged cache by slot mapping (fp8: kernels/base.py)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nanoexp.kernels.base import FP8_MAX, check_scales
from nanoexp.kernels.pdl import launch_options
from nanoexp.kernels.triton_pdl import wait_for_previous

_FP8_MAX = tl.constexpr(FP8_MAX)


@triton.jit
def _store_kv_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    k_scale_ptr,
    v_scale_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cb,
    stride_cp,
    stride_ch,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    KV_FP8: tl.constexpr,
    PDL: tl.constexpr = False,
):
    wait_for_previous(PDL)
    token = tl.program_id(0)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    if slot < 0:
        return
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    heads = tl.arange(0, HEADS_PAD)
    dims = tl.arange(0, DIM_PAD)
    mask = (heads[:, None] < NUM_KV_HEADS) & (dims[None, :] < HEAD_DIM)
    token64 = token.to(tl.int64)
    k = tl.load(k_ptr + token64 * stride_kt + heads[:, None] * stride_kh + dims[None, :], mask=mask)
    v = tl.load(v_ptr + token64 * stride_vt + heads[:, None] * stride_vh + dims[None, :], mask=mask)
    if KV_FP8:
        k = quantize_fp8(k, tl.load(k_scale_ptr), k_cache_ptr.dtype.element_ty)
        v = quantize_fp8(v, tl.load(v_scale_ptr), v_cache_ptr.dtype.element_ty)
    dst = block * stride_cb + offset * stride_cp + heads[:, None] * stride_ch + dims[None, :]
    tl.store(k_cache_ptr + dst, k, mask=mask)
    tl.store(v_cache_ptr + dst, v, mask=mask)


@triton.jit
def quantize_fp8(x, scale, dtype: tl.constexpr):
    """clamp(x / scale, +-448) rounded to e4m3 in fp32 (add and subtract 1.5 x 2^k, k putting the
    fp32 ulp at e4m3's for x's binade, at least the subnormal step 2^-9), so the final cast is exact:
    the same bits on the GPU and in the CPU interpreter, whose fp32 -> fp8 cast rounds wrongly."""
    x = tl.math.div_rn(x.to(tl.float32), scale)
    x = tl.minimum(tl.maximum(x, -_FP8_MAX), _FP8_MAX)
    bits = x.to(tl.int32, bitcast=True)
    exponent = tl.maximum((bits >> 23) & 0xFF, 127 - 6)
    magic = (((exponent + 20) << 23) | 0x400000).to(tl.float32, bitcast=True)
    a = (tl.abs(x) + magic) - magic
    sign = bits & -0x80000000  # copied bitwise: -0.0 stays -0.0, as in torch
    return (a.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True).to(dtype)


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """Copy k/v [tokens, kv_heads, head_dim] into the caches at slot_mapping (-1: skipped)."""
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    assert k.stride(-1) == 1 and v.stride(-1) == 1, "k/v need a contiguous last dim"
    assert k_cache.stride(-1) == 1 and k_cache.shape == v_cache.shape and k_cache.stride() == v_cache.stride()
    assert slot_mapping.is_contiguous()
    fp8 = check_scales(k_cache, k_scale, v_scale)
    _store_kv_kernel[(num_tokens,)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        k_scale if fp8 else slot_mapping,
        v_scale if fp8 else slot_mapping,  # unused unless KV_FP8
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        HEADS_PAD=triton.next_power_of_2(num_kv_heads),
        DIM_PAD=triton.next_power_of_2(head_dim),
        BLOCK_SIZE=k_cache.shape[1],
        KV_FP8=fp8,
        num_warps=4,
        **launch_options(),
    )
