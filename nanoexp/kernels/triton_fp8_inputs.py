"""The producers of an fp8 linear layer's input that emit it quantized: add + RMSNorm (before qkv_proj and
gate_up_proj) and SwiGLU (before down_proj) write e4m3 values and per-token 128-group scales in the layout
the consumer's GEMM reads (kernels/fp8_reference.ActivationFormat), so no quantization launch runs between
them. Their arithmetic is the unfused pair's: the producer's output rounded to the model dtype as the
unfused op rounds it (layers/norm.py, kernels/triton_swiglu.py), then fp8_reference.quantize_activation.
Float32 inputs divide with IEEE rounding as torch does (triton_fp8.divide), so their codes and scales are
the reference's bit for bit; half-precision inputs use Triton's faster division. M is not specialized; the
variants (residual or not, row-major or M-major scales) are compiled by the warm-up prefills and graph
captures."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nanoexp.kernels.fp8_reference import ACT_EPS, FP8_MAX, ActivationFormat, QuantizedActivation
from nanoexp.kernels.pdl import launch_options
from nanoexp.kernels.triton_fp8 import groups_per_program, quantized_buffers, store_quantized
from nanoexp.kernels.triton_pdl import wait_for_previous
from nanoexp.kernels.triton_swiglu import swiglu_values


@triton.jit(do_not_specialize=["M"])
def _add_rms_norm_quant_kernel(
    x_ptr,
    res_ptr,
    norm_w_ptr,
    sum_ptr,
    q_ptr,
    s_ptr,
    M,
    K,
    KB,
    stride_x,
    stride_res,
    stride_sum,
    stride_qm,
    stride_sm,
    stride_sg,
    norm_eps,
    eps,
    fp8_max,
    KB_POW2: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    IEEE: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    """One program per output row (rows past M: zeros): v = x (+ residual, stored in x's dtype), the row's
    RMSNorm in x's dtype as layers/norm.py rounds it, quantized per 128-group."""
    wait_for_previous(PDL)
    row = tl.program_id(0).to(tl.int64)
    live = row < M
    cols = tl.arange(0, KB_POW2 * 128)
    mask = (cols < K) & live
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    v = x.to(tl.float32)
    if HAS_RESIDUAL:
        v += tl.load(res_ptr + row * stride_res + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(sum_ptr + row * stride_sum + cols, v.to(x.dtype), mask=mask)
    rstd = tl.rsqrt(tl.sum(v * v, axis=0) / K + norm_eps)
    g = tl.load(norm_w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    normed = (g * (v * rstd).to(x.dtype).to(tl.float32)).to(x.dtype).to(tl.float32)
    groups = tl.reshape(normed, [KB_POW2, 128])
    store_quantized(
        groups,
        tl.max(tl.abs(groups), axis=1),
        live,
        row,
        tl.arange(0, KB_POW2),
        KB,
        q_ptr,
        s_ptr,
        stride_qm,
        stride_sm,
        stride_sg,
        eps,
        fp8_max,
        IEEE,
    )


@triton.jit(do_not_specialize=["M"])
def _silu_and_mul_quant_kernel(
    x_ptr,
    q_ptr,
    s_ptr,
    M,
    width,
    KB,
    stride_x,
    stride_qm,
    stride_sm,
    stride_sg,
    eps,
    fp8_max,
    GROUPS: tl.constexpr,
    IEEE: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    """One output row (rows past M: zeros) and GROUPS 128-groups: silu(gate) * up of x's row = [gate | up],
    rounded as kernels/triton_swiglu.py rounds it, quantized per group."""
    wait_for_previous(PDL)
    row = tl.program_id(0).to(tl.int64)
    live = row < M
    groups = tl.program_id(1) * GROUPS + tl.arange(0, GROUPS)
    cols = groups[:, None] * 128 + tl.arange(0, 128)[None, :]
    mask = (cols < width) & live
    DT = x_ptr.dtype.element_ty
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + width + cols, mask=mask, other=0.0).to(tl.float32)
    act = swiglu_values(gate, up, DT)
    amax = tl.max(tl.abs(act), axis=1)
    store_quantized(
        act, amax, live, row, groups, KB, q_ptr, s_ptr, stride_qm, stride_sm, stride_sg, eps, fp8_max, IEEE
    )


def _check(x: torch.Tensor, k: int, fmt: ActivationFormat) -> None:
    layout = fmt.layout
    assert x.dim() == 2 and x.stride(1) == 1 and fmt.rows >= x.shape[0], (x.shape, fmt)
    assert layout.k_offset == 0 and layout.k_local == k, (
        "a producer quantizes whole groups of its own",
        layout,
    )


def rms_norm_quantized(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    fmt: ActivationFormat,
) -> tuple[QuantizedActivation, torch.Tensor]:
    """(RMSNorm(x + residual) * weight quantized in `fmt`, x + residual) for x [M, K]; residual None:
    RMSNorm(x), and x is returned as the residual (as layers/norm.RMSNorm)."""
    m, k = x.shape
    _check(x, k, fmt)
    assert weight.dtype == x.dtype and (residual is None or residual.shape == x.shape)
    layout = fmt.layout
    q, s = quantized_buffers(fmt, x.device)
    summed = x if residual is None else torch.empty_like(x)
    if residual is not None and residual.stride(1) != 1:
        residual = residual.contiguous()
    if fmt.rows:
        kb_pow2 = triton.next_power_of_2(layout.k_blocks)
        _add_rms_norm_quant_kernel[(fmt.rows,)](
            x,
            x if residual is None else residual,
            weight,
            summed,
            q,
            s,
            m,
            k,
            layout.k_blocks,
            x.stride(0),
            x.stride(0) if residual is None else residual.stride(0),
            summed.stride(0),
            q.stride(0),
            s.stride(0),
            s.stride(1),
            eps,
            ACT_EPS,
            FP8_MAX,
            KB_POW2=kb_pow2,
            HAS_RESIDUAL=residual is not None,
            IEEE=x.dtype == torch.float32,
            num_warps=min(16, max(4, kb_pow2 // 2)),
            **launch_options(),
        )
    return QuantizedActivation(q, s, fmt, x.dtype, (m, k)), summed


def silu_and_mul_quantized(x: torch.Tensor, fmt: ActivationFormat) -> QuantizedActivation:
    """silu(gate) * up of x [M, 2 * width] = [gate | up], quantized in `fmt` (its layout's K is width)."""
    m, double = x.shape
    width = double // 2
    _check(x, width, fmt)
    layout = fmt.layout
    q, s = quantized_buffers(fmt, x.device)
    groups = groups_per_program(layout)
    if fmt.rows:
        _silu_and_mul_quant_kernel[(fmt.rows, triton.cdiv(layout.k_blocks, groups))](
            x,
            q,
            s,
            m,
            width,
            layout.k_blocks,
            x.stride(0),
            q.stride(0),
            s.stride(0),
            s.stride(1),
            ACT_EPS,
            FP8_MAX,
            GROUPS=groups,
            IEEE=x.dtype == torch.float32,
            num_warps=4,
            **launch_options(),
        )
    return QuantizedActivation(q, s, fmt, x.dtype, (m, width))
