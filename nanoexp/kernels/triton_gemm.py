"""Skinny GEMM for decode: y[M, N] = x[M, K] @ w[N, K]^T (+ bias) with M of 1 to 256 rows.

The kernel streams w once in tiles of BLOCK_N output features, splitting K across SPLIT_K programs
when N alone gives too few programs to keep every SM loading. The last program of a column tile
(an atomic ticket) sums the fp32 split partials, adds the bias, writes y and resets its ticket: one
launch, and CUDA-graph replays start clean. Above MAX_BLOCK_M rows, rows are tiled too (grid dim 2).

The RMSNorm it can apply first: up to NORM_PREPASS_MAX_ROWS rows each program takes its rows' rms in
a pass of its own and rounds as the unfused op. Above, that pass would re-read x per column tile, so
squares are summed in the product's K loop and 1 / rms scales the product (x * norm_w is what is
rounded to 16 bits: the result differs from the unfused op's by that rounding)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import overload

import torch
import triton
import triton.language as tl

from nanoexp.kernels.base import NormFirst, num_sms
from nanoexp.kernels.pdl import launch_options
from nanoexp.kernels.triton_gemv import AUTO_ROWS as GEMV_ROWS
from nanoexp.kernels.triton_gemv import GemvConfig, gemv, rounded_swiglu
from nanoexp.kernels.triton_pdl import wait_for_previous

MAX_ROWS = 256
MAX_BLOCK_M = 64
NORM_PREPASS_MAX_ROWS = 16
TICKETS = 8192  # column tiles (times row tiles) per launch that can split K


@dataclass(frozen=True)
class GemmConfig:
    block_n: int
    block_k: int
    split_k: int
    num_warps: int = 4
    num_stages: int = 4
    block_m: int = 0  # 0: the rows rounded up to a power of two, at least 16, at most MAX_BLOCK_M


@triton.jit
def _row_rstd(
    x_rows,
    r_rows,
    sum_rows,
    write_sum,
    row_mask,
    ks,
    K,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """1 / rms of each row of x (+ residual), in fp32; writes x + residual when write_sum."""
    squares = tl.full([BLOCK_M], 0.0, tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + ks
        mask = row_mask[:, None] & (kk[None, :] < K)
        x = tl.load(x_rows + kk[None, :], mask=mask, other=0.0)
        v = x.to(tl.float32)
        if HAS_RESIDUAL:
            v += tl.load(r_rows + kk[None, :], mask=mask, other=0.0).to(tl.float32)
            if write_sum:
                tl.store(sum_rows + kk[None, :], v.to(x.dtype), mask=mask)
        squares += tl.sum(v * v, axis=1)
    return tl.rsqrt(squares / K + eps)


@triton.jit
def _tile_product(
    x_rows,
    w_rows,
    r_rows,
    norm_w_ptr,
    rstd,
    row_mask,
    col_mask,
    ks,
    k_start,
    k_end,
    NORM: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    acc = tl.full([BLOCK_M, BLOCK_N], 0.0, tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        kk = k0 + ks
        k_mask = kk[None, :] < k_end
        x = tl.load(x_rows + kk[None, :], mask=row_mask[:, None] & k_mask, other=0.0)
        if NORM:
            # rounded where the unfused op rounds: the normed row, then its product with the weight
            v = x.to(tl.float32)
            if HAS_RESIDUAL:
                v += tl.load(r_rows + kk[None, :], mask=row_mask[:, None] & k_mask, other=0.0).to(tl.float32)
            g = tl.load(norm_w_ptr + kk, mask=kk < k_end, other=0.0).to(tl.float32)
            x = ((v * rstd[:, None]).to(x.dtype).to(tl.float32) * g[None, :]).to(x.dtype)
        w = tl.load(w_rows + kk[None, :], mask=col_mask[:, None] & k_mask, other=0.0)
        acc += tl.dot(x, tl.trans(w))
    return acc


@triton.jit
def _prepass_product(
    x_rows,
    w_rows,
    r_rows,
    sum_rows,
    norm_w_ptr,
    write_sum,
    eps,
    row_mask,
    col_mask,
    ks,
    k_start,
    k_end,
    K,
    up_offset,
    NORM: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    GATED: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """x @ w^T (and @ up^T) over [k_start, k_end), x RMS-normed (rms from a pass of its own) if NORM."""
    rstd = tl.full([BLOCK_M], 1.0, tl.float32)
    if NORM:
        rstd = _row_rstd(
            x_rows, r_rows, sum_rows, write_sum, row_mask, ks, K, eps, HAS_RESIDUAL, BLOCK_M, BLOCK_K
        )
    acc = _tile_product(
        x_rows,
        w_rows,
        r_rows,
        norm_w_ptr,
        rstd,
        row_mask,
        col_mask,
        ks,
        k_start,
        k_end,
        NORM,
        HAS_RESIDUAL,
        BLOCK_M,
        BLOCK_N,
        BLOCK_K,
    )
    up = acc
    if GATED:
        up = _tile_product(
            x_rows,
            w_rows + up_offset,
            r_rows,
            norm_w_ptr,
            rstd,
            row_mask,
            col_mask,
            ks,
            k_start,
            k_end,
            NORM,
            HAS_RESIDUAL,
            BLOCK_M,
            BLOCK_N,
            BLOCK_K,
        )
    return acc, up


@triton.jit
def _normed_tile_product(
    x_rows,
    w_rows,
    up_offset,
    r_rows,
    sum_rows,
    norm_w_ptr,
    write_sum,
    row_mask,
    col_mask,
    ks,
    K,
    HAS_RESIDUAL: tl.constexpr,
    GATED: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """(x * norm_w) @ w^T (and @ up^T) and the rows' sums of squares, in one pass over all of K."""
    acc = tl.full([BLOCK_M, BLOCK_N], 0.0, tl.float32)
    up = acc
    squares = tl.full([BLOCK_M], 0.0, tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + ks
        k_mask = kk[None, :] < K
        x = tl.load(x_rows + kk[None, :], mask=row_mask[:, None] & k_mask, other=0.0)
        v = x.to(tl.float32)
        if HAS_RESIDUAL:
            v += tl.load(r_rows + kk[None, :], mask=row_mask[:, None] & k_mask, other=0.0).to(tl.float32)
            if write_sum:
                tl.store(sum_rows + kk[None, :], v.to(x.dtype), mask=row_mask[:, None] & k_mask)
        squares += tl.sum(v * v, axis=1)
        g = tl.load(norm_w_ptr + kk, mask=kk < K, other=0.0).to(tl.float32)
        xg = (v * g[None, :]).to(x.dtype)
        w = tl.load(w_rows + kk[None, :], mask=col_mask[:, None] & k_mask, other=0.0)
        acc += tl.dot(xg, tl.trans(w))
        if GATED:
            w_up = tl.load(w_rows + up_offset + kk[None, :], mask=col_mask[:, None] & k_mask, other=0.0)
            up += tl.dot(xg, tl.trans(w_up))
    return acc, up, squares


@triton.jit
def _sum_splits(
    part_ptr,
    rows,
    cols,
    out_mask,
    N,
    m_pad,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLIT_K: tl.constexpr,
):
    acc = tl.full([BLOCK_M, BLOCK_N], 0.0, tl.float32)
    for s in range(SPLIT_K):
        part = part_ptr + (s * m_pad + rows[:, None]) * N + cols[None, :]
        acc += tl.load(part, mask=out_mask, other=0.0, cache_modifier=".cg")
    return acc


@triton.jit
def _skinny_gemm_kernel(
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
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    NORM_IN_LOOP: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    """GATED: w is [gate; up] (2N rows), y = silu(x @ gate^T) * (x @ up^T). NORM: x -> RMSNorm(x +
    residual) * norm_w, column tile 0 / split 0 writing x + residual to sum_ptr; each program takes
    its rows' rms in a pass of its own, or with NORM_IN_LOOP (SPLIT_K == 1) in the product's K loop."""
    tile = tl.program_id(0)
    split = tl.program_id(1)
    row_tile = tl.program_id(2)
    rows = row_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    row_mask = rows < M
    col_mask = cols < N
    k_per_split = (K + SPLIT_K - 1) // SPLIT_K
    k_per_split = (k_per_split + BLOCK_K - 1) // BLOCK_K * BLOCK_K
    k_start = split * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    w_rows = w_ptr + cols[:, None].to(tl.int64) * stride_wn
    wait_for_previous(PDL)
    row_offsets = rows[:, None].to(tl.int64) * stride_xm
    x_rows, r_rows = x_ptr + row_offsets, residual_ptr + row_offsets
    write_sum = (tile == 0) & (split == 0)
    if NORM_IN_LOOP:
        acc, up, squares = _normed_tile_product(
            x_rows,
            w_rows,
            N.to(tl.int64) * stride_wn,
            r_rows,
            sum_ptr + row_offsets,
            norm_w_ptr,
            write_sum,
            row_mask,
            col_mask,
            ks,
            K,
            HAS_RESIDUAL,
            GATED,
            BLOCK_M,
            BLOCK_N,
            BLOCK_K,
        )
        rstd = tl.rsqrt(squares / K + eps)
        acc, up = acc * rstd[:, None], up * rstd[:, None]
    else:
        acc, up = _prepass_product(
            x_rows,
            w_rows,
            r_rows,
            sum_ptr + row_offsets,
            norm_w_ptr,
            write_sum,
            eps,
            row_mask,
            col_mask,
            ks,
            k_start,
            k_end,
            K,
            N.to(tl.int64) * stride_wn,
            NORM,
            HAS_RESIDUAL,
            GATED,
            BLOCK_M,
            BLOCK_N,
            BLOCK_K,
        )
    out_mask = row_mask[:, None] & col_mask[None, :]
    m_pad = tl.num_programs(2) * BLOCK_M
    ticket = ticket_ptr + row_tile * tl.num_programs(0) + tile
    if SPLIT_K > 1:
        width = 2 * N if GATED else N
        part = part_ptr + (split * m_pad + rows[:, None]) * width + cols[None, :]
        tl.store(part, acc, mask=out_mask)
        if GATED:
            tl.store(part + N, up, mask=out_mask)
        done = tl.atomic_add(ticket, 1, sem="acq_rel")
        if done != SPLIT_K - 1:
            return
        acc = _sum_splits(part_ptr, rows, cols, out_mask, width, m_pad, BLOCK_M, BLOCK_N, SPLIT_K)
        if GATED:
            up = _sum_splits(part_ptr + N, rows, cols, out_mask, width, m_pad, BLOCK_M, BLOCK_N, SPLIT_K)
        tl.store(ticket, 0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    out = rounded_swiglu(acc, up, y_ptr.dtype.element_ty, GATED)
    y = y_ptr + rows[:, None].to(tl.int64) * stride_ym + cols[None, :]
    tl.store(y, out, mask=out_mask)


@functools.lru_cache(maxsize=8)
def _tickets(device: torch.device) -> torch.Tensor:
    return torch.zeros(TICKETS, dtype=torch.int32, device=device)


def default_config(n: int, k: int, num_sms: int, rows: int = 1) -> GemmConfig:
    """K is split only when the (column and row) tiles alone would leave over half the SMs idle: on
    an H200, splitting 128 tiles 4 ways was slower than not."""
    block_n = 32
    block_k = 256 if k >= 1024 else 128
    tiles = triton.cdiv(n, block_n) * triton.cdiv(rows, MAX_BLOCK_M)
    split = 1
    while 2 * tiles * split < num_sms and k // (block_k * split * 2) >= 1:
        split *= 2
    return GemmConfig(block_n, block_k, split, num_stages=3)


@overload
def skinny_gemm(
    x: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None = None,
    config: GemmConfig | GemvConfig | None = None,
    gated: bool = False,
    norm: None = None,
) -> torch.Tensor: ...
@overload
def skinny_gemm(
    x: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None = None,
    config: GemmConfig | GemvConfig | None = None,
    gated: bool = False,
    *,
    norm: NormFirst,
) -> tuple[torch.Tensor, torch.Tensor]: ...
def skinny_gemm(
    x: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None = None,
    config: GemmConfig | GemvConfig | None = None,
    gated: bool = False,
    norm: NormFirst | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """x [M <= MAX_ROWS, K] @ w [N, K]^T + bias -> [M, N]. gated: w is [gate; up] (no bias), result
    silu(x gate^T) * (x up^T). norm: x RMS-normed first, returns (y, x + norm.residual or x). Up to
    triton_gemv.AUTO_ROWS rows (without a GemmConfig) the GEMV kernel runs, above the tensor-core one."""
    m, k = x.shape
    n = w.shape[0] // 2 if gated else w.shape[0]
    assert m <= MAX_ROWS and w.shape[1] == k and x.stride(-1) == 1 and w.stride(-1) == 1
    assert not (gated and bias is not None)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    residual = norm.residual if norm is not None else None
    assert residual is None or (residual.shape == x.shape and residual.stride() == x.stride())
    summed = torch.empty_like(x) if residual is not None else x
    if m == 0:
        return (y, summed) if norm is not None else y
    if isinstance(config, GemvConfig) or (config is None and m <= GEMV_ROWS):
        gemv(x, w, y, bias, gated, norm, summed, _tickets(x.device), config)
        return (y, summed) if norm is not None else y
    config = config or default_config(n, k, num_sms(x.device), m)
    block_m = config.block_m or min(max(16, triton.next_power_of_2(m)), MAX_BLOCK_M)
    tiles, row_tiles = triton.cdiv(n, config.block_n), triton.cdiv(m, block_m)
    norm_in_loop = norm is not None and m > NORM_PREPASS_MAX_ROWS
    split = 1 if norm_in_loop or tiles * row_tiles > TICKETS else config.split_k
    width = 2 * n if gated else n
    part_shape = (split, row_tiles * block_m, width)
    part = torch.empty(part_shape, dtype=torch.float32, device=x.device) if split > 1 else y
    _skinny_gemm_kernel[(tiles, split, row_tiles)](
        x,
        w,
        bias if bias is not None else w,
        y,
        part,
        _tickets(x.device),
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
        BLOCK_M=block_m,
        BLOCK_N=config.block_n,
        BLOCK_K=config.block_k,
        SPLIT_K=split,
        NORM_IN_LOOP=norm_in_loop,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
        **launch_options(),
    )
    return (y, summed) if norm is not None else y
