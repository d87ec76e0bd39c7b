"""GEMV for decode at a few rows: y[M, N] = x[M, K] @ w[N, K]^T (+ bias), M of 1 to MAX_ROWS.

Each program loads its whole weight tile (BLOCK_N x K_TILE) into registers before reading x, so the
weight bytes are in flight while x is loaded and normed; fp32 FMAs. Small tiles keep several
programs per SM, where the tensor-core kernel (triton_gemm.py) reached ~1.2 TB/s at one row
(experiments/kernels/README.md, "The GEMV for 1-2 rows"). Longer K is split; the last program of a
column tile (an atomic ticket) sums the fp32 partials. Rounds as triton_gemm.py does."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from nanoexp.kernels.base import NormFirst, num_sms
from nanoexp.kernels.pdl import launch_options
from nanoexp.kernels.triton_pdl import wait_for_previous

MAX_ROWS = 4  # the kernel's limit
# Up to where skinny_gemm takes this kernel, on an H200 vs the tensor-core kernel: at 1-2 rows it wins
# every Qwen3-0.6B shape (norm + gate/up + SwiGLU 11.1 -> 6.4 us at one row), at 4 it loses (12.1 ->
# 16.4 us: each row is a dependent pass of loads and reductions; experiments/kernels/runs/gemv_*.md).
AUTO_ROWS = 2
MAX_K_TILE = 1024


@dataclass(frozen=True)
class GemvConfig:
    block_n: int
    k_tile: int
    num_warps: int = 4


@triton.jit
def _row_rstd(x_row, r_row, sum_row, write_sum, K, eps, HAS_RESIDUAL: tl.constexpr, K_TILE: tl.constexpr):
    """1 / rms of one row of x (+ residual), fp32; writes x + residual to sum_row when write_sum."""
    squares = tl.full([K_TILE], 0.0, tl.float32)
    for k0 in range(0, K, K_TILE):
        kk = k0 + tl.arange(0, K_TILE)
        x = tl.load(x_row + kk, mask=kk < K, other=0.0)
        v = x.to(tl.float32)
        if HAS_RESIDUAL:
            v += tl.load(r_row + kk, mask=kk < K, other=0.0).to(tl.float32)
            if write_sum:
                tl.store(sum_row + kk, v.to(x.dtype), mask=kk < K)
        squares += v * v
    return tl.rsqrt(tl.sum(squares, axis=0) / K + eps)


@triton.jit
def _input_chunk(
    x_row,
    r_row,
    sum_row,
    norm_w_ptr,
    write_sum,
    kk,
    k_mask,
    K,
    eps,
    NORM: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    K_TILE: tl.constexpr,
):
    """This program's inputs of one row; NORM: RMS-normed, rounded as the unfused ops round."""
    x = tl.load(x_row + kk, mask=k_mask, other=0.0)
    if NORM:
        rstd = _row_rstd(x_row, r_row, sum_row, write_sum, K, eps, HAS_RESIDUAL, K_TILE)
        v = x.to(tl.float32)
        if HAS_RESIDUAL:
            v += tl.load(r_row + kk, mask=k_mask, other=0.0).to(tl.float32)
        g = tl.load(norm_w_ptr + kk, mask=k_mask, other=0.0).to(tl.float32)
        x = ((v * rstd).to(x.dtype).to(tl.float32) * g).to(x.dtype)
    return x.to(tl.float32)


@triton.jit
def _split_input_chunk(x_row, r_row, sum_row, norm_w_ptr, write_sum, kk, k_mask, HAS_RESIDUAL: tl.constexpr):
    """Split K, norm first: (x + residual) * norm_w of this slice (1 / rms is applied once the
    splits' sums are in) and its sum of squares; writes x + residual when write_sum."""
    x = tl.load(x_row + kk, mask=k_mask, other=0.0)
    v = x.to(tl.float32)
    if HAS_RESIDUAL:
        v += tl.load(r_row + kk, mask=k_mask, other=0.0).to(tl.float32)
        if write_sum:
            tl.store(sum_row + kk, v.to(x.dtype), mask=k_mask)
    g = tl.load(norm_w_ptr + kk, mask=k_mask, other=0.0).to(tl.float32)
    return v * g, tl.sum(v * v, axis=0)


@triton.jit
def _finish_row(acc, up, y_row, bias_ptr, cols, col_mask, HAS_BIAS: tl.constexpr, GATED: tl.constexpr):
    """Bias, then (GATED) silu(gate) * up, rounded as the unfused ops round; stores the row."""
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    tl.store(y_row + cols, rounded_swiglu(acc, up, y_row.dtype.element_ty, GATED), mask=col_mask)


@triton.jit
def rounded_swiglu(acc, up, dtype: tl.constexpr, GATED: tl.constexpr):
    """acc in dtype, or (GATED) silu(acc) * up, rounded as the unfused ops round."""
    out = acc.to(dtype)
    if GATED:
        gate = out.to(tl.float32)
        silu = (gate / (1.0 + tl.exp(-gate))).to(dtype)
        out = (silu.to(tl.float32) * up.to(dtype).to(tl.float32)).to(dtype)
    return out


@triton.jit
def _gemv_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    y_ptr,
    part_ptr,
    ticket_ptr,
    residual_ptr,
    norm_w_ptr,
    sum_ptr,
    eps,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_ym,
    HAS_BIAS: tl.constexpr,
    GATED: tl.constexpr,
    NORM: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    K_TILE: tl.constexpr,
    SPLIT_K: tl.constexpr,
    NORM_SPLIT: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    """GATED and NORM as in triton_gemm's kernel; ROWS >= M rows are unrolled. NORM_SPLIT (NORM, K
    split): each program sums its slice's squares into a workspace after the partials and 1 / rms
    scales the summed product (x * norm_w rounded once: matches the unfused ops to rounding)."""
    tile = tl.program_id(0)
    split = tl.program_id(1)
    cols = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    kk = split * K_TILE + tl.arange(0, K_TILE)
    col_mask = cols < N
    k_mask = kk < K
    w_mask = col_mask[:, None] & k_mask[None, :]
    # The weights, which no kernel writes, are requested before waiting for the previous kernel.
    w_tile = w_ptr + cols[:, None].to(tl.int64) * stride_wn + kk[None, :]
    w = tl.load(w_tile, mask=w_mask, other=0.0, eviction_policy="evict_first")
    up_w = w
    if GATED:
        up_tile = w_tile + N.to(tl.int64) * stride_wn
        up_w = tl.load(up_tile, mask=w_mask, other=0.0, eviction_policy="evict_first")
    wait_for_previous(PDL)
    write_sum = (tile == 0) & (split == 0)
    if NORM_SPLIT:
        write_sum = tile == 0  # each split writes its own slice of x + residual
    squares_ptr = part_ptr + SPLIT_K * ROWS * (2 * N if GATED else N)  # NORM_SPLIT: [SPLIT_K, ROWS, tiles]
    tiles = tl.num_programs(0)
    width = 2 * N if GATED else N
    for m in tl.static_range(ROWS):
        if m < M:
            row = m * stride_xm
            if NORM_SPLIT:
                x, squares = _split_input_chunk(
                    x_ptr + row,
                    residual_ptr + row,
                    sum_ptr + row,
                    norm_w_ptr,
                    write_sum,
                    kk,
                    k_mask,
                    HAS_RESIDUAL,
                )
                tl.store(squares_ptr + (split * ROWS + m) * tiles + tile, squares)
            else:
                x = _input_chunk(
                    x_ptr + row,
                    residual_ptr + row,
                    sum_ptr + row,
                    norm_w_ptr,
                    write_sum,
                    kk,
                    k_mask,
                    K,
                    eps,
                    NORM,
                    HAS_RESIDUAL,
                    K_TILE,
                )
            acc = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
            up = acc
            if GATED:
                up = tl.sum(up_w.to(tl.float32) * x[None, :], axis=1)
            if SPLIT_K > 1:
                part = part_ptr + (split * ROWS + m) * width + cols
                tl.store(part, acc, mask=col_mask)
                if GATED:
                    tl.store(part + N, up, mask=col_mask)
            else:
                _finish_row(acc, up, y_ptr + m * stride_ym, bias_ptr, cols, col_mask, HAS_BIAS, GATED)
    if SPLIT_K > 1:
        tl.debug_barrier()  # every thread's partials are written before the ticket publishes them
        done = tl.atomic_add(ticket_ptr + tile, 1, sem="acq_rel")
        if done == SPLIT_K - 1:
            for m in tl.static_range(ROWS):
                if m < M:
                    acc = tl.full([BLOCK_N], 0.0, tl.float32)
                    up = acc
                    for s in range(SPLIT_K):
                        part = part_ptr + (s * ROWS + m) * width + cols
                        acc += tl.load(part, mask=col_mask, other=0.0, cache_modifier=".cg")
                        if GATED:
                            up += tl.load(part + N, mask=col_mask, other=0.0, cache_modifier=".cg")
                    if NORM_SPLIT:
                        squares = 0.0
                        for s in range(SPLIT_K):
                            slot = squares_ptr + (s * ROWS + m) * tiles + tile
                            squares += tl.load(slot, cache_modifier=".cg")
                        rstd = tl.rsqrt(squares / K + eps)
                        acc *= rstd
                        up *= rstd
                    _finish_row(acc, up, y_ptr + m * stride_ym, bias_ptr, cols, col_mask, HAS_BIAS, GATED)
            tl.store(ticket_ptr + tile, 0)


def default_gemv_config(n: int, k: int, sms: int, max_split_tiles: int = 8192) -> GemvConfig:
    """Output tiles narrow enough to fill every SM about three times (few enough for the tickets where
    K is split); 8 warps where K is split (H200, one row: o_proj 4.6 -> 4.0 us, down_proj 5.1 -> 4.7)."""
    k_tile = min(triton.next_power_of_2(k), MAX_K_TILE)
    splits = triton.cdiv(k, k_tile)
    block_n = 16
    while block_n > 2 and triton.cdiv(n, block_n) * splits < 3 * sms:
        block_n //= 2
    while splits > 1 and triton.cdiv(n, block_n) > max_split_tiles:
        block_n *= 2
    return GemvConfig(block_n, k_tile, 8 if splits > 1 else 4)


def gemv(
    x: torch.Tensor,
    w: torch.Tensor,
    y: torch.Tensor,
    bias: torch.Tensor | None,
    gated: bool,
    norm: NormFirst | None,
    summed: torch.Tensor,
    tickets: torch.Tensor,
    config: GemvConfig | None = None,
) -> None:
    """Into y (and summed): triton_gemm.skinny_gemm's product for x [M <= MAX_ROWS, K]."""
    m, k = x.shape
    n = y.shape[1]
    assert m <= MAX_ROWS
    config = config or default_gemv_config(n, k, num_sms(x.device), tickets.numel())
    tiles = triton.cdiv(n, config.block_n)
    split = triton.cdiv(k, config.k_tile)
    assert split == 1 or tiles <= tickets.numel()
    rows = triton.next_power_of_2(m)
    width = 2 * n if gated else n
    norm_split = norm is not None and split > 1
    squares = split * rows * tiles if norm_split else 0
    part = y
    if split > 1:
        part = torch.empty(split * rows * width + squares, dtype=torch.float32, device=x.device)
    residual = norm.residual if norm is not None else None
    _gemv_kernel[(tiles, split)](
        x,
        w,
        bias if bias is not None else w,
        y,
        part,
        tickets,
        residual if residual is not None else x,
        norm.weight if norm is not None else w,
        summed,
        norm.eps if norm is not None else 0.0,
        m,
        n,
        k,
        x.stride(0),
        w.stride(0),
        y.stride(0),
        HAS_BIAS=bias is not None,
        GATED=gated,
        NORM=norm is not None,
        HAS_RESIDUAL=residual is not None,
        ROWS=rows,
        BLOCK_N=config.block_n,
        K_TILE=config.k_tile,
        SPLIT_K=split,
        NORM_SPLIT=norm_split,
        num_warps=config.num_warps,
        **launch_options(),
    )
