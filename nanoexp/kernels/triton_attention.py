"""Triton paged attention: split-K decode (flash-decoding) and varlen causal prefill.

Caches are [num_blocks, block_size, kv_heads, head_dim], contiguous last dim, K and V of the same
strides. Softmax is fp32 in the log2 domain (scores pre-multiplied by log2(e)). An fp8 cache
(kernels/base.py) is widened in registers (exact), its scales folded in: k_scale into the score
scale, v_scale into the output (KV_FP8; other caches unchanged). No tl.max / tl.sum or other
@jit helpers of triton.language.standard (kernels/triton_splits.py says why)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nanoexp.kernels import pdl
from nanoexp.kernels.base import check_scales, num_sms
from nanoexp.kernels.prefill_tiles import prefill_config as _prefill_config
from nanoexp.kernels.triton_decode_fma import cuda_core_split_kernel, tile_shape
from nanoexp.kernels.triton_pdl import wait_for_previous
from nanoexp.kernels.triton_splits import (
    decode_reduce_kernel,
    key_offsets,
    max_combine,
    split_bounds,
    store_split,
    sum_combine,
)

LOG2E = 1.4426950408889634
MIN_KEYS_PER_SPLIT = 64
MAX_SPLITS = 64
FP8_SMALL_TILE_MAX_BATCH = 64
CUDA_CORE_TILE, CUDA_CORE_WARPS = 128, 4  # keys per tile, warps (decode_cuda_cores.md)
CUDA_CORE_MAX_GROUP, CUDA_CORE_MAX_HEAD_DIM = 2, 128
CUDA_CORE_MIN_BATCH = 8


@triton.jit
def _load_rows(ptr, rows, dims, row_mask, HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr, stride_d=1):
    """Load a [len(rows), DIM_PAD] tile; rows are element offsets, padded dims read as zero."""
    ptrs = ptr + rows[:, None] + dims[None, :] * stride_d
    if HEAD_DIM == DIM_PAD:
        return tl.load(ptrs, mask=row_mask[:, None], other=0.0)
    else:
        return tl.load(ptrs, mask=row_mask[:, None] & (dims[None, :] < HEAD_DIM), other=0.0)


@triton.jit
def _widen_fp8_values(v, key_mask):
    """An fp8 V tile [keys, dims] as fp16, widened before it is staged for P @ V. A bare conversion
    is placed after staging, where every thread gathers single bytes (ldmatrix has no 8-bit
    transpose); the product with the exact key mask keeps it here (experiments/kernels/runs)."""
    return v.to(tl.float16) * key_mask.to(tl.float16)[:, None]


@triton.jit
def _online_softmax_step(s, m, den, acc, v):
    """Fold one tile of log2-domain scores s [M, N] and values v [N, D] into (m, den, acc)."""
    m_new = tl.maximum(m, tl.reduce(s, 1, max_combine))
    alpha = tl.exp2(m - m_new)
    p = tl.exp2(s - m_new[:, None])
    den = den * alpha + tl.reduce(p, 1, sum_combine)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
    return m_new, den, acc


@triton.jit
def _attend_tile(
    q,
    m,
    den,
    acc,
    k_cache_ptr,
    v_cache_ptr,
    table,
    n0,
    end,
    dims,
    kv_head,
    qk_scale,
    stride_cb,
    stride_cp,
    stride_ch,
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    KV_FP8: tl.constexpr,
):
    """Fold the keys n0 .. n0 + BLOCK_N (those below end) of one kv head into (m, den, acc)."""
    pos = n0 + tl.arange(0, BLOCK_N)
    key_mask = pos < end
    kv_rows = key_offsets(table, pos, n0, key_mask, stride_cb, stride_cp, BLOCK_SIZE, BLOCK_N)
    kv_rows += kv_head * stride_ch
    k = _load_rows(k_cache_ptr, kv_rows, dims, key_mask, HEAD_DIM, DIM_PAD).to(q.dtype)
    v = _load_rows(v_cache_ptr, kv_rows, dims, key_mask, HEAD_DIM, DIM_PAD)
    v = _widen_fp8_values(v, key_mask) if KV_FP8 else v.to(q.dtype)
    s = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
    s = tl.where(key_mask[None, :], s, float("-inf"))
    return _online_softmax_step(s, m, den, acc, v)


# The block table's width follows each step's longest sequence: specialized (Triton compiles apart values 1
# and multiples of 16), a new width could compile a kernel variant inside timed work.
@triton.jit(do_not_specialize=["stride_bt"])
def _decode_split_kernel(
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
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SINGLE_SPLIT: tl.constexpr,
    KV_FP8: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """One (sequence, kv head, split): all GROUP query heads attend to one slice of the context."""
    wait_for_previous(PDL)
    if KV_FP8:
        qk_scale = qk_scale * tl.load(k_scale_ptr)
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    start, end = split_bounds(context_lens_ptr, seq, split, num_splits, BLOCK_N)

    rows = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, DIM_PAD)
    heads = kv_head * GROUP + rows
    row_mask = rows < GROUP
    q_rows = seq.to(tl.int64) * stride_qb + heads * stride_qh
    q = _load_rows(q_ptr, q_rows, dims, row_mask, HEAD_DIM, DIM_PAD)
    if KV_FP8:
        # e4m3 widens to fp16 in one instruction per pair, to bf16 only through fp32; the products
        # are fp16 x fp16 with fp32 sums (q and the probabilities sit well inside fp16's range)
        q = q.to(tl.float16)

    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    den = tl.full([GROUP_PAD], 0.0, tl.float32)
    acc = tl.full([GROUP_PAD, DIM_PAD], 0.0, tl.float32)
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    for n0 in range(start, end, BLOCK_N):
        m, den, acc = _attend_tile(
            q,
            m,
            den,
            acc,
            k_cache_ptr,
            v_cache_ptr,
            table,
            n0,
            end,
            dims,
            kv_head,
            qk_scale,
            stride_cb,
            stride_cp,
            stride_ch,
            HEAD_DIM,
            DIM_PAD,
            BLOCK_SIZE,
            BLOCK_N,
            KV_FP8,
        )

    out = acc / tl.where(den > 0.0, den, 1.0)[:, None]
    if KV_FP8:
        out = out * tl.load(v_scale_ptr)
    store_split(
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
        GROUP,
        HEAD_DIM,
        DIM_PAD,
        SINGLE_SPLIT,
    )


def choose_num_splits(batch: int, num_kv_heads: int, max_len: int, num_sms: int) -> int:
    """Enough splits that batch * kv_heads * splits programs fill the GPU about twice (on an H200,
    4x cost time from 64 sequences on: experiments/kernels/runs/decode_splits.md)."""
    programs = batch * num_kv_heads
    want = triton.cdiv(2 * num_sms, programs)
    useful = max(1, max_len // MIN_KEYS_PER_SPLIT)
    return max(1, min(want, useful, MAX_SPLITS))


def supports_cuda_cores(fp8: bool, group: int, head_dim: int) -> bool:
    """fp8, few query heads per kv head, head_dim small enough (larger heads would spill registers)."""
    return fp8 and group <= CUDA_CORE_MAX_GROUP and head_dim <= CUDA_CORE_MAX_HEAD_DIM


def uses_cuda_cores(fp8: bool, group: int, head_dim: int, batch: int) -> bool:
    """Whether paged_decode runs kernels/triton_decode_fma.py: on an H200 at Qwen3-0.6B's shapes it
    takes 256 x 1,024 from 185 to 146-151 us (1.14-1.18x its floor), 64 x 2,048 from 102 to 72; at
    1-4 sequences, or 4 query heads per kv head, the tensor-core kernel is as fast or faster
    (experiments/kernels/runs/decode_cuda_cores.md)."""
    return supports_cuda_cores(fp8, group, head_dim) and batch >= CUDA_CORE_MIN_BATCH


def decode_tile(dim_pad: int, fp8: bool, device: torch.device, batch: int) -> tuple[int, int]:
    """(keys per tile, pipeline stages), measured on an H200 at head_dim 128: 16-bit tiles take a
    third stage on Hopper (252 -> 243 us at 256 x 1,024); fp8 tiles 3 stages on Hopper, and 128 keys
    above batch 64 (198 -> 185 us at 256 x 1,024), 64 up to it (62 -> 54 us at 64 x 1,024;
    experiments/kernels/runs/decode_tiles.md)."""
    if dim_pad > 128:
        return 32, 2
    keys = 128 if fp8 and batch > FP8_SMALL_TILE_MAX_BATCH else 64
    return keys, 3 if pdl.supported(device) else 2


def paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    max_len: int | None = None,
    num_splits: int | None = None,
    block_n: int | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    cuda_cores: bool | None = None,
) -> torch.Tensor:
    """q [B, H, D] attends to its first context_lens[b] cached keys; returns [B, H, D]. max_len
    (default: the block table's capacity) only steers the split count, which does not change the
    result. cuda_cores: None = `uses_cuda_cores`; block_n, num_warps, num_stages: benchmark sweeps."""
    batch, num_heads, head_dim = q.shape
    num_kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    _check_cache(q, k_cache, v_cache, num_heads, num_kv_heads)
    fp8 = check_scales(k_cache, k_scale, v_scale)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if batch == 0:
        return out
    group = num_heads // num_kv_heads
    dim_pad = max(16, triton.next_power_of_2(head_dim))
    if cuda_cores is None:
        cuda_cores = uses_cuda_cores(fp8, group, head_dim, batch)
    elif cuda_cores and not supports_cuda_cores(fp8, group, head_dim):
        raise ValueError(
            f"paged_decode(cuda_cores=True) needs an fp8 cache, at most {CUDA_CORE_MAX_GROUP} query heads "
            f"per kv head and head_dim <= {CUDA_CORE_MAX_HEAD_DIM}; got {k_cache.dtype}, {group} heads "
            f"per kv head, head_dim {head_dim}"
        )
    if cuda_cores:
        num_warps, num_stages = num_warps or CUDA_CORE_WARPS, num_stages or 1
        rows, lanes, per_load = tile_shape(block_n or CUDA_CORE_TILE, dim_pad, num_warps)
        kernel, variant = cuda_core_split_kernel, dict(ROWS=rows, LANES=lanes, PER_LOAD=per_load)
    else:
        tile_keys, tile_stages = decode_tile(dim_pad, fp8, q.device, batch)
        num_warps, num_stages = num_warps or 4, num_stages or tile_stages
        kernel, block_n = _decode_split_kernel, block_n or tile_keys
        variant = dict(GROUP_PAD=max(16, triton.next_power_of_2(group)), BLOCK_N=block_n, KV_FP8=fp8)
    if num_splits is None:
        max_len = max_len or block_tables.shape[1] * block_size
        num_splits = choose_num_splits(batch, num_kv_heads, max_len, num_sms(q.device))
    part_out = part_lse = out
    if num_splits > 1:
        part_out = torch.empty((batch, num_heads, num_splits, dim_pad), dtype=torch.float32, device=q.device)
        part_lse = torch.empty((batch, num_heads, num_splits), dtype=torch.float32, device=q.device)
    launch = pdl.launch_options()
    kernel[(batch, num_kv_heads, num_splits)](
        q,
        k_cache,
        v_cache,
        block_tables,
        context_lens,
        out,
        part_out,
        part_lse,
        k_scale if fp8 else context_lens,
        v_scale if fp8 else context_lens,  # unused unless fp8
        scale * LOG2E,
        num_splits,
        q.stride(0),
        q.stride(1),
        *k_cache.stride()[:3],
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        GROUP=group,
        HEAD_DIM=head_dim,
        DIM_PAD=dim_pad,
        BLOCK_SIZE=block_size,
        SINGLE_SPLIT=num_splits == 1,
        num_warps=num_warps,
        num_stages=num_stages,
        **variant,
        **launch,
    )
    if num_splits > 1:
        decode_reduce_kernel[(batch, num_heads)](
            part_out,
            part_lse,
            out,
            num_splits,
            out.stride(0),
            out.stride(1),
            HEAD_DIM=head_dim,
            DIM_PAD=dim_pad,
            SPLITS_PAD=triton.next_power_of_2(num_splits),
            num_warps=4,
            **launch,
        )
    return out


@triton.jit
def _prefill_tiles(
    q,
    m,
    den,
    acc,
    k_ptr,
    v_ptr,
    table,
    k_base,
    v_base,
    q_pos,
    dims,
    n_start,
    n_end,
    ctx,
    qk_scale,
    stride_kt,
    stride_vt,
    stride_cb,
    stride_cp,
    stride_vb,
    stride_vp,
    stride_vd,
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGED: tl.constexpr,
    CAUSAL_MASK: tl.constexpr,
):
    """Fold keys [n_start, n_end) into the running softmax; n_start is a multiple of BLOCK_N."""
    for n0 in range(n_start, n_end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        key_mask = pos < ctx
        if PAGED:
            k_rows = key_offsets(table, pos, n0, key_mask, stride_cb, stride_cp, BLOCK_SIZE, BLOCK_N)
            v_rows = key_offsets(table, pos, n0, key_mask, stride_vb, stride_vp, BLOCK_SIZE, BLOCK_N)
            k_rows, v_rows = k_rows + k_base, v_rows + v_base
        else:
            k_rows = pos.to(tl.int64) * stride_kt + k_base
            v_rows = pos.to(tl.int64) * stride_vt + v_base
        k = _load_rows(k_ptr, k_rows, dims, key_mask, HEAD_DIM, DIM_PAD).to(q.dtype)
        v = _load_rows(v_ptr, v_rows, dims, key_mask, HEAD_DIM, DIM_PAD, stride_vd).to(q.dtype)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
        if CAUSAL_MASK:
            visible = (pos[None, :] <= q_pos[:, None]) & key_mask[None, :]
            s = tl.where(visible, s, float("-inf"))
        m, den, acc = _online_softmax_step(s, m, den, acc, v)
    return m, den, acc


@triton.jit(do_not_specialize=["stride_bt"])
def _prefill_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    cu_seqlens_q_ptr,
    context_lens_ptr,
    block_tables_ptr,
    k_scale_ptr,
    v_scale_ptr,
    tiles_ptr,
    qk_scale,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cb,
    stride_cp,
    stride_vb,
    stride_vp,
    stride_vd,
    stride_ot,
    stride_oh,
    stride_bt,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGED: tl.constexpr,
    KV_FP8: tl.constexpr,
    TILED: tl.constexpr,
):
    """One (query tile, sequence, kv head): the GROUP query heads of the kv head over BLOCK_M queries,
    one row per (query, head), so each key tile is loaded once for the group. Query j sits at position
    ctx - q_len + j. PAGED: K/V through the block table, else this step's packed rows (own strides: v
    is often a view into qkv). TILED: program (kv head, t) runs row t of the tile table
    (`prefill_tiles`; sequence -1: no work), a fixed grid for CUDA graphs; kv heads vary fastest, so
    real rows are dispatched before padding."""
    if KV_FP8:
        qk_scale = qk_scale * tl.load(k_scale_ptr)
    if TILED:
        tile = tiles_ptr + tl.program_id(1) * 4
        seq = tl.load(tile)
        if seq < 0:
            return
        q_start = tl.load(tile + 1)
        q_len = tl.load(tile + 2)
        m_block = tl.load(tile + 3)
        kv_head = tl.program_id(0)
    else:
        m_block = tl.program_id(0)
        seq = tl.program_id(1)
        kv_head = tl.program_id(2)
        q_start = tl.load(cu_seqlens_q_ptr + seq)
        q_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_start
        if m_block * BLOCK_M >= q_len:
            return
    if PAGED:
        ctx = tl.load(context_lens_ptr + seq)
        k_base = kv_head * stride_kh
        v_base = kv_head * stride_vh
    else:
        ctx = q_len
        k_base = q_start.to(tl.int64) * stride_kt + kv_head * stride_kh
        v_base = q_start.to(tl.int64) * stride_vt + kv_head * stride_vh
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt

    ROWS: tl.constexpr = BLOCK_M * GROUP_PAD
    rows = tl.arange(0, ROWS)
    offs_m = m_block * BLOCK_M + rows // GROUP_PAD  # each row's query
    heads = kv_head * GROUP + rows % GROUP_PAD
    dims = tl.arange(0, DIM_PAD)
    row_mask = (offs_m < q_len) & (rows % GROUP_PAD < GROUP)
    q_rows = (q_start + offs_m).to(tl.int64) * stride_qt + heads * stride_qh
    q = _load_rows(q_ptr, q_rows, dims, row_mask, HEAD_DIM, DIM_PAD)
    q_pos = ctx - q_len + offs_m

    m = tl.full([ROWS], float("-inf"), tl.float32)
    den = tl.full([ROWS], 0.0, tl.float32)
    acc = tl.full([ROWS, DIM_PAD], 0.0, tl.float32)
    first_pos = ctx - q_len + m_block * BLOCK_M
    full_end = (first_pos // BLOCK_N) * BLOCK_N  # keys below it are visible to every row
    diag_end = tl.minimum(first_pos + BLOCK_M, ctx)
    m, den, acc = _prefill_tiles(
        q,
        m,
        den,
        acc,
        k_ptr,
        v_ptr,
        table,
        k_base,
        v_base,
        q_pos,
        dims,
        0,
        full_end,
        ctx,
        qk_scale,
        stride_kt,
        stride_vt,
        stride_cb,
        stride_cp,
        stride_vb,
        stride_vp,
        stride_vd,
        HEAD_DIM,
        DIM_PAD,
        BLOCK_SIZE,
        BLOCK_N,
        PAGED,
        False,
    )
    m, den, acc = _prefill_tiles(
        q,
        m,
        den,
        acc,
        k_ptr,
        v_ptr,
        table,
        k_base,
        v_base,
        q_pos,
        dims,
        full_end,
        diag_end,
        ctx,
        qk_scale,
        stride_kt,
        stride_vt,
        stride_cb,
        stride_cp,
        stride_vb,
        stride_vp,
        stride_vd,
        HEAD_DIM,
        DIM_PAD,
        BLOCK_SIZE,
        BLOCK_N,
        PAGED,
        True,
    )

    out = acc / tl.where(den > 0.0, den, 1.0)[:, None]
    if KV_FP8:
        out = out * tl.load(v_scale_ptr)
    o_ptrs = out_ptr + ((q_start + offs_m).to(tl.int64) * stride_ot + heads * stride_oh)[:, None]
    o_ptrs += dims[None, :]
    o_mask = row_mask[:, None] & (dims[None, :] < HEAD_DIM)
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=o_mask)


def varlen_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    max_seqlen_q: int,
    context_lens: torch.Tensor | None,
    block_tables: torch.Tensor | None,
    scale: float,
    block_m: int | None = None,
    block_n: int | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    tiles: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> torch.Tensor:
    """Causal attention of packed queries q [T, H, D]. With block_tables, k/v are the paged caches
    and sequence i's context its first context_lens[i] positions; without, k/v [T, kv_heads, D] are
    packed like q and each sequence sees only its new tokens. max_seqlen_q bounds every q length.
    tiles (paged only; `prefill_tiles` at BLOCK_M = `prefill_block_m(D, H, kv heads, T)`) replaces the
    grid by kv heads x n; rows of `out` no tile covers are left as they were. block_m (queries per tile)
    etc.: benchmark sweeps."""
    num_tokens, num_heads, head_dim = q.shape
    paged = block_tables is not None
    num_kv_heads = k.shape[2] if paged else k.shape[1]
    fp8 = paged and check_scales(k, k_scale, v_scale)
    if paged:  # stride_kt, stride_kh, stride_vt, stride_vh, then the caches' cb, cp, vb, vp, vd
        _check_cache(q, k, v, num_heads, num_kv_heads)
        kv_strides = (0, k.stride(2), 0, v.stride(2), *k.stride()[:2], *v.stride()[:2], v.stride(3))
    else:
        k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (k, v))
        assert q.stride(-1) == 1 and num_heads % num_kv_heads == 0
        kv_strides = (*k.stride()[:2], *v.stride()[:2], 0, 0, 0, 0, 1)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device) if out is None else out
    num_seqs = cu_seqlens_q.shape[0] - 1
    if num_tokens == 0 or num_seqs == 0:
        return out
    max_seqlen_q = min(max_seqlen_q, num_tokens)
    dim_pad = max(16, triton.next_power_of_2(head_dim))
    group = num_heads // num_kv_heads
    cfg_m, cfg_n, cfg_warps, cfg_stages = _prefill_config(head_dim, num_heads, num_kv_heads, num_tokens)
    block_m, block_n = block_m or cfg_m, block_n or cfg_n
    num_warps, num_stages = num_warps or cfg_warps, num_stages or cfg_stages
    grid: tuple[int, ...] = (triton.cdiv(max_seqlen_q, block_m), num_seqs, num_kv_heads)
    if tiles is not None:
        assert paged and tiles.dtype == torch.int32 and tiles.shape[1] == 4
        grid = (num_kv_heads, tiles.shape[0])
    _prefill_kernel[grid](
        q,
        k,
        v,
        out,
        cu_seqlens_q,
        context_lens if paged else cu_seqlens_q,
        block_tables if paged else cu_seqlens_q,
        k_scale if fp8 else cu_seqlens_q,
        v_scale if fp8 else cu_seqlens_q,  # unused unless KV_FP8
        cu_seqlens_q if tiles is None else tiles,  # unused unless TILED
        scale * LOG2E,
        q.stride(0),
        q.stride(1),
        *kv_strides,
        out.stride(0),
        out.stride(1),
        block_tables.stride(0) if block_tables is not None else 0,
        GROUP=group,
        GROUP_PAD=triton.next_power_of_2(group),
        HEAD_DIM=head_dim,
        DIM_PAD=dim_pad,
        BLOCK_SIZE=k.shape[1] if paged else 1,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        PAGED=paged,
        KV_FP8=fp8,
        TILED=tiles is not None,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return out


def _check_cache(q, k_cache, v_cache, num_heads: int, num_kv_heads: int) -> None:
    assert q.stride(-1) == 1, "q needs a contiguous last dim"
    assert k_cache.stride(-1) == 1 and k_cache.shape == v_cache.shape
    assert k_cache.stride() == v_cache.stride()
    assert k_cache.shape[-1] == q.shape[-1] and num_heads % num_kv_heads == 0
    bs = k_cache.shape[1]
    assert bs & (bs - 1) == 0, f"block size {bs} must be a power of two"
