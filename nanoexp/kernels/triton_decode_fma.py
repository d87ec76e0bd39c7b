"""Split-K decode on CUDA cores, for fp8 caches read by small query groups.

With GQA groups of 1-4 query heads a tensor-core tile of 16 rows is mostly padding, and P @ V
needs V along keys where the cache holds it along dims: an 8-bit V tile must be transposed
through shared memory, which no ldmatrix does for bytes. Here every product is an fp32 FMA in
registers, so V is used in the layout it is loaded in and nothing is staged.

A tile is [ROWS, LANES, dims]: each thread holds ROWS keys (registers) of one lane and 16 dims.
Each lane runs its own online softmax (max, denominator, [group, dims] sum) over the keys it
sees, so the loop reduces only across the threads that share a key's dims (q . k); lanes are
merged once, after the loop, as the splits of a split-K decode are.
"""

from __future__ import annotations

import triton
import triton.language as tl

from nanoexp.kernels.triton_attention import _combine_if_last_split, _max_combine, _sum_combine
from nanoexp.kernels.triton_pdl import wait_for_previous


@triton.jit
def _tile_rows(table, pos, n0, end, key_mask, stride_cb, stride_cp, BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr):
    """Element offset of each key `pos` (a tile starting at n0) in the paged cache; keys at or past
    end (a whole prefetched tile may be) read no page."""
    if BLOCK_SIZE >= TILE:
        page = tl.load(table + n0 // BLOCK_SIZE, mask=n0 < end, other=0).to(tl.int64)
    else:
        page = tl.load(table + pos // BLOCK_SIZE, mask=key_mask, other=0).to(tl.int64)
    return page * stride_cb + (pos % BLOCK_SIZE) * stride_cp


@triton.jit
def _load_kv(k_ptr, v_ptr, table, pos, n0, end, dims, stride_cb, stride_cp, HEAD_DIM: tl.constexpr,
             DIM_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr):
    """The K and V tiles ([TILE, DIM_PAD], as stored) of keys pos (a tile starting at n0); keys at or
    past end and padded dims read as zero (a tile wholly past end reads no memory)."""
    key_mask = pos < end
    rows = _tile_rows(table, pos, n0, end, key_mask, stride_cb, stride_cp, BLOCK_SIZE, TILE)
    offsets = rows[:, None] + dims[None, :]
    mask = key_mask[:, None]
    if HEAD_DIM != DIM_PAD:
        mask = mask & (dims[None, :] < HEAD_DIM)
    return tl.load(k_ptr + offsets, mask=mask, other=0.0), tl.load(v_ptr + offsets, mask=mask, other=0.0)


@triton.jit
def _repeat_minor(x, COPIES: tl.constexpr):
    """x with a new last dim of COPIES (2 or 4) equal copies, held in each thread's registers.

    Built with joins, whose layout follows x's: an expand_dims + broadcast would take Triton's
    default layout and move every loaded tile through shared memory."""
    x = tl.join(x, x)
    if COPIES == 4:
        x = tl.reshape(tl.join(x, x), [x.shape[0], x.shape[1], 4])
    return x


@triton.jit
def _load_queries(q_row, first_head, stride_qh, dims, HEAD_DIM: tl.constexpr, GROUP: tl.constexpr,
                  GROUP_P2: tl.constexpr):
    """[DIM_PAD, GROUP_P2] fp32 queries of one kv head's group (padded heads read as zero), in
    _repeat_minor's layout."""
    q0 = _load_query(q_row, first_head, 0, stride_qh, dims, HEAD_DIM, GROUP)
    q1 = _load_query(q_row, first_head, 1, stride_qh, dims, HEAD_DIM, GROUP)
    if GROUP_P2 == 2:
        q = tl.join(q0, q1)
    else:
        q2 = _load_query(q_row, first_head, 2, stride_qh, dims, HEAD_DIM, GROUP)
        q3 = _load_query(q_row, first_head, 3, stride_qh, dims, HEAD_DIM, GROUP)
        # join(join(a, c), join(b, d)) reshaped is [a, b, c, d] along the last dim
        q = tl.reshape(tl.join(tl.join(q0, q2), tl.join(q1, q3)), [q0.shape[0], 4])
    return q


@triton.jit
def _load_query(q_row, first_head, index: tl.constexpr, stride_qh, dims, HEAD_DIM: tl.constexpr,
                GROUP: tl.constexpr):
    mask = (dims < HEAD_DIM) & (index < GROUP)
    return tl.load(q_row + (first_head + index) * stride_qh + dims, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _decode_fma_split_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    context_lens_ptr,
    out_ptr,
    part_out_ptr,
    part_lse_ptr,
    counters_ptr,
    k_scale_ptr,
    v_scale_ptr,
    qk_scale,
    num_splits,
    stride_qb,
    stride_qh,
    stride_cb,
    stride_cp,
    stride_ch,
    stride_vb,
    stride_vh,
    stride_bt,
    stride_ob,
    stride_oh,
    GROUP: tl.constexpr,
    GROUP_P2: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    ROWS: tl.constexpr,
    LANES: tl.constexpr,
    SINGLE_SPLIT: tl.constexpr,
    FUSED_REDUCE: tl.constexpr = False,
    SPLITS_PAD: tl.constexpr = 1,
    PDL: tl.constexpr = False,
    PREFETCH: tl.constexpr = False,
    FP16_VALUES: tl.constexpr = False,
    FP16_KEYS: tl.constexpr = False,
):
    """One (sequence, kv head, split): all GROUP query heads attend to one slice of the context."""
    TILE: tl.constexpr = ROWS * LANES
    DIMS_PER_THREAD: tl.constexpr = 16 if DIM_PAD >= 16 else DIM_PAD  # one 16-byte load of fp8
    wait_for_previous(PDL)
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    ctx = tl.load(context_lens_ptr + seq)
    per_split = (ctx + num_splits - 1) // num_splits
    split_len = (per_split + TILE - 1) // TILE * TILE
    start = split * split_len
    end = tl.minimum(start + split_len, ctx)

    dims = tl.arange(0, DIM_PAD)
    first_head = kv_head * GROUP
    q_row = q_ptr + seq.to(tl.int64) * stride_qb
    q = _load_queries(q_row, first_head, stride_qh, dims, HEAD_DIM, GROUP, GROUP_P2)
    q = q * (qk_scale * tl.load(k_scale_ptr))

    keys = tl.arange(0, TILE)
    m = tl.full([LANES, GROUP_P2], float("-inf"), tl.float32)
    den = tl.full([LANES, GROUP_P2], 0.0, tl.float32)
    acc = tl.full([LANES, DIM_PAD, GROUP_P2], 0.0, tl.float32)
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    k_cache_ptr += kv_head * stride_ch
    v_cache_ptr += kv_head * stride_vh
    if PREFETCH:
        k_next, v_next = _load_kv(k_cache_ptr, v_cache_ptr, table, start + keys, start, end, dims, stride_cb,
                                  stride_cp, HEAD_DIM, DIM_PAD, BLOCK_SIZE, TILE)
    for n0 in range(start, end, TILE):
        pos = n0 + keys
        key_mask = pos < end
        if PREFETCH:
            k, v = k_next, v_next
            k_next, v_next = _load_kv(k_cache_ptr, v_cache_ptr, table, pos + TILE, n0 + TILE, end, dims,
                                      stride_cb, stride_cp, HEAD_DIM, DIM_PAD, BLOCK_SIZE, TILE)
        else:
            k, v = _load_kv(k_cache_ptr, v_cache_ptr, table, pos, n0, end, dims, stride_cb, stride_cp, HEAD_DIM,
                            DIM_PAD, BLOCK_SIZE, TILE)
        if FP16_KEYS:
            # products and each thread's sum of its own dims in fp16, the sum across threads in fp32
            qk = _repeat_minor(k.to(tl.float16), GROUP_P2) * q.to(tl.float16)[None, :, :]
            qk = tl.reduce(tl.reshape(qk, [TILE, DIM_PAD // DIMS_PER_THREAD, DIMS_PER_THREAD, GROUP_P2]), 2,
                           _sum_combine)
            s = tl.reduce(qk.to(tl.float32), 1, _sum_combine)
        else:
            s = tl.reduce(_repeat_minor(k.to(tl.float32), GROUP_P2) * q[None, :, :], 1, _sum_combine)
        s = tl.where(key_mask[:, None], s, float("-inf"))
        s = tl.reshape(s, [ROWS, LANES, GROUP_P2])
        m_new = tl.maximum(m, tl.reduce(s, 0, _max_combine))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # a lane with no key yet
        alpha = tl.exp2(m - m_ref)
        p = tl.exp2(s - m_ref[None, :, :])
        den = den * alpha + tl.reduce(p, 0, _sum_combine)
        if FP16_VALUES:
            # p <= 1 and |v| <= 448: a thread's ROWS products sum in fp16 before joining fp32
            pv = tl.reshape(p.to(tl.float16), [TILE, GROUP_P2])[:, None, :] * _repeat_minor(v.to(tl.float16), GROUP_P2)
            pv = tl.reduce(tl.reshape(pv, [ROWS, LANES, DIM_PAD, GROUP_P2]), 0, _sum_combine).to(tl.float32)
        else:
            pv = tl.reshape(p, [TILE, GROUP_P2])[:, None, :] * _repeat_minor(v.to(tl.float32), GROUP_P2)
            pv = tl.reduce(tl.reshape(pv, [ROWS, LANES, DIM_PAD, GROUP_P2]), 0, _sum_combine)
        acc = acc * alpha[:, None, :] + pv
        m = m_new

    top = tl.reduce(m, 0, _max_combine)
    top_ref = tl.where(top == float("-inf"), 0.0, top)
    weight = tl.exp2(m - top_ref[None, :])
    total = tl.reduce(den * weight, 0, _sum_combine)
    out = tl.reduce(acc * weight[:, None, :], 0, _sum_combine) / tl.where(total > 0.0, total, 1.0)[None, :]
    out = tl.trans(out * tl.load(v_scale_ptr))
    group = tl.arange(0, GROUP_P2)
    heads = first_head + group
    row_mask = group < GROUP
    store_mask = row_mask[:, None] & (dims[None, :] < HEAD_DIM)
    if SINGLE_SPLIT:
        o_ptrs = out_ptr + seq.to(tl.int64) * stride_ob + heads[:, None] * stride_oh + dims[None, :]
        tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=store_mask)
    else:
        part = (seq.to(tl.int64) * (GROUP * tl.num_programs(1)) + heads) * num_splits + split
        tl.store(part_out_ptr + part[:, None] * DIM_PAD + dims[None, :], out, mask=store_mask)
        lse = tl.where(total > 0.0, top + tl.log2(tl.where(total > 0.0, total, 1.0)), float("-inf"))
        tl.store(part_lse_ptr + part, lse, mask=row_mask)
        if FUSED_REDUCE:
            _combine_if_last_split(
                part_out_ptr, part_lse_ptr, out_ptr, counters_ptr, seq, kv_head, num_splits,
                stride_ob, stride_oh, GROUP, HEAD_DIM, DIM_PAD, SPLITS_PAD,
            )  # fmt: skip
