"""Fused MoE experts on the GPU: tokens grouped by expert on the device, then two grouped GEMMs.

Grouping (torch ops, no host sync, shapes fixed by the token count so CUDA graphs capture it): each
(token, k) slot goes to its expert's group, each group padded to a multiple of BLOCK_M with a sentinel
slot; the padded buffer is sized for the worst case (every non-empty expert wasting BLOCK_M - 1 rows),
and blocks past the real groups carry expert id `num_experts` and exit at once.

gate_up: one program per (block of BLOCK_M slots of one expert, BLOCK_N intermediate columns) gathers
its tokens' rows, multiplies by the expert's gate and up rows and writes silu(gate) * up, rounded where
the unfused torch ops round. down: the same grouping over the intermediate rows, times the slot's routing
weight, written per slot; one sum over the top-k slots of each token gives the output (deterministic,
no atomics). Batched decode and prefill sizes take different tiles; up to DECODE_MAX_TOKENS tokens no
grouping at all: the decode path (kernels/triton_moe_decode.py), two launches after the routing kernel.

fp8 experts (block-scaled e4m3, kernels/moe_ref.Fp8ExpertScales): the same grouping and epilogues; the
tokens' activations quantized once per token and 128-group (triton_fp8.quantize_activation), the SwiGLU
output once per slot, and both GEMMs take one 128-block of K per iteration, its fp32 product scaled by
the rows' activation scales and the columns' weight scales, as triton_fp8's GEMM does."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from nanoexp.kernels.moe_ref import Fp8ExpertScales
from nanoexp.kernels.pdl import launch_options
from nanoexp.kernels.triton_fp8 import UPCAST_DOT, fp8_block_dot, quantize_activation
from nanoexp.kernels.triton_moe_decode import DECODE_MAX_TOKENS, decode_moe, route_decode_moe, top_k_route
from nanoexp.kernels.triton_pdl import wait_for_previous

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GemmTile:
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3


@dataclass(frozen=True)
class MoeTiles:
    block_m: int  # slots per block: both GEMMs share the grouping
    gate_up: GemmTile
    down: GemmTile


# (largest token count, tiles): decode, batched decode, prefill. On an H200 at Qwen3-30B-A3B's shapes
# (experiments/moe/README.md): 16-row blocks from 16 to 64 tokens (1.29-1.30x the bytes floor; 32-row
# blocks 2% slower at 64), 32-row blocks at 256 (2% faster than 16), 128-row blocks for a 4,096-token
# prefill (3% faster than 64).
REGIMES: tuple[tuple[int | None, MoeTiles], ...] = (
    (128, MoeTiles(16, GemmTile(64, 128, 4, 4), GemmTile(128, 64, 4, 4))),
    (512, MoeTiles(32, GemmTile(64, 128, 4, 4), GemmTile(128, 64, 4, 4))),
    (None, MoeTiles(128, GemmTile(64, 64, 4, 3), GemmTile(128, 64, 4, 3))),
)


# Up to this many tokens the routing runs inside the decode path's gate_up (each of a slot's programs routes
# its token: a launch fewer, a few reductions over the logits before each program's first weight load);
# above, the routing kernel first. On an H100 (bench_moe.py's "with the routing" line, Qwen3-30B-A3B) the
# folded routing gave 37.6 us against 38.0 at one token (batch-1 TPOT 3.83 against 3.85 ms) and lost at
# four, 124.0 against 114.4 us: every program of a token's slots redoes the routing of all its tokens.
FOLD_ROUTING_MAX_TOKENS = 1

# Without the one-kernel grouping (where it fails its start-up check), the torch-op grouping costs ~50 us a
# layer, and the decode path (kernels/triton_moe_decode.py) serves up to this many tokens.
SLOT_MAX_TOKENS = 16


def tiles_for(num_tokens: int, element_size: int = 2) -> MoeTiles:
    """The regime's tiles; 4-byte elements (float32) take half as deep K steps and two stages, so the
    operand buffers fit in shared memory (a 128-row prefill tile would need 240 KB of an H100's 227)."""
    tiles = next(tiles for limit, tiles in REGIMES if limit is None or num_tokens <= limit)
    if element_size <= 2:
        return tiles
    shallow = lambda g: replace(g, block_k=max(32, g.block_k // 2), num_stages=min(2, g.num_stages))  # noqa: E731
    return MoeTiles(tiles.block_m, shallow(tiles.gate_up), shallow(tiles.down))


def group_by_expert(ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ids: [n] expert id of each slot, `num_experts` for a slot whose expert is on another rank.
    (slots [blocks * block_m]: slot indices grouped by expert, each group padded with the sentinel n;
    block_expert [blocks]: each block's expert, num_experts past the last group)."""
    n = ids.numel()
    blocks = triton.cdiv(n, block_m) + min(num_experts, n)  # >= sum over experts of cdiv(count, block_m)
    ids = ids.to(torch.int64)
    counts = torch.zeros(num_experts + 1, dtype=torch.int64, device=ids.device)
    counts.scatter_add_(0, ids, torch.ones_like(ids))
    counts = counts[:num_experts]
    padded_ends = ((counts + block_m - 1) // block_m * block_m).cumsum(0)
    padded_starts = torch.cat([padded_ends.new_zeros(1), padded_ends[:-1]])
    starts = counts.cumsum(0) - counts
    order = torch.argsort(ids, stable=True)
    sorted_ids = ids[order]
    local = sorted_ids.clamp(max=num_experts - 1)
    dest = padded_starts[local] + torch.arange(n, device=ids.device) - starts[local]
    trash = blocks * block_m  # the slots of other ranks' experts land past the end, then are cut off
    dest = torch.where(sorted_ids < num_experts, dest, trash)
    slots = torch.full((trash + 1,), n, dtype=torch.int32, device=ids.device)
    slots.scatter_(0, dest, order.to(torch.int32))
    block_starts = torch.arange(blocks, device=ids.device) * block_m
    block_expert = torch.searchsorted(padded_ends, block_starts, right=True).to(torch.int32)
    return slots[:trash], block_expert


# Counts that follow a step's token count are not specialized: Triton compiles apart the values 1 and
# multiples of 16, so a prefill of another size (the warm-up's are multiples of 16) would compile inside
# timed work.
@triton.jit(do_not_specialize=["n", "num_blocks"])
def _group_kernel(
    ids_ptr,
    slots_ptr,
    block_expert_ptr,
    cursor_ptr,
    n,
    num_experts,
    num_blocks,
    BLOCK_M: tl.constexpr,
    E_PAD: tl.constexpr,
    CHUNK: tl.constexpr,
    B_CHUNK: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """group_by_expert in one program: a histogram of the ids, each expert's padded start (cumsum), the
    blocks' experts, the sentinel fill, then each slot to its expert's next row (an atomic cursor: rows
    within a group are in no fixed order, which changes no result, each slot's row being its own)."""
    wait_for_previous(PDL)
    offs = tl.arange(0, CHUNK)
    bins = tl.arange(0, E_PAD)
    counts = tl.zeros([E_PAD], dtype=tl.int32)
    for start in range(0, n, CHUNK):
        i = start + offs
        ids = tl.load(ids_ptr + i, mask=i < n, other=0).to(tl.int32)
        counts += tl.histogram(ids, E_PAD, mask=i < n)
    padded = tl.where(bins < num_experts, (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M, 0)
    ends = tl.cumsum(padded, axis=0)
    tl.store(cursor_ptr + bins, ends - padded)
    ends = tl.where(bins < num_experts, ends, 2**30)
    for b0 in range(0, num_blocks, B_CHUNK):
        b = b0 + tl.arange(0, B_CHUNK)
        expert = tl.sum((ends[None, :] <= (b * BLOCK_M)[:, None]).to(tl.int32), axis=1)
        tl.store(block_expert_ptr + b, expert, mask=b < num_blocks)
    rows = num_blocks * BLOCK_M
    for r0 in range(0, rows, CHUNK):
        r = r0 + offs
        tl.store(slots_ptr + r, tl.zeros([CHUNK], dtype=tl.int32) + n, mask=r < rows)
    tl.debug_barrier()
    for start in range(0, n, CHUNK):
        i = start + offs
        ids = tl.load(ids_ptr + i, mask=i < n, other=0).to(tl.int32)
        local = (i < n) & (ids < num_experts)
        row = tl.atomic_add(cursor_ptr + ids, tl.full([CHUNK], 1, tl.int32), mask=local)
        tl.store(slots_ptr + row, i, mask=local)


def group_by_expert_kernel(
    ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """group_by_expert (same outputs, rows within an expert's group in any order) in one launch."""
    n = ids.numel()
    blocks = triton.cdiv(n, block_m) + min(num_experts, n)
    slots = torch.empty(blocks * block_m, dtype=torch.int32, device=ids.device)
    block_expert = torch.empty(blocks, dtype=torch.int32, device=ids.device)
    e_pad = triton.next_power_of_2(num_experts + 1)
    cursor = torch.empty(e_pad, dtype=torch.int32, device=ids.device)
    _group_kernel[(1,)](
        ids,
        slots,
        block_expert,
        cursor,
        n,
        num_experts,
        blocks,
        BLOCK_M=block_m,
        E_PAD=e_pad,
        CHUNK=1024,
        B_CHUNK=32,
        num_warps=8,
        **launch_options(),
    )
    return slots, block_expert


@triton.jit(do_not_specialize=["num_slots"])
def _gate_up_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    slots_ptr,
    block_expert_ptr,
    num_slots,
    num_experts,
    top_k,
    K,
    N,
    stride_xm,
    stride_we,
    stride_wn,
    stride_om,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """out[slot, n] = silu(x[token] . gate_e[n]) * (x[token] . up_e[n]); w = [E, 2N, K], gate rows first."""
    wait_for_previous(PDL)
    block = tl.program_id(0)
    expert = tl.load(block_expert_ptr + block)
    if expert >= num_experts:
        return
    slots = tl.load(slots_ptr + block * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = slots < num_slots
    tokens = (slots // top_k).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    ks = tl.arange(0, BLOCK_K)
    x_rows = x_ptr + tokens[:, None] * stride_xm
    w_expert = w_ptr + expert.to(tl.int64) * stride_we
    gate_rows = w_expert + cols[:, None] * stride_wn
    up_rows = w_expert + (cols + N)[:, None] * stride_wn
    acc_gate = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + ks
        k_mask = kk[None, :] < K
        a = tl.load(x_rows + kk[None, :], mask=valid[:, None] & k_mask, other=0.0)
        gate = tl.load(gate_rows + kk[None, :], mask=col_mask[:, None] & k_mask, other=0.0)
        up = tl.load(up_rows + kk[None, :], mask=col_mask[:, None] & k_mask, other=0.0)
        acc_gate = tl.dot(a, tl.trans(gate), acc_gate, input_precision=PRECISION)
        acc_up = tl.dot(a, tl.trans(up), acc_up, input_precision=PRECISION)
    DT = out_ptr.dtype.element_ty
    gate = acc_gate.to(DT).to(tl.float32)  # rounded where torch's linear, silu and product round
    act = (gate * tl.sigmoid(gate)).to(DT).to(tl.float32)
    out = (act * acc_up.to(DT).to(tl.float32)).to(DT)
    out_ptrs = out_ptr + slots.to(tl.int64)[:, None] * stride_om + cols[None, :]
    tl.store(out_ptrs, out, mask=valid[:, None] & col_mask[None, :])


@triton.jit(do_not_specialize=["num_slots"])
def _down_kernel(
    a_ptr,
    w_ptr,
    out_ptr,
    weights_ptr,
    slots_ptr,
    block_expert_ptr,
    num_slots,
    num_experts,
    K,
    N,
    stride_am,
    stride_we,
    stride_wn,
    stride_om,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """out[slot, n] = weight[slot] * (a[slot] . down_e[n]); w = [E, N, K]."""
    wait_for_previous(PDL)
    block = tl.program_id(0)
    expert = tl.load(block_expert_ptr + block)
    if expert >= num_experts:
        return
    slots = tl.load(slots_ptr + block * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = slots < num_slots
    rows = slots.to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    ks = tl.arange(0, BLOCK_K)
    a_rows = a_ptr + rows[:, None] * stride_am
    w_rows = w_ptr + expert.to(tl.int64) * stride_we + cols[:, None] * stride_wn
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + ks
        k_mask = kk[None, :] < K
        a = tl.load(a_rows + kk[None, :], mask=valid[:, None] & k_mask, other=0.0)
        w = tl.load(w_rows + kk[None, :], mask=col_mask[:, None] & k_mask, other=0.0)
        acc = tl.dot(a, tl.trans(w), acc, input_precision=PRECISION)
    DT = out_ptr.dtype.element_ty
    weight = tl.load(weights_ptr + rows, mask=valid, other=0.0).to(tl.float32)
    out = (acc.to(DT).to(tl.float32) * weight[:, None]).to(DT)
    tl.store(
        out_ptr + rows[:, None] * stride_om + cols[None, :], out, mask=valid[:, None] & col_mask[None, :]
    )


@triton.jit(do_not_specialize=["num_slots"])
def _fp8_gate_up_kernel(
    xq_ptr,
    xs_ptr,
    w_ptr,
    ws_ptr,
    out_ptr,
    slots_ptr,
    block_expert_ptr,
    num_slots,
    num_experts,
    top_k,
    KB,
    N,
    ROW_BLOCK,
    stride_xq,
    stride_xs,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    stride_om,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr,
    EXACT_SUMS: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """_gate_up_kernel on quantized tokens xq [T, KB * 128] (scales xs [T, KB]) and e4m3 experts w [E, 2N,
    KB * 128] with scales ws [E, rows, KB] (one row per ROW_BLOCK weight rows)."""
    wait_for_previous(PDL)
    block = tl.program_id(0)
    expert = tl.load(block_expert_ptr + block)
    if expert >= num_experts:
        return
    slots = tl.load(slots_ptr + block * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = slots < num_slots
    tokens = tl.where(valid, slots // top_k, 0).to(tl.int64)  # a padding row reads token 0, never stored
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    safe_cols = tl.where(col_mask, cols, 0).to(tl.int64)
    ks = tl.arange(0, 128)
    x_tile = xq_ptr + tokens[:, None] * stride_xq + ks[None, :]
    x_scales = xs_ptr + tokens * stride_xs
    w_expert = w_ptr + expert.to(tl.int64) * stride_we
    gate_tile = w_expert + safe_cols[:, None] * stride_wn + ks[None, :]
    up_tile = w_expert + (safe_cols + N)[:, None] * stride_wn + ks[None, :]
    s_expert = ws_ptr + expert.to(tl.int64) * stride_se
    gate_scales = s_expert + (safe_cols // ROW_BLOCK) * stride_sn
    up_scales = s_expert + ((safe_cols + N) // ROW_BLOCK) * stride_sn
    acc_gate = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for kb in range(0, KB):
        a = tl.load(x_tile + kb * 128)
        a_scale = tl.load(x_scales + kb)[:, None]
        gate = fp8_block_dot(a, tl.load(gate_tile + kb * 128), UPCAST, EXACT_SUMS)
        up = fp8_block_dot(a, tl.load(up_tile + kb * 128), UPCAST, EXACT_SUMS)
        acc_gate += gate * a_scale * tl.load(gate_scales + kb)[None, :]
        acc_up += up * a_scale * tl.load(up_scales + kb)[None, :]
    DT = out_ptr.dtype.element_ty
    gate = acc_gate.to(DT).to(tl.float32)  # rounded where the reference's product, silu and product round
    act = (gate * tl.sigmoid(gate)).to(DT).to(tl.float32)
    out = (act * acc_up.to(DT).to(tl.float32)).to(DT)
    out_ptrs = out_ptr + slots.to(tl.int64)[:, None] * stride_om + cols[None, :]
    tl.store(out_ptrs, out, mask=valid[:, None] & col_mask[None, :])


@triton.jit(do_not_specialize=["num_slots"])
def _fp8_down_kernel(
    aq_ptr,
    as_ptr,
    w_ptr,
    ws_ptr,
    out_ptr,
    weights_ptr,
    slots_ptr,
    block_expert_ptr,
    num_slots,
    num_experts,
    KB,
    N,
    ROW_BLOCK,
    stride_aq,
    stride_as,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    stride_om,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr,
    EXACT_SUMS: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """_down_kernel on the quantized SwiGLU outputs aq [slots, KB * 128] (scales as_ [slots, KB]) and e4m3
    experts w [E, N, KB * 128] with scales ws [E, rows, KB]."""
    wait_for_previous(PDL)
    block = tl.program_id(0)
    expert = tl.load(block_expert_ptr + block)
    if expert >= num_experts:
        return
    slots = tl.load(slots_ptr + block * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = slots < num_slots
    rows = tl.where(valid, slots, 0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    safe_cols = tl.where(col_mask, cols, 0).to(tl.int64)
    ks = tl.arange(0, 128)
    a_tile = aq_ptr + rows[:, None] * stride_aq + ks[None, :]
    a_scales = as_ptr + rows * stride_as
    w_tile = w_ptr + expert.to(tl.int64) * stride_we + safe_cols[:, None] * stride_wn + ks[None, :]
    w_scales = ws_ptr + expert.to(tl.int64) * stride_se + (safe_cols // ROW_BLOCK) * stride_sn
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for kb in range(0, KB):
        product = fp8_block_dot(tl.load(a_tile + kb * 128), tl.load(w_tile + kb * 128), UPCAST, EXACT_SUMS)
        acc += product * tl.load(a_scales + kb)[:, None] * tl.load(w_scales + kb)[None, :]
    DT = out_ptr.dtype.element_ty
    weight = tl.load(weights_ptr + rows, mask=valid, other=0.0).to(tl.float32)
    out = (acc.to(DT).to(tl.float32) * weight[:, None]).to(DT)
    tl.store(
        out_ptr + rows[:, None] * stride_om + cols[None, :], out, mask=valid[:, None] & col_mask[None, :]
    )


@triton.jit
def _route_kernel(
    logits_ptr,
    weights_ptr,
    ids_ptr,
    counts_ptr,
    slots_ptr,
    stride_l,
    num_experts,
    first_local,
    num_local,
    TOP_K: tl.constexpr,
    K_PAD: tl.constexpr,
    BLOCK_E: tl.constexpr,
    RENORMALIZE: tl.constexpr,
    COUNT: tl.constexpr,
    HAS_SLOTS: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """One token: softmax over its router logits in fp32, the top-k (ties: the lowest id, as torch.topk on
    CPU), renormalized; writes the weights (in the logits' dtype), this rank's expert ids (num_local for
    another rank's) and, when counting, adds the token's experts to counts."""
    wait_for_previous(PDL)
    row = tl.program_id(0).to(tl.int64)
    chosen, values = top_k_route(logits_ptr + row * stride_l, num_experts, TOP_K, K_PAD, BLOCK_E, RENORMALIZE)
    ks = tl.arange(0, K_PAD)
    in_k = ks < TOP_K
    tl.store(weights_ptr + row * TOP_K + ks, values.to(weights_ptr.dtype.element_ty), mask=in_k)
    local = chosen - first_local
    local = tl.where((local >= 0) & (local < num_local), local, num_local)
    tl.store(ids_ptr + row * TOP_K + ks, local, mask=in_k)
    if COUNT:
        counted = in_k
        if HAS_SLOTS:  # a graph's padding rows have KV slot -1: routed, not counted
            counted = counted & (tl.load(slots_ptr + row) >= 0)
        tl.atomic_add(counts_ptr + chosen, tl.full([K_PAD], 1, tl.int32), mask=counted)


def route_triton(
    logits: torch.Tensor,
    top_k: int,
    renormalize: bool,
    first_local: int = 0,
    num_local: int | None = None,
    counts: torch.Tensor | None = None,
    token_slots: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """kernels/moe_ref.route in one kernel: (weights [T, top_k] in the logits' dtype, this rank's expert
    ids [T, top_k] int32: experts [first_local, first_local + num_local) as 0.., others num_local). Adds
    each token's experts to `counts` [experts] int32 when given, but for tokens whose `token_slots` entry (the
    step's KV slot mapping) is -1."""
    tokens, experts = logits.shape
    num_local = experts if num_local is None else num_local
    weights = logits.new_empty((tokens, top_k))
    ids = torch.empty((tokens, top_k), dtype=torch.int32, device=logits.device)
    if tokens:
        _route_kernel[(tokens,)](
            logits,
            weights,
            ids,
            counts if counts is not None else ids,
            token_slots if token_slots is not None else ids,
            logits.stride(0),
            experts,
            first_local,
            num_local,
            TOP_K=top_k,
            K_PAD=triton.next_power_of_2(top_k),
            BLOCK_E=triton.next_power_of_2(experts),
            RENORMALIZE=renormalize,
            COUNT=counts is not None,
            HAS_SLOTS=token_slots is not None,
            num_warps=1,
            **launch_options(),
        )
    return weights, ids


def experts_triton(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    weights: torch.Tensor,
    local_ids: torch.Tensor,
    all_local: bool = True,
    group=None,
    decode_max_tokens: int = DECODE_MAX_TOKENS,
    fp8: Fp8ExpertScales | None = None,
) -> torch.Tensor:
    """The GPU path: up to `decode_max_tokens` tokens the decode path (two launches, no grouping:
    kernels/triton_moe_decode.py), grouped GEMMs above; bf16 or fp8 experts alike."""
    if x.shape[0] <= decode_max_tokens:
        return decode_moe(x, w13, w2, weights, local_ids, fp8)
    if fp8 is not None:
        return fused_moe_fp8(x, w13, w2, weights, local_ids, fp8, all_local, group=group)
    return fused_moe(x, w13, w2, weights, local_ids, all_local, group=group)


def fused_moe(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    weights: torch.Tensor,
    local_ids: torch.Tensor,
    all_local: bool = True,
    tiles: MoeTiles | None = None,
    group=None,
) -> torch.Tensor:
    """experts_reference (kernels/moe_ref.py) in two grouped GEMMs. local_ids [T, top_k]: this rank's
    expert of each slot, w13.shape[0] for another rank's (then all_local must be False)."""
    num_tokens, hidden = x.shape
    num_experts, inter = w13.shape[0], w13.shape[1] // 2
    top_k = local_ids.shape[1]
    num_slots = num_tokens * top_k
    if num_tokens == 0:
        return torch.zeros_like(x)
    tiles = tiles or tiles_for(num_tokens, x.element_size())
    ids = local_ids.reshape(-1)
    slots, block_expert = (group or group_by_expert)(ids, num_experts, tiles.block_m)
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    blocks = block_expert.numel()
    act = x.new_empty((num_slots, inter))
    up = tiles.gate_up
    _gate_up_kernel[(blocks, triton.cdiv(inter, up.block_n))](
        x,
        w13,
        act,
        slots,
        block_expert,
        num_slots,
        num_experts,
        top_k,
        hidden,
        inter,
        x.stride(0),
        w13.stride(0),
        w13.stride(1),
        act.stride(0),
        BLOCK_M=tiles.block_m,
        BLOCK_N=up.block_n,
        BLOCK_K=up.block_k,
        PRECISION=precision,
        num_warps=up.num_warps,
        num_stages=up.num_stages,
        **launch_options(),
    )
    per_slot = x.new_empty((num_slots, hidden)) if all_local else x.new_zeros((num_slots, hidden))
    down = tiles.down
    _down_kernel[(blocks, triton.cdiv(hidden, down.block_n))](
        act,
        w2,
        per_slot,
        weights.contiguous(),
        slots,
        block_expert,
        num_slots,
        num_experts,
        inter,
        hidden,
        act.stride(0),
        w2.stride(0),
        w2.stride(1),
        per_slot.stride(0),
        BLOCK_M=tiles.block_m,
        BLOCK_N=down.block_n,
        BLOCK_K=down.block_k,
        PRECISION=precision,
        num_warps=down.num_warps,
        num_stages=down.num_stages,
        **launch_options(),
    )
    return per_slot.view(num_tokens, top_k, hidden).sum(dim=1)


def fp8_tiles_for(num_tokens: int, dtype: torch.dtype) -> MoeTiles:
    """The regime's tiles (their K depth aside: fp8 GEMMs step one 128-block at a time); float32 runs, whose
    fp32 operand tiles of 128 K must fit in shared memory, at most 64 x 64 tiles in two stages."""
    tiles = tiles_for(num_tokens)
    if dtype != torch.float32:
        return tiles
    small = lambda g: replace(g, block_n=min(64, g.block_n), num_stages=2)  # noqa: E731
    return MoeTiles(min(64, tiles.block_m), small(tiles.gate_up), small(tiles.down))


def fused_moe_fp8(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    weights: torch.Tensor,
    local_ids: torch.Tensor,
    fp8: Fp8ExpertScales,
    all_local: bool = True,
    tiles: MoeTiles | None = None,
    group=None,
) -> torch.Tensor:
    """kernels/moe_ref.fp8_experts_reference in two grouped fp8 GEMMs: w13 [E, 2I, k_padded] and w2 [E, H,
    k_padded] in e4m3 with `fp8`'s scales and layouts; local_ids as in fused_moe."""
    num_tokens, hidden = x.shape
    num_experts, inter = w13.shape[0], w13.shape[1] // 2
    top_k = local_ids.shape[1]
    num_slots = num_tokens * top_k
    if num_tokens == 0:
        return torch.zeros_like(x)
    tiles = tiles or fp8_tiles_for(num_tokens, x.dtype)
    slots, block_expert = (group or group_by_expert)(local_ids.reshape(-1), num_experts, tiles.block_m)
    blocks, exact = block_expert.numel(), x.dtype == torch.float32
    xq, xs = quantize_activation(x if x.stride(-1) == 1 else x.contiguous(), fp8.gate_up)
    # other ranks' slots (EP) are quantized too, never read: zeros, not whatever the memory held
    act = x.new_empty((num_slots, inter)) if all_local else x.new_zeros((num_slots, inter))
    up, down = tiles.gate_up, tiles.down
    _fp8_gate_up_kernel[(blocks, triton.cdiv(inter, up.block_n))](
        xq,
        xs,
        w13,
        fp8.w13,
        act,
        slots,
        block_expert,
        num_slots,
        num_experts,
        top_k,
        fp8.gate_up.k_blocks,
        inter,
        fp8.gate_up.row_block,
        xq.stride(0),
        xs.stride(0),
        w13.stride(0),
        w13.stride(1),
        fp8.w13.stride(0),
        fp8.w13.stride(1),
        act.stride(0),
        BLOCK_M=tiles.block_m,
        BLOCK_N=up.block_n,
        UPCAST=UPCAST_DOT,
        EXACT_SUMS=exact,
        num_warps=up.num_warps,
        num_stages=up.num_stages,
        **launch_options(),
    )
    amax = fp8.down_amax(act) if fp8.down_amax is not None else None
    aq, a_scales = quantize_activation(act, fp8.down, amax)
    per_slot = x.new_empty((num_slots, hidden)) if all_local else x.new_zeros((num_slots, hidden))
    _fp8_down_kernel[(blocks, triton.cdiv(hidden, down.block_n))](
        aq,
        a_scales,
        w2,
        fp8.w2,
        per_slot,
        weights.contiguous(),
        slots,
        block_expert,
        num_slots,
        num_experts,
        fp8.down.k_blocks,
        hidden,
        fp8.down.row_block,
        aq.stride(0),
        a_scales.stride(0),
        w2.stride(0),
        w2.stride(1),
        fp8.w2.stride(0),
        fp8.w2.stride(1),
        per_slot.stride(0),
        BLOCK_M=tiles.block_m,
        BLOCK_N=down.block_n,
        UPCAST=UPCAST_DOT,
        EXACT_SUMS=exact,
        num_warps=down.num_warps,
        num_stages=down.num_stages,
        **launch_options(),
    )
    return per_slot.view(num_tokens, top_k, hidden).sum(dim=1)


class TritonMoe:
    """The GPU MoE path bound to the layers (layers/fused_moe.py, which calls `moe`): routing in one kernel,
    then the experts grouped by `grouping`; up to `decode_max_tokens` tokens the decode path instead, the
    routing folded into it up to FOLD_ROUTING_MAX_TOKENS."""

    name = "triton"

    def __init__(
        self, grouping=group_by_expert, selection: str = "", decode_max_tokens: int = DECODE_MAX_TOKENS
    ):
        self.grouping, self.selection, self.decode_max_tokens = grouping, selection, decode_max_tokens

    route = staticmethod(route_triton)

    def moe(
        self,
        x: torch.Tensor,
        router_logits: torch.Tensor,
        w13: torch.Tensor,
        w2: torch.Tensor,
        top_k: int,
        renormalize: bool,
        first_local: int = 0,
        counts: torch.Tensor | None = None,
        token_slots: torch.Tensor | None = None,
        all_local: bool = True,
        fp8: Fp8ExpertScales | None = None,
    ) -> torch.Tensor:
        """route, then experts (arguments as theirs; this rank holds experts [first_local, + w13.shape[0])):
        up to FOLD_ROUTING_MAX_TOKENS tokens two launches, the routing folded into the decode path."""
        if x.shape[0] <= min(self.decode_max_tokens, FOLD_ROUTING_MAX_TOKENS):
            return route_decode_moe(
                x, router_logits, w13, w2, top_k, renormalize, first_local, counts, token_slots, fp8
            )
        num_local = w13.shape[0]
        weights, ids = self.route(
            router_logits, top_k, renormalize, first_local, num_local, counts, token_slots
        )
        return self.experts(x, w13, w2, weights, ids, all_local, fp8)

    def experts(
        self, x, w13, w2, weights, local_ids, all_local: bool = True, fp8: Fp8ExpertScales | None = None
    ) -> torch.Tensor:
        return experts_triton(
            x,
            w13,
            w2,
            weights,
            local_ids,
            all_local,
            group=self.grouping,
            decode_max_tokens=self.decode_max_tokens,
            fp8=fp8,
        )


def same_groups(
    slots: torch.Tensor, block_expert: torch.Tensor, want_slots: torch.Tensor, want_expert: torch.Tensor
) -> bool:
    """Whether two groupings give every block the same expert and every expert the same slots (which of
    its blocks a slot lands in, and its row there, change no result: each slot's row is its own)."""
    if not torch.equal(block_expert, want_expert):
        return False
    block_m = slots.numel() // max(block_expert.numel(), 1)
    row_expert = block_expert.to(torch.int64).repeat_interleave(block_m)
    span = int(max(slots.max().item(), want_slots.max().item())) + 1 if slots.numel() else 1
    key = lambda s: (row_expert * span + s.to(torch.int64)).sort().values  # noqa: E731
    return torch.equal(key(slots), key(want_slots))


def grouping_agrees(device: torch.device) -> str | None:
    """None when group_by_expert_kernel groups 3,000 random slots (128 experts, some remote) as
    group_by_expert does on `device` (`same_groups`); else why not."""
    try:
        gen = torch.Generator(device=device).manual_seed(0)
        ids = torch.randint(0, 129, (3000,), device=device, generator=gen, dtype=torch.int32)
        want_slots, want_experts = group_by_expert(ids, 128, 16)
        slots, experts = group_by_expert_kernel(ids, 128, 16)
        if same_groups(slots, experts, want_slots, want_experts):
            return None
        return "its groups differ from the torch grouping's"
    except Exception as err:  # noqa: BLE001 - a kernel that cannot even run is rejected like a wrong one
        return f"{type(err).__name__}: {' '.join(str(err).split())[:200]}"


def make_triton_moe(device: torch.device) -> TritonMoe:
    """The Triton MoE path: the decode path up to DECODE_MAX_TOKENS tokens, above it grouped by expert in one
    kernel where a one-time check on `device` agrees with the torch grouping, else with the torch ops (~13
    launches, 50-130 us on an H200), the decode path then serving up to SLOT_MAX_TOKENS tokens."""
    problem = grouping_agrees(device)
    if problem is None:
        return TritonMoe(
            group_by_expert_kernel, "triton: grouping in one kernel (self-checked)", DECODE_MAX_TOKENS
        )
    log.warning(
        "MoE: grouping by expert with torch ops, the one-kernel grouping failed its check: %s", problem
    )
    return TritonMoe(
        group_by_expert,
        f"triton: grouping with torch ops (one-kernel grouping rejected: {problem})",
        max(DECODE_MAX_TOKENS, SLOT_MAX_TOKENS),
    )
