"""Prefill-sized fp8 linear layers on cuBLAS's block-scaled fp8 GEMM (`torch.nn.functional.scaled_mm`,
1 x 128 activation blocks times 128 x 128 weight blocks: the W8A8 arithmetic of kernels/fp8_reference.py,
CUDA 12.9+ on Hopper), the activations quantized by the Triton kernel, and one row of a wide layer; the
other decode-sized ones, and layouts it cannot take (scale rows per output row, a shard at an offset inside
its blocks), on kernels/triton_fp8.py.
Used only where a one-time check against the reference passes (`blockwise_scaled_mm_works`)."""

from __future__ import annotations

import functools
import logging

import torch
import torch.nn.functional as F

from nanoexp.kernels import triton_fp8
from nanoexp.kernels.fp8_reference import (
    BLOCK,
    ActivationFormat,
    Fp8Layout,
    QuantizedActivation,
    quantize_weight,
    w8a8_reference,
)
from nanoexp.kernels.triton_fp8 import fp8_linear, quantize_activation

log = logging.getLogger(__name__)
MIN_ROWS = 65  # below, the Triton kernels (decode-sized steps run in CUDA graphs on them), except:
# one row of a wide layer (triton_fp8.GEMV_MAX_N outputs or more: qkv_proj, gate_up_proj), padded to 16
# rows. H100, Qwen3-8B, kernel_bench --gemv: qkv_proj 13.5 us against the Triton kernel's 18.2, gate_up_proj
# 41.8 against 45.4; the narrower layers keep the GEMV (o_proj 10.6 against cuBLAS's 13.4, down 25.3 / 27.2).
WIDE_ONE_ROW = True
ROW_MULTIPLE = 16  # cuBLAS rejects M-major activation scales of other row counts (M = 65 on an H100)


def takes(layout: Fp8Layout, rows: int, dtype: torch.dtype, amax) -> bool:
    aligned = layout.row_block == BLOCK and layout.k_offset == 0 and layout.k_local % BLOCK == 0
    # the weight scales' rows are read with a leading dimension of K / 128, a multiple of 4 (16 bytes)
    shaped = layout.n % BLOCK == 0 and layout.k_blocks % 4 == 0
    wide_row = WIDE_ONE_ROW and rows == 1 and layout.n >= triton_fp8.GEMV_MAX_N
    sized = rows >= MIN_ROWS or wide_row
    return sized and aligned and shaped and dtype == torch.bfloat16 and amax is None


def activation_format(layout: Fp8Layout, tokens: int, dtype: torch.dtype) -> ActivationFormat:
    """What cublas_fp8_linear reads for `tokens` rows: M-major scales, rows padded to ROW_MULTIPLE, where
    cuBLAS takes them; else the Triton kernels' format."""
    if takes(layout, tokens, dtype, None):
        return ActivationFormat(layout, -(-tokens // ROW_MULTIPLE) * ROW_MULTIPLE, m_major=True)
    return triton_fp8.activation_format(layout, tokens, dtype)


def cublas_fp8_linear(
    x: torch.Tensor | QuantizedActivation,
    weight: torch.Tensor,
    scale: torch.Tensor,
    layout: Fp8Layout,
    bias: torch.Tensor | None = None,
    amax: torch.Tensor | None = None,
) -> torch.Tensor:
    """triton_fp8.fp8_linear's result; prefill-sized bf16 rows through cuBLAS (x quantized here, or by its
    producer in activation_format's layout)."""
    tokens = x.tokens if isinstance(x, QuantizedActivation) else x.shape[:-1].numel()
    if not takes(layout, tokens, x.dtype, amax):
        return fp8_linear(x, weight, scale, layout, bias, amax)
    if isinstance(x, QuantizedActivation):
        if x.fmt != activation_format(layout, tokens, x.dtype):  # not this GEMM's layout: the Triton one
            return fp8_linear(x, weight, scale, layout, bias)
        xq, xs, dtype, lead = x.q, x.scales, x.dtype, x.shape[:-1]
    else:
        lead, dtype = x.shape[:-1], x.dtype
        x2 = x.reshape(-1, layout.k_local)
        x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
        rows = activation_format(layout, tokens, x.dtype).rows
        xq, xs = quantize_activation(x2, layout, scales_m_major=True, rows=rows)
    y = scaled_mm(xq, weight, xs, scale, dtype)[:tokens]
    if bias is not None:
        y = y + bias
    return y.view(*lead, layout.n)


def scaled_mm(
    xq: torch.Tensor, weight: torch.Tensor, xs: torch.Tensor, scale: torch.Tensor, dtype
) -> torch.Tensor:
    """xq [M, K] e4m3 with M-major scales [M, K/128] @ weight [N, K]^T with scales [N/128, K/128]."""
    blockwise = F.ScalingType
    return F.scaled_mm(
        xq,
        weight.t(),
        xs,
        blockwise.BlockWise1x128,
        scale.t(),
        blockwise.BlockWise128x128,
        swizzle_a=F.SwizzleType.NO_SWIZZLE,
        swizzle_b=F.SwizzleType.NO_SWIZZLE,
        output_dtype=dtype,
    )


@functools.lru_cache(maxsize=8)
def blockwise_scaled_mm_works(device: torch.device) -> bool:
    """One check on `device`: cuBLAS's block-scaled GEMM runs, replays in a CUDA graph and matches the
    reference (to bf16 rounding)."""
    if device.type != "cuda" or not hasattr(F, "scaled_mm") or not hasattr(F, "ScalingType"):
        return False
    try:
        gen = torch.Generator(device=device).manual_seed(0)
        layout = Fp8Layout(256, 512, 0, BLOCK)
        q, s = quantize_weight(torch.randn(256, 512, device=device, generator=gen) * 0.05)
        x = torch.randn(MIN_ROWS, 512, device=device, generator=gen).bfloat16()  # a row count cuBLAS pads
        cublas_fp8_linear(x, q, s, layout)  # first call outside the capture, as the engine's warm-up
        graph = torch.cuda.CUDAGraph()  # prefill-sized steps run in step graphs too
        with torch.cuda.graph(graph):
            got = cublas_fp8_linear(x, q, s, layout)
        graph.replay()
        torch.cuda.synchronize(device)
        want = w8a8_reference(x, q, s, layout).float()
        err = ((got.float() - want).abs().max() / want.abs().max()).item()
    except Exception as exc:  # noqa: BLE001 - any failure means "not here"
        log.info("fp8 prefill GEMM: cuBLAS block-scaled GEMM unavailable (%s); Triton's", exc)
        return False
    if err > 2e-2:
        log.warning("fp8 prefill GEMM: cuBLAS block-scaled GEMM off by %.2g of the reference; Triton's", err)
    return err <= 2e-2
