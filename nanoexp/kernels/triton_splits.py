"""What the paged attention kernels share: key offsets, split bounds and stores, the split reduce.

The kernels avoid the @jit helpers of triton.language.standard (tl.max, tl.sum, tl.zeros, tl.cdiv):
they break the CPU interpreter when triton was imported before TRITON_INTERPRET=1 was set."""

from __future__ import annotations

import triton
import triton.language as tl

from nanoexp.kernels.triton_pdl import wait_for_previous

# tl.max / tl.sum via tl.reduce with the same combine functions; the interpreter recognizes
# these two and reduces with numpy instead of element by element.
max_combine = tl.standard._elementwise_max
sum_combine = tl.standard._sum_combine


@triton.jit
def key_offsets(
    table_ptr, pos, n0, key_mask, stride_cb, stride_cp, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr
):
    """Element offset of each key row `pos` (a tile starting at n0) inside the paged cache."""
    if BLOCK_SIZE >= BLOCK_N:
        # n0 is a multiple of BLOCK_N, so the whole tile sits in one page.
        page = tl.load(table_ptr + n0 // BLOCK_SIZE).to(tl.int64)
    else:
        page = tl.load(table_ptr + pos // BLOCK_SIZE, mask=key_mask, other=0).to(tl.int64)
    return page * stride_cb + (pos % BLOCK_SIZE) * stride_cp


@triton.jit
def split_bounds(context_lens_ptr, seq, split, num_splits, TILE: tl.constexpr):
    """[start, end) of one split's keys: slices of a multiple of TILE (the last ones short or empty)."""
    ctx = tl.load(context_lens_ptr + seq)
    per_split = (ctx + num_splits - 1) // num_splits
    split_len = (per_split + TILE - 1) // TILE * TILE
    start = split * split_len
    return start, tl.minimum(start + split_len, ctx)


@triton.jit
def store_split(
    out,
    m,
    den,
    out_ptr,
    part_out_ptr,
    part_lse_ptr,
    seq,
    split,
    num_splits,
    heads,
    row_mask,
    dims,
    stride_ob,
    stride_oh,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    SINGLE_SPLIT: tl.constexpr,
):
    """One split's normalized rows `out` of query heads `heads` (softmax max m, denominator den): the
    output with one split, else partials and lse ([seqs, heads, splits, (DIM_PAD)] fp32)."""
    store_mask = row_mask[:, None] & (dims[None, :] < HEAD_DIM)
    if SINGLE_SPLIT:
        o_ptrs = out_ptr + seq.to(tl.int64) * stride_ob + heads[:, None] * stride_oh + dims[None, :]
        tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=store_mask)
    else:
        part = (seq.to(tl.int64) * (GROUP * tl.num_programs(1)) + heads) * num_splits + split
        tl.store(part_out_ptr + part[:, None] * DIM_PAD + dims[None, :], out, mask=store_mask)
        lse = tl.where(den > 0.0, m + tl.log2(tl.where(den > 0.0, den, 1.0)), float("-inf"))
        tl.store(part_lse_ptr + part, lse, mask=row_mask)


@triton.jit
def decode_reduce_kernel(
    part_out_ptr,
    part_lse_ptr,
    out_ptr,
    num_splits,
    stride_ob,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """Combine one (sequence, head)'s splits; read through L2 (.cg): this SM may hold stale lines."""
    wait_for_previous(PDL)
    seq, head, num_heads = tl.program_id(0), tl.program_id(1), tl.num_programs(1)
    splits = tl.arange(0, SPLITS_PAD)
    dims = tl.arange(0, DIM_PAD)
    split_mask = splits < num_splits
    base = (seq.to(tl.int64) * num_heads + head) * num_splits
    lse = tl.load(part_lse_ptr + base + splits, mask=split_mask, other=float("-inf"), cache_modifier=".cg")
    m = tl.reduce(lse, 0, max_combine)
    m = tl.where(m == float("-inf"), 0.0, m)  # context of length 0 gives zeros, not NaN
    w = tl.exp2(lse - m)
    o_mask = split_mask[:, None] & (dims[None, :] < HEAD_DIM)
    o_ptrs = part_out_ptr + (base + splits)[:, None] * DIM_PAD + dims[None, :]
    o = tl.load(o_ptrs, mask=o_mask, other=0.0, cache_modifier=".cg")
    total = tl.reduce(w, 0, sum_combine)
    out = tl.reduce(w[:, None] * o, 0, sum_combine) / tl.where(total > 0.0, total, 1.0)
    out_ptrs = out_ptr + seq.to(tl.int64) * stride_ob + head * stride_oh + dims
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=dims < HEAD_DIM)
