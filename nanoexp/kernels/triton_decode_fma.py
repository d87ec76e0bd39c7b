"""Split-K decode on CUDA cores for fp8 caches read by 1-2 query heads per kv head, where a 16-row
tensor-core tile is mostly padding and an 8-bit V tile would be transposed through shared memory.
Products are packed fp16 FMAs in registers. A tile is [ROWS x LANES keys, dims]: each thread holds
ROWS keys of one lane, 16 dims each (one 16-byte load); lanes run own online softmaxes, merged last.

Numerics (experiments/kernels/runs/decode_cuda_cores.md): e4m3 widens to fp16 exactly; products and
a thread's sums over 16 dims (q . k) and ROWS keys (p . v, p <= 1) are fp16, the rest fp32: 2^-11
relative, below the cache's 2^-4. No overflow: q carries the softmax and k scales (a partial q . k
is a piece of the log2 score), and p . v sums at most ROWS values <= 448."""

from __future__ import annotations

import triton
import triton.language as tl

from nanoexp.kernels.triton_pdl import wait_for_previous
from nanoexp.kernels.triton_splits import key_offsets, max_combine, split_bounds, store_split, sum_combine

DIMS_PER_LOAD = 16  # fp8 dims in one 16-byte load: Triton's layout gives each thread these


def tile_shape(keys: int, dim_pad: int, num_warps: int) -> tuple[int, int, int]:
    """(ROWS, LANES, PER_LOAD): keys per thread, keys one pass of the threads covers, dims per thread."""
    per_load = min(DIMS_PER_LOAD, dim_pad)
    lanes = 32 // min(32, dim_pad // per_load) * num_warps
    return max(1, keys // lanes), lanes, per_load


@triton.jit
def _load_kv(
    k_ptr,
    v_ptr,
    table,
    pos,
    n0,
    end,
    dims,
    stride_cb,
    stride_cp,
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE: tl.constexpr,
):
    """The K and V tiles ([TILE, DIM_PAD] fp16) of keys pos, zero past end and in padded dims."""
    key_mask = pos < end
    rows = key_offsets(table, pos, n0, key_mask, stride_cb, stride_cp, BLOCK_SIZE, TILE)
    offsets = rows[:, None] + dims[None, :]
    mask = key_mask[:, None]
    if HEAD_DIM != DIM_PAD:
        mask = mask & (dims[None, :] < HEAD_DIM)
    k = tl.load(k_ptr + offsets, mask=mask, other=0.0)
    v = tl.load(v_ptr + offsets, mask=mask, other=0.0)
    return k.to(tl.float16), v.to(tl.float16)


@triton.jit
def _per_head(x):
    """x with a last dim of 2, one copy per query head. A join keeps x's register layout; expand_dims
    + broadcast would move every loaded tile through shared memory."""
    return tl.join(x, x)


@triton.jit
def _load_queries(q_ptr, stride_qh, dims, HEAD_DIM: tl.constexpr, GROUP: tl.constexpr):
    """[DIM_PAD, 2] fp32 queries of one kv head's group (the second zero when GROUP is 1)."""
    mask = dims < HEAD_DIM
    first = tl.load(q_ptr + dims, mask=mask, other=0.0)
    second = tl.load(q_ptr + stride_qh + dims, mask=mask & (GROUP > 1), other=0.0)
    return tl.join(first, second).to(tl.float32)


# The block table's width follows each step's longest sequence: specialized (Triton compiles apart values 1
# and multiples of 16), a new width could compile a kernel variant inside timed work.
@triton.jit(do_not_specialize=["stride_bt"])
def cuda_core_split_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    context_lens_ptr,
    out_ptr,
    part_out_ptr,
    part_lse_ptr,
    k_scale_ptr,
    v_scale_ptr,
    qk_scale,
    num_splits,
    stride_qb,
    stride_qh,
    stride_cb,
    stride_cp,
    stride_ch,
    stride_bt,
    stride_ob,
    stride_oh,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    ROWS: tl.constexpr,
    LANES: tl.constexpr,
    PER_LOAD: tl.constexpr,
    SINGLE_SPLIT: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """One (sequence, kv head, split): the GROUP (1 or 2) query heads over one slice of the context."""
    TILE: tl.constexpr = ROWS * LANES
    wait_for_previous(PDL)
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    start, end = split_bounds(context_lens_ptr, seq, split, num_splits, TILE)

    dims = tl.arange(0, DIM_PAD)
    first_head = kv_head * GROUP
    q_row = q_ptr + seq.to(tl.int64) * stride_qb + first_head * stride_qh
    q = _load_queries(q_row, stride_qh, dims, HEAD_DIM, GROUP)
    q = (q * (qk_scale * tl.load(k_scale_ptr))).to(tl.float16)

    keys = tl.arange(0, TILE)
    m = tl.full([LANES, 2], float("-inf"), tl.float32)
    den = tl.full([LANES, 2], 0.0, tl.float32)
    acc = tl.full([LANES, DIM_PAD, 2], 0.0, tl.float32)
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    k_cache_ptr += kv_head * stride_ch
    v_cache_ptr += kv_head * stride_ch
    for n0 in range(start, end, TILE):
        pos = n0 + keys
        k, v = _load_kv(
            k_cache_ptr,
            v_cache_ptr,
            table,
            pos,
            n0,
            end,
            dims,
            stride_cb,
            stride_cp,
            HEAD_DIM,
            DIM_PAD,
            BLOCK_SIZE,
            TILE,
        )
        qk = tl.reshape(_per_head(k) * q[None, :, :], [TILE, DIM_PAD // PER_LOAD, PER_LOAD, 2])
        s = tl.reduce(tl.reduce(qk, 2, sum_combine).to(tl.float32), 1, sum_combine)
        s = tl.reshape(tl.where((pos < end)[:, None], s, float("-inf")), [ROWS, LANES, 2])
        m_new = tl.maximum(m, tl.reduce(s, 0, max_combine))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # a lane with no key yet
        alpha = tl.exp2(m - m_ref)
        p = tl.exp2(s - m_ref[None, :, :])
        den = den * alpha + tl.reduce(p, 0, sum_combine)
        pv = tl.reshape(p.to(tl.float16), [TILE, 2])[:, None, :] * _per_head(v)
        pv = tl.reduce(tl.reshape(pv, [ROWS, LANES, DIM_PAD, 2]), 0, sum_combine)
        acc = acc * alpha[:, None, :] + pv.to(tl.float32)
        m = m_new

    top = tl.reduce(m, 0, max_combine)
    top_ref = tl.where(top == float("-inf"), 0.0, top)
    weight = tl.exp2(m - top_ref[None, :])
    total = tl.reduce(den * weight, 0, sum_combine)
    out = tl.reduce(acc * weight[:, None, :], 0, sum_combine) / tl.where(total > 0.0, total, 1.0)[None, :]
    out = tl.trans(out * tl.load(v_scale_ptr))
    group = tl.arange(0, 2)
    store_split(
        out,
        top,
        total,
        out_ptr,
        part_out_ptr,
        part_lse_ptr,
        seq,
        split,
        num_splits,
        first_head + group,
        group < GROUP,
        dims,
        stride_ob,
        stride_oh,
        GROUP,
        HEAD_DIM,
        DIM_PAD,
        SINGLE_SPLIT,
    )
