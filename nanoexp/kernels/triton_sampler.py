"""One-pass sampling kernel: greedy and temperature draws read the logits once.

A draw from softmax(x / t) is argmax(x / t + g), g = -log(-log(u)) Gumbel noise, u from Philox keyed
by the row's seed and the vocabulary index: nothing materialized, a seeded row's draw independent of
the batch. GPU logs are the approximate lg2 (~1e-7 relative; the accurate log made the kernel
arithmetic-bound, experiments/nanovllm_bench/README.md). A second kernel picks across a row's
slices (ties to the lowest index, as torch.argmax). A TP rank scans its vocabulary shard (from
`vocab_offset`, the winners' scores into `values`): noise keyed by the full-vocabulary index makes the
best of the ranks' winners the whole-vocabulary draw. A row holding NaN or +inf, or only -inf, gets token
-1 (layers/sampler.py NON_FINITE) and under TP the score +inf, so it wins the ranks' comparison: the scan
notes non-finite values on the way, at no extra memory traffic."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nanoexp.kernels.pdl import launch_options
from nanoexp.kernels.triton_pdl import wait_for_previous

BLOCK = 1024
CHECK_FINITE = True  # False only for the with/without timing of experiments/reliability/gpu_check.sh
TARGET_PROGRAMS = 4096  # short slices: each program's loop is load-latency bound
MAX_SLICES = 64  # a power of two: the pick kernel reads this many slots per row


@triton.jit
def _best(values, indices):
    """Largest value and its lowest index."""
    top = tl.max(values, axis=0)
    index = tl.min(tl.where(values == top, indices, 2147483647), axis=0)
    return top, index


@triton.jit
def _uniforms(seed, first_group, BLOCK: tl.constexpr):
    """BLOCK uniforms in [0, 1) from token 4 * first_group: token 4g + j takes Philox(seed, g)[j]."""
    groups = first_group + tl.arange(0, BLOCK // 4)
    r0, r1, r2, r3 = tl.randint4x(seed, groups)
    bits = tl.reshape(tl.join(tl.join(r0, r2), tl.join(r1, r3)), [BLOCK])
    return tl.random.uint_to_uniform_float(bits)


@triton.jit
def _log2(x, FAST: tl.constexpr):
    if FAST:
        return tl.inline_asm_elementwise(
            "lg2.approx.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1
        )
    return tl.log2(x)


@triton.jit
def _gumbel(u, FAST_LOG: tl.constexpr):
    """-log(-log(u)), through log2."""
    LN2: tl.constexpr = 0.6931471805599453
    return -LN2 * _log2(-LN2 * _log2(u, FAST_LOG), FAST_LOG)


@triton.jit(do_not_specialize=["stride_row", "vocab_size", "slice_len", "num_slices", "vocab_offset"])
def _sample_slice_kernel(
    logits_ptr,
    stride_row,
    temperature_ptr,
    seed_ptr,
    part_ptr,  # float32 [rows, slices, 2]: best sampled score, best logit
    part_index_ptr,  # int32 [rows, slices, 2]; -1 in both where the slice holds NaN or +inf
    vocab_size,
    slice_len,
    num_slices,
    vocab_offset,  # the full-vocabulary index of column 0
    BLOCK: tl.constexpr,
    FAST_LOG: tl.constexpr = True,
    PDL: tl.constexpr = False,
    CHECK_FINITE: tl.constexpr = True,
):
    wait_for_previous(PDL)
    row = tl.program_id(0)
    part = tl.program_id(1)
    temperature = tl.load(temperature_ptr + row)
    inv_temperature = 1.0 / tl.maximum(temperature, 1e-6)
    seed = tl.load(seed_ptr + row)
    row_logits = logits_ptr + row.to(tl.int64) * stride_row
    lanes = tl.arange(0, BLOCK)
    best_score = tl.full([BLOCK], float("-inf"), tl.float32)
    best_score_index = tl.zeros([BLOCK], tl.int32)
    best_logit = tl.full([BLOCK], float("-inf"), tl.float32)
    best_logit_index = tl.zeros([BLOCK], tl.int32)
    non_finite = tl.zeros([BLOCK], tl.int32)
    start = part * slice_len
    end = tl.minimum(start + slice_len, vocab_size)
    # Tiles start at full-vocabulary ids that are multiples of 4, so every shard draws the same
    # four uniforms for the same four tokens whatever its vocab_offset.
    first = (start + vocab_offset) // 4 * 4
    for tile in range(first, end + vocab_offset, BLOCK):
        index = tile + lanes
        local = index - vocab_offset
        inside = (local >= start) & (local < end)
        x = tl.load(row_logits + local, mask=inside, other=float("-inf")).to(tl.float32)
        if CHECK_FINITE:
            non_finite |= ((x != x) | (x == float("inf"))).to(tl.int32)
        score = x * inv_temperature + _gumbel(_uniforms(seed, tile // 4, BLOCK), FAST_LOG)
        score = tl.where(inside, score, float("-inf"))
        better = score > best_score
        best_score = tl.where(better, score, best_score)
        best_score_index = tl.where(better, index, best_score_index)
        better = x > best_logit
        best_logit = tl.where(better, x, best_logit)
        best_logit_index = tl.where(better, index, best_logit_index)
    out = (row * num_slices + part) * 2
    score, score_index = _best(best_score, best_score_index)
    logit, logit_index = _best(best_logit, best_logit_index)
    bad = tl.max(non_finite, axis=0) > 0
    score_index = tl.where(bad, -1, score_index)
    logit_index = tl.where(bad, -1, logit_index)
    tl.store(part_ptr + out, score)
    tl.store(part_index_ptr + out, score_index)
    tl.store(part_ptr + out + 1, logit)
    tl.store(part_index_ptr + out + 1, logit_index)


@triton.jit(do_not_specialize=["num_slices"])
def _pick_kernel(
    part_ptr,
    part_index_ptr,
    temperature_ptr,
    out_ptr,
    value_ptr,
    num_slices,
    SLICES_PAD: tl.constexpr,
    WRITE_VALUE: tl.constexpr = False,
    PDL: tl.constexpr = False,
    CHECK_FINITE: tl.constexpr = True,
):
    """Each row's winner across slices (largest logit where t = 0); WRITE_VALUE: also its score. -1 (and
    the score +inf) where a slice saw NaN or +inf, or where the winner is -inf (every logit -inf)."""
    wait_for_previous(PDL)
    row = tl.program_id(0)
    slices = tl.arange(0, SLICES_PAD)
    inside = slices < num_slices
    base = (row * num_slices + slices) * 2
    greedy = tl.load(temperature_ptr + row) == 0
    which = tl.where(greedy, 1, 0)
    values = tl.load(part_ptr + base + which, mask=inside, other=float("-inf"))
    indices = tl.load(part_index_ptr + base + which, mask=inside, other=2147483647)
    value, index = _best(values, indices)
    if CHECK_FINITE:
        flagged = (tl.min(indices, axis=0) < 0) | (value == float("-inf"))
        index = tl.where(flagged, -1, index)
        value = tl.where(flagged, float("inf"), value)
    tl.store(out_ptr + row, index.to(tl.int64))
    if WRITE_VALUE:
        tl.store(value_ptr + row, value)


def sample(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    seeds: torch.Tensor,
    vocab_offset: int = 0,
    values: torch.Tensor | None = None,
) -> torch.Tensor:
    """int64 token per row: argmax where t = 0, else a draw from softmax(logits / t) seeded by `seeds`;
    columns start at token `vocab_offset`, and `values` (if given) receives each winner's score."""
    rows, vocab_size = logits.shape
    out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    if rows == 0:
        return out
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    # each row scanned in slices of a multiple of BLOCK tokens, about TARGET_PROGRAMS programs in all
    wanted = max(1, min(MAX_SLICES, TARGET_PROGRAMS // rows, triton.cdiv(vocab_size, BLOCK)))
    slice_len = triton.cdiv(triton.cdiv(vocab_size, wanted), BLOCK) * BLOCK
    slices = triton.cdiv(vocab_size, slice_len)
    parts = torch.empty((rows, slices, 2), dtype=torch.float32, device=logits.device)
    part_indices = torch.empty((rows, slices, 2), dtype=torch.int32, device=logits.device)
    _sample_slice_kernel[(rows, slices)](
        logits,
        logits.stride(0),
        temperatures,
        seeds,
        parts,
        part_indices,
        vocab_size,
        slice_len,
        slices,
        vocab_offset,
        BLOCK=BLOCK,
        FAST_LOG=logits.is_cuda,
        CHECK_FINITE=CHECK_FINITE,
        **launch_options(),
    )
    _pick_kernel[(rows,)](
        parts,
        part_indices,
        temperatures,
        out,
        out if values is None else values,
        slices,
        SLICES_PAD=MAX_SLICES,
        WRITE_VALUE=values is not None,
        CHECK_FINITE=CHECK_FINITE,
        **launch_options(),
    )
    return out
