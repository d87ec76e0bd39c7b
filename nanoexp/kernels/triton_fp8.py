"""Block-scaled FP8 linear layers in Triton: y[M, N] = x[M, K] @ dequant(w)[N, K]^T in the W8A8 arithmetic
of kernels/fp8_reference.py (its oracle). Three kernels:

- per-token-group activation quantization: x -> e4m3 [M, k_padded] at the layout's offset, scales [M, KB];
- the GEMV for one decode row (M <= GEMV_ROWS) of a layer narrower than GEMV_MAX_N: fp8 weights streamed
  once (half a bf16 weight's bytes), each 128-block's fp32 dot products scaled by both scales, FMAs on
  CUDA cores; up to FUSED_QUANT_MAX_K it quantizes its row itself (the quantization kernel's arithmetic),
  so such a layer is one launch;
- the GEMM above: tl.dot on e4m3 operands (Hopper's fp8 tensor cores), one 128-wide K block per
  iteration, its fp32 product scaled by the row's activation scale and the column's weight scale.

A layer's input may come quantized by its producer (kernels/triton_fp8_inputs.py: add + RMSNorm, SwiGLU), as
a QuantizedActivation in `activation_format`'s layout; then no quantization runs here.

M is never specialized (`do_not_specialize`), so a step's token count picks among a handful of variants
(GEMV rows, BLOCK_M) that the warm-up and graph captures compile, never a timed step."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from nanoexp.kernels.base import num_sms
from nanoexp.kernels.fp8_reference import ACT_EPS, FP8_MAX, ActivationFormat, Fp8Layout, QuantizedActivation
from nanoexp.kernels.pdl import launch_options
from nanoexp.kernels.triton_pdl import wait_for_previous

# Up to where the GEMV runs, and up to which K it quantizes its row itself (each column tile redoes it: at
# K = 12,288 that cost 8 us of down_proj's 32 on an H200, a separate quantization launch ~2); above, the
# tensor-core kernel, faster at 2-4 rows already (H200, Qwen3-8B shapes: experiments/fp8/README.md).
GEMV_ROWS = 1
FUSED_QUANT_MAX_K = 4096
# Wide layers' single rows take the tensor-core kernel, whose deep pipeline streams the weights faster: on an
# H100 (Qwen3-8B, quantization included) qkv_proj 18.5 against the GEMV's 23.9 us, gate_up_proj 45.7
# against 58.2; o_proj and down_proj (4,096 rows) kept the GEMV (11.8 and 28.7 us).
GEMV_MAX_N = 6144
WIDE_ROW_GEMM = (16, 64, 4, 6)  # block_m, block_n, num_warps, num_stages
TICKETS = 8192  # column tiles a split-K GEMV launch may have
QUANT_GROUPS = 8  # 128-groups per program of the quantization kernel (a row's 1,024 values)
# The interpreter has no fp8 dot: there the operands (exact in fp16) are multiplied as fp16, fp32 sums.
UPCAST_DOT = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def round_to_e4m3(v):
    """v (|v| <= 448) rounded to the nearest e4m3 value, ties to even, in fp32: the cast after it is exact.
    (The Triton interpreter's fp8 cast mis-rounds values that carry into the next binade.)"""
    exponent = ((v.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    step_exponent = tl.maximum(exponent, -6) - 3  # 3 mantissa bits; subnormals below 2^-6
    step = ((step_exponent + 127) << 23).to(tl.float32, bitcast=True)
    inverse_step = ((127 - step_exponent) << 23).to(tl.float32, bitcast=True)  # powers of 2: exact products
    magic = 12582912.0  # 1.5 * 2^23: adding and subtracting it rounds |a| < 2^22 to an integer, ties to even
    return ((v * inverse_step + magic) - magic) * step


@triton.jit
def divide(a, b, IEEE: tl.constexpr):
    """a / b: IEEE-rounded as torch's (div_rn) where IEEE (float32 runs, which follow the reference), else
    Triton's `/`, within 2 ulp, which now and then moves a value at an e4m3 rounding boundary a whole step:
    below what half-precision activations already differ by, and several instructions fewer per value."""
    if IEEE:
        return tl.math.div_rn(a, b)
    else:
        return a / b


@triton.jit
def store_quantized(
    x,
    amax,
    live,
    row,
    groups,
    KB,
    q_ptr,
    s_ptr,
    stride_qm,
    stride_sm,
    stride_sg,
    eps,
    fp8_max,
    IEEE: tl.constexpr,
):
    """x [G, 128] in fp32 (zeros outside the layer's K) quantized per group of the padded layout with the
    groups' amax [G]: scale = max(amax, eps) / 448, q = x / scale (IEEE: both divisions as torch's, see
    divide), stored at `row`; a padding row (`live` false, x zeros) stores zeros, its scales too."""
    scale = divide(tl.maximum(amax, eps), fp8_max, IEEE)
    q = round_to_e4m3(tl.clamp(divide(x, scale[:, None], IEEE), -fp8_max, fp8_max))
    group_mask = groups < KB
    padded = groups[:, None] * 128 + tl.arange(0, 128)[None, :]
    tl.store(q_ptr + row * stride_qm + padded, q.to(q_ptr.dtype.element_ty), mask=group_mask[:, None])
    tl.store(s_ptr + row * stride_sm + groups * stride_sg, tl.where(live, scale, 0.0), mask=group_mask)


@triton.jit(do_not_specialize=["M"])
def _quantize_groups_kernel(
    x_ptr,
    amax_ptr,
    q_ptr,
    s_ptr,
    M,
    KB,
    K_LOCAL,
    K_OFFSET,
    stride_xm,
    stride_qm,
    stride_sm,
    stride_sg,
    eps,
    fp8_max,
    GROUPS: tl.constexpr,
    HAS_AMAX: tl.constexpr,
    IEEE: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    """One program per output row and GROUPS 128-groups of the padded layout (rows past M: zeros), quantized
    by store_quantized (IEEE: both divisions as torch's, see divide); HAS_AMAX: the groups' amax is given
    ([M, k_blocks] like the scales)."""
    wait_for_previous(PDL)
    row = tl.program_id(0).to(tl.int64)
    live = row < M
    groups = tl.program_id(1) * GROUPS + tl.arange(0, GROUPS)
    padded = groups[:, None] * 128 + tl.arange(0, 128)[None, :]
    local = padded - K_OFFSET
    mask = (local >= 0) & (local < K_LOCAL) & live
    x = tl.load(x_ptr + row * stride_xm + local, mask=mask, other=0.0).to(tl.float32)
    if HAS_AMAX:  # contiguous [M, KB]
        amax = tl.load(amax_ptr + row * KB + groups, mask=(groups < KB) & live, other=0.0)
    else:
        amax = tl.max(tl.abs(x), axis=1)
    store_quantized(
        x, amax, live, row, groups, KB, q_ptr, s_ptr, stride_qm, stride_sm, stride_sg, eps, fp8_max, IEEE
    )


@triton.jit
def quantized_row_tile(
    x_row, kb0, K_LOCAL, K_OFFSET, eps, fp8_max, KB_TILE: tl.constexpr, IEEE: tl.constexpr
):
    """KB_TILE groups of one row of x quantized as _quantize_groups_kernel does: (q [KB_TILE, 128] in fp32,
    scales [KB_TILE])."""
    local = kb0 * 128 + tl.arange(0, KB_TILE * 128) - K_OFFSET
    x = tl.load(x_row + local, mask=(local >= 0) & (local < K_LOCAL), other=0.0).to(tl.float32)
    x3 = tl.reshape(x, [KB_TILE, 128])
    scale = divide(tl.maximum(tl.max(tl.abs(x3), axis=1), eps), fp8_max, IEEE)
    return round_to_e4m3(tl.clamp(divide(x3, scale[:, None], IEEE), -fp8_max, fp8_max)), scale


@triton.jit
def _gemv_row_tile(
    x_ptr,
    xs_ptr,
    m,
    stride_x,
    stride_xs,
    kb0,
    K_LOCAL,
    K_OFFSET,
    eps,
    fp8_max,
    QUANTIZE: tl.constexpr,
    KB_TILE: tl.constexpr,
    IEEE: tl.constexpr,
):
    """Row m's KB_TILE groups from kb0 as the GEMV multiplies them: (e4m3 values [KB_TILE, 128] in fp32,
    scales [KB_TILE]), quantized here (QUANTIZE) or loaded."""
    if QUANTIZE:
        x3, xs = quantized_row_tile(x_ptr + m * stride_x, kb0, K_LOCAL, K_OFFSET, eps, fp8_max, KB_TILE, IEEE)
    else:
        x = tl.load(x_ptr + m * stride_x + kb0 * 128 + tl.arange(0, KB_TILE * 128)).to(tl.float32)
        x3 = tl.reshape(x, [KB_TILE, 128])
        xs = tl.load(xs_ptr + m * stride_xs + kb0 + tl.arange(0, KB_TILE))
    return x3, xs


@triton.jit(do_not_specialize=["M"])
def _fp8_gemv_kernel(
    x_ptr,
    xs_ptr,
    w_ptr,
    ws_ptr,
    y_ptr,
    M,
    N,
    KB,
    stride_x,
    stride_xs,
    stride_w,
    stride_ws,
    stride_y,
    ROW_BLOCK,
    K_LOCAL,
    K_OFFSET,
    eps,
    fp8_max,
    part_ptr,
    ticket_ptr,
    KB_PER_SPLIT,
    QUANTIZE: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    KB_TILE: tl.constexpr,
    SPLIT_K: tl.constexpr = 1,
    IEEE: tl.constexpr = False,
    DEFER_SUM: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    """Rows 0..M-1 (M <= ROWS) of BLOCK_N output columns; KB_TILE weight blocks per iteration (KB is a
    multiple of it, so no K mask). QUANTIZE: x is the unquantized activation [M, K_LOCAL], quantized here
    per group (each program redoes it: a decode row is a few KB read from L2), one launch fewer; else x
    is quantized [M, k_padded] with scales xs. SPLIT_K > 1: program (tile, s) takes K blocks
    [s * KB_PER_SPLIT, +KB_PER_SPLIT); the last of a tile's programs (an atomic ticket) sums the fp32
    partials, writes y and resets its ticket (CUDA-graph replays start clean). DEFER_SUM (one row only):
    each iteration adds w * x * (both scales) elementwise into a [BLOCK_N, KB_TILE, 128] fp32 accumulator
    held in registers, summed across threads once after the K loop instead of twice per iteration."""
    tile = tl.program_id(0)
    split = tl.program_id(1)
    cols = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    safe_cols = tl.where(col_mask, cols, 0).to(tl.int64)
    rows = tl.arange(0, ROWS)
    kbs = tl.arange(0, KB_TILE)
    kk = tl.arange(0, KB_TILE * 128)
    acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
    if DEFER_SUM:
        products = tl.zeros([BLOCK_N, KB_TILE, 128], dtype=tl.float32)
    w_tile = w_ptr + safe_cols[:, None] * stride_w + kk[None, :]
    ws_tile = ws_ptr + (safe_cols // ROW_BLOCK)[:, None] * stride_ws + kbs[None, :]
    # the weights, which no kernel writes, are requested before waiting for the previous kernel (PDL)
    kb_start = split * KB_PER_SPLIT
    kb_last = kb_start + KB_PER_SPLIT - KB_TILE
    w_next = tl.load(w_tile + kb_start * 128, eviction_policy="evict_first")
    wait_for_previous(PDL)
    for kb0 in range(kb_start, kb_start + KB_PER_SPLIT, KB_TILE):
        # the next tile's load is issued before this one's arithmetic: two tiles in flight per program
        w = w_next
        w_next = tl.load(w_tile + tl.minimum(kb0 + KB_TILE, kb_last) * 128, eviction_policy="evict_first")
        w3 = tl.reshape(w.to(tl.float32), [BLOCK_N, KB_TILE, 128])
        ws = tl.load(ws_tile + kb0)
        if DEFER_SUM:  # ROWS == 1: no reduction inside the loop
            x3, xs = _gemv_row_tile(
                x_ptr,
                xs_ptr,
                0,
                stride_x,
                stride_xs,
                kb0,
                K_LOCAL,
                K_OFFSET,
                eps,
                fp8_max,
                QUANTIZE,
                KB_TILE,
                IEEE,
            )
            products += (w3 * x3[None, :, :]) * (ws * xs[None, :])[:, :, None]
        else:
            for m in tl.static_range(ROWS):
                if m < M:
                    x3, xs = _gemv_row_tile(
                        x_ptr,
                        xs_ptr,
                        m,
                        stride_x,
                        stride_xs,
                        kb0,
                        K_LOCAL,
                        K_OFFSET,
                        eps,
                        fp8_max,
                        QUANTIZE,
                        KB_TILE,
                        IEEE,
                    )
                    part = tl.sum(w3 * x3[None, :, :], axis=2)
                    contrib = tl.sum(part * ws * xs[None, :], axis=1)
                    acc += tl.where(rows[:, None] == m, contrib[None, :], 0.0)
    if DEFER_SUM:
        acc = tl.reshape(tl.sum(tl.reshape(products, [BLOCK_N, KB_TILE * 128]), axis=1), [ROWS, BLOCK_N])
    out_mask = (rows[:, None] < M) & col_mask[None, :]
    if SPLIT_K > 1:
        parts = part_ptr + rows[:, None] * N + cols[None, :]
        tl.store(parts + split * ROWS * N, acc, mask=out_mask)
        tl.debug_barrier()  # every thread's partials are written before the ticket publishes them
        done = tl.atomic_add(ticket_ptr + tile, 1, sem="acq_rel")
        if done == SPLIT_K - 1:
            acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
            for s in range(SPLIT_K):
                acc += tl.load(parts + s * ROWS * N, mask=out_mask, other=0.0, cache_modifier=".cg")
            tl.store(
                y_ptr + rows[:, None] * stride_y + cols[None, :],
                acc.to(y_ptr.dtype.element_ty),
                mask=out_mask,
            )
            tl.store(ticket_ptr + tile, 0)
    else:
        tl.store(
            y_ptr + rows[:, None] * stride_y + cols[None, :], acc.to(y_ptr.dtype.element_ty), mask=out_mask
        )


@triton.jit
def fp8_block_dot(a, b, UPCAST: tl.constexpr, EXACT_SUMS: tl.constexpr):
    """a [M, 128] . b [N, 128]^T of e4m3 tiles in fp32: on fp8 tensor cores; EXACT_SUMS (float32 runs, which
    follow the reference) upcast to fp32 without tensor cores, whose fp8 MMA adds in fewer bits than fp32;
    UPCAST (the interpreter, which has no fp8 dot) as fp16, which holds e4m3 values exactly."""
    if EXACT_SUMS:
        product = tl.dot(a.to(tl.float32), tl.trans(b.to(tl.float32)), input_precision="ieee")
    elif UPCAST:
        product = tl.dot(a.to(tl.float16), tl.trans(b.to(tl.float16)))
    else:
        product = tl.dot(a, tl.trans(b))
    return product


@triton.jit(do_not_specialize=["M"])
def _fp8_gemm_kernel(
    xq_ptr,
    xs_ptr,
    w_ptr,
    ws_ptr,
    y_ptr,
    M,
    N,
    KB,
    stride_xq,
    stride_xs,
    stride_w,
    stride_ws,
    stride_y,
    ROW_BLOCK,
    K_LOCAL,
    eps,
    fp8_max,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    GROUP_M: tl.constexpr,
    QUANTIZE: tl.constexpr,
    UPCAST: tl.constexpr,
    EXACT_SUMS: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    """Tiles in groups of GROUP_M row tiles per column sweep, so neighbours share weight tiles in L2.
    QUANTIZE: xq_ptr is the unquantized x [M, K_LOCAL] (no offset), each 128-wide K step one group,
    quantized in registers as the quantization kernel does (xs_ptr unused). EXACT_SUMS (float32 runs, which
    must follow the reference): the operands upcast to fp32 and multiplied without tensor cores, since
    Hopper's fp8 MMA adds its products into the accumulator in fewer bits than fp32."""
    wait_for_previous(PDL)
    pid = tl.program_id(0)
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    group = pid // (GROUP_M * tiles_n)
    first_m = group * GROUP_M
    group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    tile_m = first_m + (pid % (GROUP_M * tiles_n)) % group_rows
    tile_n = (pid % (GROUP_M * tiles_n)) // group_rows
    rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask, col_mask = rows < M, cols < N
    safe_rows = tl.where(row_mask, rows, 0).to(tl.int64)
    safe_cols = tl.where(col_mask, cols, 0).to(tl.int64)
    ks = tl.arange(0, 128)
    x_tile = xq_ptr + safe_rows[:, None] * stride_xq + ks[None, :]
    w_tile = w_ptr + safe_cols[:, None] * stride_w + ks[None, :]
    xs_col = xs_ptr + safe_rows * stride_xs
    ws_col = ws_ptr + (safe_cols // ROW_BLOCK) * stride_ws
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for kb in range(0, KB):
        if QUANTIZE:
            x = tl.load(x_tile + kb * 128, mask=(kb * 128 + ks < K_LOCAL)[None, :], other=0.0).to(tl.float32)
            a_scale = divide(tl.maximum(tl.max(tl.abs(x), axis=1), eps), fp8_max, EXACT_SUMS)
            a = round_to_e4m3(tl.clamp(divide(x, a_scale[:, None], EXACT_SUMS), -fp8_max, fp8_max))
            a = a.to(w_ptr.dtype.element_ty)
        else:
            a = tl.load(x_tile + kb * 128)
            a_scale = tl.load(xs_col + kb)
        product = fp8_block_dot(a, tl.load(w_tile + kb * 128), UPCAST, EXACT_SUMS)
        acc += product * a_scale[:, None] * tl.load(ws_col + kb)[None, :]
    out = y_ptr + safe_rows[:, None] * stride_y + cols[None, :]
    tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=row_mask[:, None] & col_mask[None, :])


def activation_format(layout: Fp8Layout, tokens: int, dtype: torch.dtype) -> ActivationFormat:
    """What the Triton GEMV and GEMM read: row-major scales, one row a token."""
    return ActivationFormat(layout, tokens, m_major=False)


def quantized_buffers(fmt: ActivationFormat, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Uninitialized e4m3 [rows, k_padded] and float32 scales [rows, k_blocks] in `fmt`'s layout."""
    layout = fmt.layout
    q = torch.empty(fmt.rows, layout.k_padded, dtype=torch.float8_e4m3fn, device=device)
    if fmt.m_major:
        return q, torch.empty(layout.k_blocks, fmt.rows, dtype=torch.float32, device=device).t()
    return q, torch.empty(fmt.rows, layout.k_blocks, dtype=torch.float32, device=device)


def groups_per_program(layout: Fp8Layout) -> int:
    return min(QUANT_GROUPS, triton.next_power_of_2(layout.k_blocks))


def quantize_activation(
    x: torch.Tensor,
    layout: Fp8Layout,
    amax: torch.Tensor | None = None,
    scales_m_major: bool = False,
    rows: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton twin of fp8_reference.quantize_activation for x [M, k_local] (last dim contiguous); `amax`
    contiguous [M, k_blocks] when given. scales_m_major: the scales [M, k_blocks] stored M-major (a
    transposed view), as cuBLAS's block-scaled GEMM reads them. rows (>= M): the outputs' row count, the
    rows past M zeros (cuBLAS takes M-major scales whose row count is a multiple of 4 only)."""
    m = x.shape[0]
    fmt = ActivationFormat(layout, m if rows is None else rows, scales_m_major)
    q, s = quantized_buffers(fmt, x.device)
    groups = groups_per_program(layout)
    if fmt.rows:
        _quantize_groups_kernel[(fmt.rows, triton.cdiv(layout.k_blocks, groups))](
            x,
            amax if amax is not None else s,
            q,
            s,
            m,
            layout.k_blocks,
            layout.k_local,
            layout.k_offset,
            x.stride(0),
            q.stride(0),
            s.stride(0),
            s.stride(1),
            ACT_EPS,
            FP8_MAX,
            GROUPS=groups,
            HAS_AMAX=amax is not None,
            IEEE=x.dtype == torch.float32,
            **launch_options(),
        )
    return q, s


@dataclass(frozen=True)
class GemvConfig:
    block_n: int
    kb_tile: int  # 128-blocks of K per iteration (the largest of it, 2 and 1 that divides K's blocks)
    num_warps: int = 4
    split_k: int = 1  # K split across programs (1 where it does not divide K's blocks in whole tiles)
    # one row only: products accumulated elementwise over the K loop, reduced once after it
    deferred_sum: bool = False


@dataclass(frozen=True)
class GemmConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    group_m: int = 8
    quantize_a: bool = False  # the GEMM quantizes x's tiles itself (no offset, no given amax)


@functools.lru_cache(maxsize=8)
def _tickets(device: torch.device) -> torch.Tensor:
    """The split-K GEMV's per-column-tile counters (each reset by the program that finishes its tile)."""
    return torch.zeros(TICKETS, dtype=torch.int32, device=device)


def default_gemv_config(n: int, sms: int, rows: int = 1) -> GemvConfig:
    """Narrow enough column tiles for about three programs per SM; one row's products summed once after
    the K loop (H100, Qwen3-8B, quantization included: o_proj 14.6 -> 10.6 us, down_proj 29.4 -> 25.3)."""
    block_n = 16
    while block_n > 4 and triton.cdiv(n, block_n) < 3 * sms:
        block_n //= 2
    return GemvConfig(block_n, 4, deferred_sum=rows == 1)


def default_gemm_config(m: int, n: int = 0) -> GemmConfig:
    """By row count (and, for one row, the layer's width): a few variants, all compiled at warm-up or graph
    capture."""
    if m > 64:
        return GemmConfig(128, 128, 8, 3)
    if m <= GEMV_ROWS and n >= GEMV_MAX_N:
        return GemmConfig(*WIDE_ROW_GEMM)
    return GemmConfig(max(16, triton.next_power_of_2(m)), 32, 4, 4)


def uses_gemv(m: int, n: int, config: GemvConfig | GemmConfig | None) -> bool:
    return isinstance(config, GemvConfig) or (config is None and m <= GEMV_ROWS and n < GEMV_MAX_N)


def fp8_matmul(
    xq: torch.Tensor,
    xs: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    layout: Fp8Layout,
    dtype: torch.dtype,
    config: GemvConfig | GemmConfig | None = None,
) -> torch.Tensor:
    """y [M, N] in `dtype` from quantized activations and block-scaled weights (`config`: benchmarks)."""
    m, n = xq.shape[0], layout.n
    y = torch.empty(m, n, dtype=dtype, device=xq.device)
    if m == 0:
        return y
    if uses_gemv(m, n, config):
        _gemv(xq, xs, weight, scale, layout, y, False, config if isinstance(config, GemvConfig) else None)
    else:
        gemm = config if isinstance(config, GemmConfig) else default_gemm_config(m, n)
        _gemm(xq, xs, weight, scale, layout, y, False, gemm)
    return y


def _gemm(x, xs, weight, scale, layout: Fp8Layout, y, quantize: bool, config: GemmConfig) -> None:
    m, n = x.shape[0], layout.n
    exact = y.dtype == torch.float32
    if exact:  # fp32 operand tiles of 128 K: at most 64 x 128 of each, two stages, within shared memory
        config = replace(
            config, block_m=min(config.block_m, 64), block_n=min(config.block_n, 64), num_stages=2
        )
    grid = (triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n),)
    _fp8_gemm_kernel[grid](
        x,
        xs,
        weight,
        scale,
        y,
        m,
        n,
        layout.k_blocks,
        x.stride(0),
        xs.stride(0),
        weight.stride(0),
        scale.stride(0),
        y.stride(0),
        layout.row_block,
        layout.k_local,
        ACT_EPS,
        FP8_MAX,
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        GROUP_M=config.group_m,
        QUANTIZE=quantize,
        UPCAST=UPCAST_DOT,
        EXACT_SUMS=exact,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
        **launch_options(),
    )


def _gemv(x, xs, weight, scale, layout: Fp8Layout, y, quantize: bool, config: GemvConfig | None) -> None:
    m, n, kb = x.shape[0], layout.n, layout.k_blocks
    config = config or default_gemv_config(n, num_sms(x.device), m)
    if config.deferred_sum and m != 1:
        raise ValueError(f"GemvConfig(deferred_sum=True) takes one row, got {m}")
    kb_tile = next(t for t in (config.kb_tile, 2, 1) if kb % t == 0)
    tiles, rows = triton.cdiv(n, config.block_n), triton.next_power_of_2(m)
    split = config.split_k if kb % (config.split_k * kb_tile) == 0 and tiles <= TICKETS else 1
    part = torch.empty(split * rows * n, dtype=torch.float32, device=x.device) if split > 1 else y
    _fp8_gemv_kernel[(tiles, split)](
        x,
        xs,
        weight,
        scale,
        y,
        m,
        n,
        kb,
        x.stride(0),
        xs.stride(0),
        weight.stride(0),
        scale.stride(0),
        y.stride(0),
        layout.row_block,
        layout.k_local,
        layout.k_offset,
        ACT_EPS,
        FP8_MAX,
        part,
        _tickets(x.device) if split > 1 else y,  # (y: unused without a split)
        kb // split,
        QUANTIZE=quantize,
        IEEE=quantize and x.dtype == torch.float32,
        ROWS=rows,
        BLOCK_N=config.block_n,
        KB_TILE=kb_tile,
        SPLIT_K=split,
        DEFER_SUM=config.deferred_sum,
        num_warps=config.num_warps,
        **launch_options(),
    )


def fp8_linear(
    x: torch.Tensor | QuantizedActivation,
    weight: torch.Tensor,
    scale: torch.Tensor,
    layout: Fp8Layout,
    bias: torch.Tensor | None = None,
    amax: torch.Tensor | None = None,
    config: GemvConfig | GemmConfig | None = None,
) -> torch.Tensor:
    """x [..., k_local] -> [..., n]: quantize per token and group (unless x comes quantized), then the GEMV
    or GEMM (+ bias after rounding, as the reference). `amax` as in fp8_reference.quantize_activation;
    `config`: benchmarks."""
    if isinstance(x, QuantizedActivation):
        xq, xs = x.row_major()
        y = fp8_matmul(xq, xs, weight, scale, layout, x.dtype, config)
        return (y if bias is None else y + bias).view(*x.shape[:-1], layout.n)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, layout.k_local)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    gemv = uses_gemv(m, layout.n, config)
    gemm = config if isinstance(config, GemmConfig) else default_gemm_config(m, layout.n)
    if amax is None and m > 0 and gemv and layout.k_local <= FUSED_QUANT_MAX_K:  # the GEMV quantizes x itself
        y = torch.empty(m, layout.n, dtype=x.dtype, device=x.device)
        gemv_config = config if isinstance(config, GemvConfig) else None
        _gemv(x2, y, weight, scale, layout, y, True, gemv_config)  # (y stands in for the unused scales)
    elif amax is None and m > 0 and gemm.quantize_a and layout.k_offset == 0:  # so does this GEMM
        y = torch.empty(m, layout.n, dtype=x.dtype, device=x.device)
        _gemm(x2, y, weight, scale, layout, y, True, gemm)
    else:
        xq, xs = quantize_activation(x2, layout, amax)
        y = fp8_matmul(xq, xs, weight, scale, layout, x.dtype, config)
    if bias is not None:
        y = y + bias
    return y.view(*lead, layout.n)
