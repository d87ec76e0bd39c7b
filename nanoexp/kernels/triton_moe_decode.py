"""The MoE experts at decode sizes in two launches, with no grouping by expert: a decode step's MoE layer is
the router GEMM, gate_up (which routes its slot's token itself: route_decode_moe) and down. decode_moe
takes routes already made (routing kernel's weights and ids) instead.

gate_up: one program per ((token, k) slot, column tile) reads its slot's expert id (or routes the token as
the routing kernel does, the first column tile writing the slot's weight, id and load count), streams that
expert's gate and up rows as a GEMV and writes silu(gate) * up, rounded where the grouped kernel (and the
torch ops it follows) rounds; a slot of another rank's expert (EP) writes zeros.

down: one program per (token, column tile) streams the down rows of all of its token's top-k experts at
once (a [top_k, columns, K] tile per step, so each program keeps top_k weight streams in flight), weights
each slot's product, and sums the slots the way the reference does (kernels/moe_ref.experts_reference:
experts in id order, each partial sum rounded to the model dtype, as its index_add_ does), so no per-slot
buffer and no separate sum.

fp8 experts (block-scaled e4m3, moe_ref.Fp8ExpertScales): the same two kernels, each quantizing its own
input rows per 128-group in registers as triton_fp8's quantization does (gate_up: the token's hidden row;
down: each slot's SwiGLU row, with the ranks' shared amax where a TP shard straddles a group), in the fp8
GEMV's arithmetic (each 128-block's fp32 dot product times the weight and activation scales): no separate
quantization launches.

Token counts are never kernel arguments (the grid carries them), so a decode step of any size up to
DECODE_MAX_TOKENS runs the variant the warm-up or a graph capture compiled."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from nanoexp.kernels.fp8_reference import ACT_EPS, FP8_MAX
from nanoexp.kernels.moe_ref import Fp8ExpertScales
from nanoexp.kernels.pdl import launch_options
from nanoexp.kernels.triton_fp8 import divide, quantized_row_tile, round_to_e4m3
from nanoexp.kernels.triton_pdl import wait_for_previous

# Up to this many tokens the MoE layer takes this path, above it the grouped GEMMs (kernels/triton_moe.py).
# A first guess, to be set from experiments/moe/bench_moe.py's decode candidates on the GPU.
DECODE_MAX_TOKENS = 4


@dataclass(frozen=True)
class GemvTile:
    block_n: int  # output columns per program
    block_k: int  # K per step (fp8 gate_up: whole 128-groups; fp8 down: one group, this unused)
    num_warps: int = 4
    num_stages: int = 1  # the kernels keep one tile in flight ahead themselves (no software pipelining)


@dataclass(frozen=True)
class DecodeTiles:
    gate_up: GemvTile
    down: GemvTile


# gate_up 16 columns per program (one token's 8 slots at Qwen3-30B-A3B's 768 rows: 384 programs), 256 of K
# a step; down 4 columns, each program streaming its token's 8 experts at once (one token: 512 programs).
# H100, Qwen3-30B-A3B batch-1 TPOT 3.88 -> 3.78 ms against 16 columns x 128 of K and 8 down columns, 8 warps
# each (experiments/moe/README.md, run 6). fp8: 4 down columns.
DECODE_TILES = DecodeTiles(GemvTile(16, 256, 4), GemvTile(4, 128, 4))
DECODE_FP8_TILES = DecodeTiles(GemvTile(16, 128, 8), GemvTile(4, 128, 8))


@triton.jit
def _round_to(v, DT: tl.constexpr):
    """v rounded to the model dtype DT, back in fp32 (a no-op in float32 runs)."""
    return v.to(DT).to(tl.float32)


@triton.jit
def _swiglu_store(out_ptrs, acc_gate, acc_up, col_mask):
    """silu(gate) * up, rounded where torch's linear, silu and product round (as triton_moe's gate_up)."""
    DT = out_ptrs.dtype.element_ty
    gate = _round_to(acc_gate, DT)
    act = _round_to(gate * tl.sigmoid(gate), DT)
    tl.store(out_ptrs, (act * _round_to(acc_up, DT)).to(DT), mask=col_mask)


@triton.jit
def _tile_mask(row_mask, k0, ks, K):
    """The [rows, BLOCK_K] tile at K offset k0: its real rows and columns."""
    return row_mask[:, None] & (k0 + ks < K)[None, :]


@triton.jit
def _token_slots(ids_ptr, weights_ptr, token, num_experts, TOP_K: tl.constexpr, K_PAD: tl.constexpr):
    """A token's top-k slots: (slot indices [K_PAD] int64, this rank's expert of each or 0, whether it is
    this rank's, its routing weight in fp32 (0 where not))."""
    ks = tl.arange(0, K_PAD)
    slots = token * TOP_K + ks
    experts = tl.load(ids_ptr + slots, mask=ks < TOP_K, other=-1)
    local = (experts >= 0) & (experts < num_experts)
    weights = tl.load(weights_ptr + slots, mask=local, other=0.0).to(tl.float32)
    return slots, tl.where(local, experts, 0).to(tl.int64), local, weights


@triton.jit
def _sum_in_expert_order(y, experts, local, TOP_K: tl.constexpr, BLOCK_N: tl.constexpr, DT: tl.constexpr):
    """sum over the slots of y [K_PAD, N] (each row already rounded to DT) as the reference's index_add_
    adds them: this rank's experts in increasing id, each partial sum rounded to DT. A token's experts are
    distinct, so each row's place is the count of its token's local experts with smaller ids."""
    place = tl.sum(((experts[None, :] < experts[:, None]) & local[None, :]).to(tl.int32), axis=1)
    total = tl.zeros([BLOCK_N], dtype=tl.float32)
    for r in tl.static_range(TOP_K):
        pick = local & (place == r)
        total = _round_to(total + tl.sum(tl.where(pick[:, None], y, 0.0), axis=0), DT)
    return total


@triton.jit
def top_k_route(
    logits_row,
    num_experts,
    TOP_K: tl.constexpr,
    K_PAD: tl.constexpr,
    BLOCK_E: tl.constexpr,
    RENORMALIZE: tl.constexpr,
):
    """One token's routing: softmax over its router logits in fp32, the top-k (ties: the lowest id, as
    torch.topk on CPU), renormalized: (expert ids [K_PAD] int32, weights [K_PAD] fp32; past TOP_K: 0)."""
    experts = tl.arange(0, BLOCK_E)
    logits = tl.load(logits_row + experts, mask=experts < num_experts, other=-float("inf")).to(tl.float32)
    probs = tl.exp(logits - tl.max(logits, axis=0))
    probs = probs / tl.sum(probs, axis=0)
    ks = tl.arange(0, K_PAD)
    chosen = tl.zeros([K_PAD], dtype=tl.int32)
    values = tl.zeros([K_PAD], dtype=tl.float32)
    for k in tl.static_range(TOP_K):
        best = tl.max(probs, axis=0)
        pick = tl.min(tl.where(probs == best, experts, BLOCK_E), axis=0)
        chosen = tl.where(ks == k, pick, chosen)
        values = tl.where(ks == k, best, values)
        probs = tl.where(experts == pick, -1.0, probs)
    if RENORMALIZE:
        values = values / tl.sum(values, axis=0)
    return chosen, values


@triton.jit
def _slot_expert(
    slot,
    ids_ptr,
    logits_ptr,
    weights_ptr,
    counts_ptr,
    token_slots_ptr,
    stride_l,
    num_logits,
    first_local,
    num_local,
    TOP_K: tl.constexpr,
    K_PAD: tl.constexpr,
    BLOCK_E: tl.constexpr,
    ROUTE: tl.constexpr,
    RENORMALIZE: tl.constexpr,
    COUNT: tl.constexpr,
    HAS_SLOTS: tl.constexpr,
):
    """This rank's expert of a slot (num_local, or any id outside [0, num_local), for another rank's): read
    from ids, or ROUTE: routed here from its token's logits as route_triton routes (every program of the
    slot recomputes its token's top-k, a few hundred values), the first column tile's program writing the
    slot's weight (in the logits' dtype) and id for the down kernel, and counting it unless its token is a
    graph's padding row (token_slots -1)."""
    if ROUTE:
        token = slot // TOP_K
        chosen, values = top_k_route(
            logits_ptr + token * stride_l, num_logits, TOP_K, K_PAD, BLOCK_E, RENORMALIZE
        )
        mine = tl.arange(0, K_PAD) == slot % TOP_K
        expert = tl.sum(tl.where(mine, chosen, 0), axis=0)
        local = expert - first_local
        local = tl.where((local >= 0) & (local < num_local), local, num_local)
        if tl.program_id(1) == 0:
            weight = tl.sum(tl.where(mine, values, 0.0), axis=0)
            tl.store(weights_ptr + slot, weight.to(weights_ptr.dtype.element_ty))
            tl.store(ids_ptr + slot, local)
            if COUNT:
                if HAS_SLOTS:
                    tl.atomic_add(counts_ptr + expert, 1, mask=tl.load(token_slots_ptr + token) >= 0)
                else:
                    tl.atomic_add(counts_ptr + expert, 1)
    else:
        local = tl.load(ids_ptr + slot)
    return local


@triton.jit
def _decode_gate_up_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    ids_ptr,
    logits_ptr,
    weights_ptr,
    counts_ptr,
    token_slots_ptr,
    stride_l,
    num_logits,
    first_local,
    num_experts,
    K,
    N,
    stride_xm,
    stride_we,
    stride_wn,
    stride_om,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    TOP_K: tl.constexpr,
    K_PAD: tl.constexpr = 1,
    BLOCK_E: tl.constexpr = 1,
    ROUTE: tl.constexpr = False,
    RENORMALIZE: tl.constexpr = False,
    COUNT: tl.constexpr = False,
    HAS_SLOTS: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    """out[slot, n] = silu(x[token] . gate_e[n]) * (x[token] . up_e[n]), e = the slot's expert (_slot_expert:
    ids[slot], or ROUTE: routed here); w = [E, 2N, K]."""
    wait_for_previous(PDL)
    slot = tl.program_id(0).to(tl.int64)
    expert = _slot_expert(
        slot, ids_ptr, logits_ptr, weights_ptr, counts_ptr, token_slots_ptr, stride_l, num_logits,
        first_local, num_experts, TOP_K, K_PAD, BLOCK_E, ROUTE, RENORMALIZE, COUNT, HAS_SLOTS,
    )  # fmt: skip
    token = slot // TOP_K
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    acc_gate = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_N], dtype=tl.float32)
    if (expert >= 0) & (expert < num_experts):  # else another rank's expert: zeros
        ks = tl.arange(0, BLOCK_K)
        w_expert = w_ptr + expert.to(tl.int64) * stride_we
        gate_rows = w_expert + cols[:, None] * stride_wn + ks[None, :]
        up_rows = w_expert + (cols + N)[:, None] * stride_wn + ks[None, :]
        k_last = (K - 1) // BLOCK_K * BLOCK_K
        gate_next = tl.load(gate_rows, mask=_tile_mask(col_mask, 0, ks, K), other=0.0)
        up_next = tl.load(up_rows, mask=_tile_mask(col_mask, 0, ks, K), other=0.0)
        for k0 in range(0, K, BLOCK_K):
            # the next tile's loads are issued before this one's arithmetic: two tiles in flight
            gate, up = gate_next, up_next
            k1 = tl.minimum(k0 + BLOCK_K, k_last)
            gate_next = tl.load(gate_rows + k1, mask=_tile_mask(col_mask, k1, ks, K), other=0.0)
            up_next = tl.load(up_rows + k1, mask=_tile_mask(col_mask, k1, ks, K), other=0.0)
            kk = k0 + ks
            a = tl.load(x_ptr + token * stride_xm + kk, mask=kk < K, other=0.0).to(tl.float32)
            acc_gate += tl.sum(gate.to(tl.float32) * a[None, :], axis=1)
            acc_up += tl.sum(up.to(tl.float32) * a[None, :], axis=1)
    _swiglu_store(out_ptr + slot * stride_om + cols, acc_gate, acc_up, col_mask)


@triton.jit
def _decode_down_sum_kernel(
    a_ptr,
    w_ptr,
    out_ptr,
    weights_ptr,
    ids_ptr,
    num_experts,
    K,
    N,
    stride_am,
    stride_we,
    stride_wn,
    stride_om,
    TOP_K: tl.constexpr,
    K_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """out[token, n] = sum over its slots of weight[slot] * (a[slot] . down_e[n]), e = ids[slot], summed as
    the reference sums; w = [E, N, K]."""
    wait_for_previous(PDL)
    token = tl.program_id(0).to(tl.int64)
    slots, experts, local, weights = _token_slots(ids_ptr, weights_ptr, token, num_experts, TOP_K, K_PAD)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    ks = tl.arange(0, BLOCK_K)
    a_rows = a_ptr + slots[:, None] * stride_am + ks[None, :]
    w_tile = w_ptr + experts[:, None, None] * stride_we + cols[None, :, None] * stride_wn + ks[None, None, :]
    w_rows_mask = local[:, None, None] & col_mask[None, :, None]
    k_last = (K - 1) // BLOCK_K * BLOCK_K
    w_next = tl.load(w_tile, mask=w_rows_mask & (ks < K)[None, None, :], other=0.0)
    acc = tl.zeros([K_PAD, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        w = w_next  # the next tile's loads go out before this one's arithmetic, as in gate_up
        k1 = tl.minimum(k0 + BLOCK_K, k_last)
        w_next = tl.load(w_tile + k1, mask=w_rows_mask & (k1 + ks < K)[None, None, :], other=0.0)
        a = tl.load(a_rows + k0, mask=_tile_mask(local, k0, ks, K), other=0.0).to(tl.float32)
        acc += tl.sum(w.to(tl.float32) * a[:, None, :], axis=2)
    DT = out_ptr.dtype.element_ty
    y = _round_to(_round_to(acc, DT) * weights[:, None], DT)
    total = _sum_in_expert_order(y, experts, local, TOP_K, BLOCK_N, DT)
    tl.store(out_ptr + token * stride_om + cols, total.to(DT), mask=col_mask)


@triton.jit
def _decode_fp8_gate_up_kernel(
    x_ptr,
    w_ptr,
    ws_ptr,
    out_ptr,
    ids_ptr,
    logits_ptr,
    weights_ptr,
    counts_ptr,
    token_slots_ptr,
    stride_l,
    num_logits,
    first_local,
    num_experts,
    KB,
    N,
    ROW_BLOCK,
    K_LOCAL,
    K_OFFSET,
    stride_xm,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    stride_om,
    eps,
    fp8_max,
    BLOCK_N: tl.constexpr,
    KB_TILE: tl.constexpr,
    IEEE: tl.constexpr,
    TOP_K: tl.constexpr,
    K_PAD: tl.constexpr = 1,
    BLOCK_E: tl.constexpr = 1,
    ROUTE: tl.constexpr = False,
    RENORMALIZE: tl.constexpr = False,
    COUNT: tl.constexpr = False,
    HAS_SLOTS: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    """_decode_gate_up_kernel on e4m3 experts w [E, 2N, KB * 128] with scales ws [E, rows, KB] (one row per
    ROW_BLOCK weight rows); the token's row x [T, K_LOCAL] is quantized here, KB_TILE groups per step (KB a
    multiple of it), as triton_fp8's GEMV quantizes its row; the slot's expert as _decode_gate_up_kernel's."""
    wait_for_previous(PDL)
    slot = tl.program_id(0).to(tl.int64)
    expert = _slot_expert(
        slot, ids_ptr, logits_ptr, weights_ptr, counts_ptr, token_slots_ptr, stride_l, num_logits,
        first_local, num_experts, TOP_K, K_PAD, BLOCK_E, ROUTE, RENORMALIZE, COUNT, HAS_SLOTS,
    )  # fmt: skip
    token = slot // TOP_K
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    acc_gate = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_N], dtype=tl.float32)
    if (expert >= 0) & (expert < num_experts):  # else another rank's expert: zeros
        safe_cols = tl.where(col_mask, cols, 0).to(tl.int64)
        kk = tl.arange(0, KB_TILE * 128)
        kbs = tl.arange(0, KB_TILE)
        w_expert = w_ptr + expert.to(tl.int64) * stride_we
        gate_tile = w_expert + safe_cols[:, None] * stride_wn + kk[None, :]
        up_tile = w_expert + (safe_cols + N)[:, None] * stride_wn + kk[None, :]
        s_expert = ws_ptr + expert.to(tl.int64) * stride_se
        gate_scales = s_expert + (safe_cols // ROW_BLOCK)[:, None] * stride_sn + kbs[None, :]
        up_scales = s_expert + ((safe_cols + N) // ROW_BLOCK)[:, None] * stride_sn + kbs[None, :]
        x_row = x_ptr + token * stride_xm
        kb_last = KB - KB_TILE
        gate_next, up_next = tl.load(gate_tile), tl.load(up_tile)
        for kb0 in range(0, KB, KB_TILE):
            gate, up = gate_next, up_next  # the next tiles' loads go out first, as in the bf16 kernel
            kb1 = tl.minimum(kb0 + KB_TILE, kb_last)
            gate_next, up_next = tl.load(gate_tile + kb1 * 128), tl.load(up_tile + kb1 * 128)
            x3, xs = quantized_row_tile(x_row, kb0, K_LOCAL, K_OFFSET, eps, fp8_max, KB_TILE, IEEE)
            gate = tl.reshape(gate.to(tl.float32), [BLOCK_N, KB_TILE, 128])
            up = tl.reshape(up.to(tl.float32), [BLOCK_N, KB_TILE, 128])
            gate_part = tl.sum(gate * x3[None, :, :], axis=2)
            up_part = tl.sum(up * x3[None, :, :], axis=2)
            acc_gate += tl.sum(gate_part * tl.load(gate_scales + kb0) * xs[None, :], axis=1)
            acc_up += tl.sum(up_part * tl.load(up_scales + kb0) * xs[None, :], axis=1)
    _swiglu_store(out_ptr + slot * stride_om + cols, acc_gate, acc_up, col_mask)


@triton.jit
def _decode_fp8_down_sum_kernel(
    a_ptr,
    amax_ptr,
    w_ptr,
    ws_ptr,
    out_ptr,
    weights_ptr,
    ids_ptr,
    num_experts,
    KB,
    N,
    ROW_BLOCK,
    K_LOCAL,
    K_OFFSET,
    stride_am,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    stride_om,
    eps,
    fp8_max,
    TOP_K: tl.constexpr,
    K_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_AMAX: tl.constexpr,
    IEEE: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """_decode_down_sum_kernel on e4m3 experts w [E, N, KB * 128] with scales ws [E, rows, KB]: each step one
    128-group of every slot's SwiGLU row a [slots, K_LOCAL] (at K_OFFSET in the group layout) quantized here
    (HAS_AMAX: with the groups' given amax [slots, KB], contiguous), times the experts' blocks."""
    wait_for_previous(PDL)
    token = tl.program_id(0).to(tl.int64)
    slots, experts, local, weights = _token_slots(ids_ptr, weights_ptr, token, num_experts, TOP_K, K_PAD)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    safe_cols = tl.where(col_mask, cols, 0).to(tl.int64)
    ks = tl.arange(0, 128)
    a_rows = a_ptr + slots[:, None] * stride_am
    w_tile = (
        w_ptr + experts[:, None, None] * stride_we + safe_cols[None, :, None] * stride_wn + ks[None, None, :]
    )
    w_scales = ws_ptr + experts[:, None] * stride_se + (safe_cols // ROW_BLOCK)[None, :] * stride_sn
    acc = tl.zeros([K_PAD, BLOCK_N], dtype=tl.float32)
    w_next = tl.load(w_tile, mask=local[:, None, None])  # other ranks' slots: not read, zeroed below
    for kb in range(0, KB):
        w = w_next  # the next block's loads go out before this one's arithmetic, as in gate_up
        w_next = tl.load(w_tile + tl.minimum(kb + 1, KB - 1) * 128, mask=local[:, None, None])
        k_local = kb * 128 + ks - K_OFFSET
        in_row = (k_local >= 0) & (k_local < K_LOCAL)
        a = tl.load(a_rows + k_local[None, :], mask=local[:, None] & in_row[None, :], other=0.0).to(
            tl.float32
        )
        if HAS_AMAX:
            amax = tl.load(amax_ptr + slots * KB + kb, mask=local, other=0.0)
        else:
            amax = tl.max(tl.abs(a), axis=1)
        scale = divide(tl.maximum(amax, eps), fp8_max, IEEE)
        q = round_to_e4m3(tl.clamp(divide(a, scale[:, None], IEEE), -fp8_max, fp8_max))
        w = tl.where(local[:, None, None], w.to(tl.float32), 0.0)
        part = tl.sum(w * q[:, None, :], axis=2)
        acc += part * tl.load(w_scales + kb, mask=local[:, None], other=0.0) * scale[:, None]
    DT = out_ptr.dtype.element_ty
    y = _round_to(_round_to(acc, DT) * weights[:, None], DT)
    total = _sum_in_expert_order(y, experts, local, TOP_K, BLOCK_N, DT)
    tl.store(out_ptr + token * stride_om + cols, total.to(DT), mask=col_mask)


def decode_moe(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    weights: torch.Tensor,
    local_ids: torch.Tensor,
    fp8: Fp8ExpertScales | None = None,
    tiles: DecodeTiles | None = None,
) -> torch.Tensor:
    """experts_reference (kernels/moe_ref.py) for a few tokens in two launches. local_ids [T, top_k]: this
    rank's expert of each slot, any id outside [0, w13.shape[0]) for another rank's; weights [T, top_k]."""
    if x.shape[0] == 0:
        return torch.zeros_like(x)
    ids, weights = local_ids.contiguous(), weights.contiguous()
    return _experts(x, w13, w2, weights, ids, fp8, tiles, _given_routes(ids))


def route_decode_moe(
    x: torch.Tensor,
    router_logits: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    top_k: int,
    renormalize: bool,
    first_local: int = 0,
    counts: torch.Tensor | None = None,
    token_slots: torch.Tensor | None = None,
    fp8: Fp8ExpertScales | None = None,
    tiles: DecodeTiles | None = None,
) -> torch.Tensor:
    """route_triton (kernels/triton_moe.py) then decode_moe, the routing folded into gate_up: two launches
    for the layer's experts after the router GEMM. This rank holds experts [first_local, + w13.shape[0]);
    `counts` and `token_slots` as in route_triton."""
    num_tokens = x.shape[0]
    if num_tokens == 0:
        return torch.zeros_like(x)
    weights = router_logits.new_empty((num_tokens, top_k))
    ids = torch.empty((num_tokens, top_k), dtype=torch.int32, device=x.device)
    routes = dict(
        logits_ptr=router_logits,
        weights_ptr=weights,
        counts_ptr=counts if counts is not None else ids,
        token_slots_ptr=token_slots if token_slots is not None else ids,
        stride_l=router_logits.stride(0),
        num_logits=router_logits.shape[1],
        first_local=first_local,
        TOP_K=top_k,
        K_PAD=triton.next_power_of_2(top_k),
        BLOCK_E=triton.next_power_of_2(router_logits.shape[1]),
        ROUTE=True,
        RENORMALIZE=renormalize,
        COUNT=counts is not None,
        HAS_SLOTS=token_slots is not None,
    )
    return _experts(x, w13, w2, weights, ids, fp8, tiles, routes)


def _given_routes(ids: torch.Tensor) -> dict:
    """gate_up's routing arguments when the slots' experts are given (ids [T, top_k]): only TOP_K is read."""
    return dict(
        logits_ptr=ids,
        weights_ptr=ids,
        counts_ptr=ids,
        token_slots_ptr=ids,
        stride_l=0,
        num_logits=0,
        first_local=0,
        TOP_K=ids.shape[1],
    )


def _experts(x, w13, w2, weights, ids, fp8, tiles: DecodeTiles | None, routes: dict) -> torch.Tensor:
    """gate_up (writing weights and ids first where it routes), then down with the top-k sum."""
    num_tokens, hidden = x.shape
    tiles = tiles or (DECODE_TILES if fp8 is None else DECODE_FP8_TILES)
    x = x if x.stride(-1) == 1 else x.contiguous()
    act = x.new_empty((ids.numel(), w13.shape[1] // 2))
    out = x.new_empty((num_tokens, hidden))
    if fp8 is None:
        _gate_up(x, w13, act, ids, tiles.gate_up, routes)
        _down_sum(act, w2, out, weights, ids, tiles.down)
    else:
        _fp8_gate_up(x, w13, act, ids, fp8, tiles.gate_up, routes)
        amax = fp8.down_amax(act) if fp8.down_amax is not None else None
        _fp8_down_sum(act, amax, w2, out, weights, ids, fp8, tiles.down)
    return out


def _gate_up(x, w13, act, ids, tile: GemvTile, routes: dict) -> None:
    num_experts, inter = w13.shape[0], w13.shape[1] // 2
    _decode_gate_up_kernel[(act.shape[0], triton.cdiv(inter, tile.block_n))](
        x_ptr=x,
        w_ptr=w13,
        out_ptr=act,
        ids_ptr=ids,
        num_experts=num_experts,
        K=x.shape[1],
        N=inter,
        stride_xm=x.stride(0),
        stride_we=w13.stride(0),
        stride_wn=w13.stride(1),
        stride_om=act.stride(0),
        BLOCK_N=tile.block_n,
        BLOCK_K=tile.block_k,
        num_warps=tile.num_warps,
        num_stages=tile.num_stages,
        **routes,
        **launch_options(),
    )


def _down_sum(act, w2, out, weights, ids, tile: GemvTile) -> None:
    num_tokens, hidden = out.shape
    top_k = ids.shape[1]
    _decode_down_sum_kernel[(num_tokens, triton.cdiv(hidden, tile.block_n))](
        act,
        w2,
        out,
        weights,
        ids,
        w2.shape[0],
        act.shape[1],
        hidden,
        act.stride(0),
        w2.stride(0),
        w2.stride(1),
        out.stride(0),
        TOP_K=top_k,
        K_PAD=triton.next_power_of_2(top_k),
        BLOCK_N=tile.block_n,
        BLOCK_K=tile.block_k,
        num_warps=tile.num_warps,
        num_stages=tile.num_stages,
        **launch_options(),
    )


def groups_per_step(k_blocks: int, block_k: int) -> int:
    """128-groups per gate_up step: the tile's, else the largest of 2 and 1 that divides K's groups."""
    return next(t for t in (max(1, block_k // 128), 2, 1) if k_blocks % t == 0)


def _fp8_gate_up(x, w13, act, ids, fp8: Fp8ExpertScales, tile: GemvTile, routes: dict) -> None:
    layout = fp8.gate_up
    num_experts, inter = w13.shape[0], w13.shape[1] // 2
    _decode_fp8_gate_up_kernel[(act.shape[0], triton.cdiv(inter, tile.block_n))](
        x_ptr=x,
        w_ptr=w13,
        ws_ptr=fp8.w13,
        out_ptr=act,
        ids_ptr=ids,
        num_experts=num_experts,
        KB=layout.k_blocks,
        N=inter,
        ROW_BLOCK=layout.row_block,
        K_LOCAL=layout.k_local,
        K_OFFSET=layout.k_offset,
        stride_xm=x.stride(0),
        stride_we=w13.stride(0),
        stride_wn=w13.stride(1),
        stride_se=fp8.w13.stride(0),
        stride_sn=fp8.w13.stride(1),
        stride_om=act.stride(0),
        eps=ACT_EPS,
        fp8_max=FP8_MAX,
        BLOCK_N=tile.block_n,
        KB_TILE=groups_per_step(layout.k_blocks, tile.block_k),
        IEEE=x.dtype == torch.float32,
        num_warps=tile.num_warps,
        num_stages=tile.num_stages,
        **routes,
        **launch_options(),
    )


def _fp8_down_sum(act, amax, w2, out, weights, ids, fp8: Fp8ExpertScales, tile: GemvTile) -> None:
    layout = fp8.down
    num_tokens, hidden = out.shape
    top_k = ids.shape[1]
    amax = amax.float().contiguous() if amax is not None else None
    _decode_fp8_down_sum_kernel[(num_tokens, triton.cdiv(hidden, tile.block_n))](
        act,
        amax if amax is not None else act,  # (act: unused without a given amax)
        w2,
        fp8.w2,
        out,
        weights,
        ids,
        w2.shape[0],
        layout.k_blocks,
        hidden,
        layout.row_block,
        layout.k_local,
        layout.k_offset,
        act.stride(0),
        w2.stride(0),
        w2.stride(1),
        fp8.w2.stride(0),
        fp8.w2.stride(1),
        out.stride(0),
        ACT_EPS,
        FP8_MAX,
        TOP_K=top_k,
        K_PAD=triton.next_power_of_2(top_k),
        BLOCK_N=tile.block_n,
        HAS_AMAX=amax is not None,
        IEEE=act.dtype == torch.float32,
        num_warps=tile.num_warps,
        num_stages=tile.num_stages,
        **launch_options(),
    )
