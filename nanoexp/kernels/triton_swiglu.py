"""SwiGLU as one Triton kernel: [gate | up] -> silu(gate) * up, rounded as the torch ops round."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nanoexp.kernels.pdl import launch_options
from nanoexp.kernels.triton_pdl import wait_for_previous


@triton.jit
def swiglu_values(gate, up, DT: tl.constexpr):
    """silu(gate) * up in DT from fp32 operands, rounded as the torch ops round (returned in fp32)."""
    act = (gate * tl.sigmoid(gate)).to(DT).to(tl.float32)  # F.silu's output dtype, as eager torch
    return (act * up).to(DT).to(tl.float32)


@triton.jit
def _silu_and_mul_kernel(
    x_ptr, out_ptr, stride_x, stride_out, width, BLOCK: tl.constexpr, PDL: tl.constexpr = False
):
    """One row, BLOCK columns: out = silu(gate) * up for x's row = [gate | up]."""
    wait_for_previous(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < width
    DT = out_ptr.dtype.element_ty
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + width + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, swiglu_values(gate, up, DT).to(DT), mask=mask)


SWIGLU_BLOCK = 1024


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """[rows, 2 * width] -> [rows, width]. The torch.compile'd op it replaces ran at ~40% of copy
    bandwidth on a 16k-token prefill (experiments/nanovllm_bench/README.md, prefill step)."""
    rows, double = x.shape
    assert double % 2 == 0 and x.stride(1) == 1
    width = double // 2
    out = x.new_empty((rows, width))
    if rows == 0:
        return out
    _silu_and_mul_kernel[(rows, triton.cdiv(width, SWIGLU_BLOCK))](
        x,
        out,
        x.stride(0),
        out.stride(0),
        width,
        BLOCK=SWIGLU_BLOCK,
        num_warps=4,
        **launch_options(),
    )
    return out
