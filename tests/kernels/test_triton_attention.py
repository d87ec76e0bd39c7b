"""Triton attention kernels against the pure-torch reference backend.

Without CUDA the kernels run in the Triton CPU interpreter, so shapes stay tiny and dtypes are
fp16/fp32 (the interpreter mishandles bf16 dots). The `gpu` tests use real Qwen3 shapes in bf16.
"""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
import torch

triton = pytest.importorskip("triton")

# Without CUDA, conftest has turned the Triton interpreter on before anything imported triton.
from helpers import DEVICE, quick_first  # noqa: E402

from nanoexp.config import ExecutionConfig  # noqa: E402
from nanoexp.kernels import prefill_tiles as prefill_tiles_module  # noqa: E402
from nanoexp.kernels import triton_attention  # noqa: E402
from nanoexp.kernels.base import AttentionMetadata  # noqa: E402
from nanoexp.kernels.prefill_tiles import prefill_config, prefill_tiles  # noqa: E402
from nanoexp.kernels.select import make_attention_backend  # noqa: E402
from nanoexp.kernels.torch_ref import TorchAttentionBackend  # noqa: E402
from nanoexp.kernels.triton_backend import TritonAttentionBackend  # noqa: E402

# The interpreter's loops over tensor bounds trip a numpy deprecation warning.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

TOL = {torch.float32: 1e-4, torch.float16: 3e-3}


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def make_cache(num_blocks, block_size, kv_heads, head_dim, dtype, gen):
    shape = (num_blocks, block_size, kv_heads, head_dim)
    k = torch.randn(shape, generator=gen).to(DEVICE, dtype)
    v = torch.randn(shape, generator=gen).to(DEVICE, dtype)
    return k, v


def make_block_tables(ctx_lens, block_size, num_blocks, gen) -> torch.Tensor:
    """Distinct, shuffled pages per sequence; unused entries padded with 0."""
    need = [cdiv(n, block_size) for n in ctx_lens]
    pages = torch.randperm(num_blocks, generator=gen)[: sum(need)].tolist()
    table = torch.zeros(len(ctx_lens), max(need), dtype=torch.int32)
    for i, n in enumerate(need):
        table[i, :n] = torch.tensor(pages[:n], dtype=torch.int32)
        pages = pages[n:]
    return table.to(DEVICE)


def slots_for(table, ctx_lens, q_lens, block_size) -> torch.Tensor:
    slots = []
    for i, (ctx, ql) in enumerate(zip(ctx_lens, q_lens)):
        for pos in range(ctx - ql, ctx):
            slots.append(int(table[i, pos // block_size]) * block_size + pos % block_size)
    return torch.tensor(slots, dtype=torch.int64, device=DEVICE)


def prefill_metadata(ctx_lens, q_lens, table, block_size) -> AttentionMetadata:
    cu_q = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(ctx_lens).cumsum(0).tolist()], dtype=torch.int32)
    return AttentionMetadata(
        has_prefill=True,
        slot_mapping=slots_for(table, ctx_lens, q_lens, block_size),
        context_lens=torch.tensor(ctx_lens, dtype=torch.int32, device=DEVICE),
        block_tables=table,
        cu_seqlens_q=cu_q.to(DEVICE),
        cu_seqlens_k=cu_k.to(DEVICE),
        max_seqlen_q=max(q_lens),
        max_seqlen_k=max(ctx_lens),
        has_cached_prefix=any(c > q for c, q in zip(ctx_lens, q_lens)),
    )


def decode_metadata(ctx_lens, table) -> AttentionMetadata:
    return AttentionMetadata(
        has_prefill=False,
        slot_mapping=torch.zeros(len(ctx_lens), dtype=torch.int64, device=DEVICE),
        context_lens=torch.tensor(ctx_lens, dtype=torch.int32, device=DEVICE),
        block_tables=table,
        max_seqlen_k=max(ctx_lens),
    )


def assert_close(out, ref, dtype):
    assert out.dtype == dtype and out.shape == ref.shape
    assert torch.isfinite(out).all()
    tol = TOL[dtype]
    torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)


def rel_l2(out, ref) -> float:
    return float((out.float() - ref.float()).norm() / ref.float().norm())


# ---------------------------------------------------------------- store_kv


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("block_size", [1, 16])
def test_store_kv_skips_padding_slots(dtype, block_size):
    gen = torch.Generator().manual_seed(1)
    kv_heads, head_dim, num_blocks = 2, 40, 24
    num_tokens = 11
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[[2, 7, 10]] = -1
    # k/v as strided views into a fused qkv buffer, like the model produces them.
    qkv = torch.randn(num_tokens, 3 * kv_heads, head_dim, generator=gen).to(DEVICE, dtype)
    k, v = qkv[:, kv_heads : 2 * kv_heads], qkv[:, 2 * kv_heads :]
    poison = torch.full((num_blocks, block_size, kv_heads, head_dim), 7.5, dtype=dtype)
    k_cache, v_cache = poison.clone().to(DEVICE), poison.clone().to(DEVICE)
    k_ref, v_ref = poison.clone().to(DEVICE), poison.clone().to(DEVICE)
    slots = slots.to(DEVICE)

    TritonAttentionBackend().store_kv(k, v, k_cache, v_cache, slots)
    TorchAttentionBackend().store_kv(k, v, k_ref, v_ref, slots)

    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)
    written = torch.zeros(num_blocks * block_size, dtype=torch.bool)
    written[slots[slots >= 0].cpu()] = True
    flat = k_cache.view(-1, kv_heads, head_dim).cpu()
    assert (flat[~written] == 7.5).all()


# ---------------------------------------------------------------- decode


def run_decode(ctx_lens, heads, kv_heads, head_dim, block_size, dtype, seed=0, **kernel_kw):
    gen = torch.Generator().manual_seed(seed)
    num_blocks = sum(cdiv(n, block_size) for n in ctx_lens) + 3
    k_cache, v_cache = make_cache(num_blocks, block_size, kv_heads, head_dim, dtype, gen)
    table = make_block_tables(ctx_lens, block_size, num_blocks, gen)
    md = decode_metadata(ctx_lens, table)
    q = torch.randn(len(ctx_lens), heads, head_dim, generator=gen).to(DEVICE, dtype)
    scale = 2.0 / head_dim**0.5  # sharper than usual, to stress the online softmax
    ref = TorchAttentionBackend().decode(q.float(), k_cache.float(), v_cache.float(), md, scale)
    if kernel_kw:
        out = triton_attention.paged_decode(q, k_cache, v_cache, table, md.context_lens, scale, **kernel_kw)
    else:
        out = TritonAttentionBackend().decode(q, k_cache, v_cache, md, scale)
    return out, ref


@pytest.mark.parametrize(*quick_first("dtype", [torch.float32, torch.float16], quick=1))
@pytest.mark.parametrize(*quick_first("block_size", [1, 16, 64], quick=1))
@pytest.mark.parametrize(*quick_first("group", [1, 2, 3, 4], quick=1))
def test_decode_matches_reference(dtype, block_size, group):
    ctx_lens = [1, 77, min(2 * block_size + 5, 150), 150]
    kv_heads = 2
    out, ref = run_decode(ctx_lens, group * kv_heads, kv_heads, 32, block_size, dtype)
    assert_close(out, ref, dtype)
    out, ref = run_decode(ctx_lens, group * kv_heads, kv_heads, 32, block_size, dtype, num_splits=3)
    assert_close(out, ref, dtype)


@pytest.mark.parametrize(*quick_first("num_splits", [1, 2, 5, 64], quick=2))
def test_decode_any_split_count_gives_same_result(num_splits):
    ctx_lens = [1, 64, 65, 200]
    out, ref = run_decode(ctx_lens, 4, 2, 32, 16, torch.float16, num_splits=num_splits)
    assert_close(out, ref, torch.float16)


@pytest.mark.parametrize(*quick_first("head_dim", [16, 40, 128], quick=1))
def test_decode_head_dims(head_dim):
    out, ref = run_decode([3, 90], 4, 2, head_dim, 16, torch.float16, seed=head_dim)
    assert_close(out, ref, torch.float16)


def test_decode_large_block_tile_inside_page():
    out, ref = run_decode([5, 300], 8, 2, 32, 256, torch.float16, num_splits=3, block_n=32)
    assert_close(out, ref, torch.float16)


def test_decode_empty_context_gives_zeros():
    gen = torch.Generator().manual_seed(3)
    k_cache, v_cache = make_cache(4, 16, 2, 32, torch.float32, gen)
    table = torch.tensor([[1], [2]], dtype=torch.int32, device=DEVICE)
    q = torch.randn(2, 4, 32, generator=gen).to(DEVICE)
    lens = torch.tensor([0, 5], dtype=torch.int32, device=DEVICE)
    for splits in (1, 3):
        out = triton_attention.paged_decode(q, k_cache, v_cache, table, lens, 0.2, num_splits=splits)
        assert (out[0] == 0).all() and torch.isfinite(out).all()


def test_choose_num_splits_fills_the_gpu():
    assert triton_attention.choose_num_splits(256, 8, 4096, 132) == 1
    assert triton_attention.choose_num_splits(1, 8, 4096, 132) == 33
    assert triton_attention.choose_num_splits(1, 8, 1024, 132) == 16  # the fastest measured
    assert triton_attention.choose_num_splits(64, 8, 1024, 132) == 1
    assert triton_attention.choose_num_splits(1, 8, 64, 132) == 1
    assert 1 < triton_attention.choose_num_splits(16, 8, 4096, 132) <= 8


# ---------------------------------------------------------------- prefill


def run_prefill(ctx_lens, q_lens, heads, kv_heads, head_dim, block_size, dtype, seed=0, **kw):
    """Store this step's K/V with both backends, then compare prefill outputs."""
    gen = torch.Generator().manual_seed(seed)
    num_blocks = sum(cdiv(n, block_size) for n in ctx_lens) + 3
    k_cache, v_cache = make_cache(num_blocks, block_size, kv_heads, head_dim, dtype, gen)
    table = make_block_tables(ctx_lens, block_size, num_blocks, gen)
    md = prefill_metadata(ctx_lens, q_lens, table, block_size)
    num_tokens = sum(q_lens)
    q = torch.randn(num_tokens, heads, head_dim, generator=gen).to(DEVICE, dtype)
    k = torch.randn(num_tokens, kv_heads, head_dim, generator=gen).to(DEVICE, dtype)
    v = torch.randn(num_tokens, kv_heads, head_dim, generator=gen).to(DEVICE, dtype)
    scale = 2.0 / head_dim**0.5
    k_ref, v_ref = k_cache.float(), v_cache.float()
    TorchAttentionBackend().store_kv(k.float(), v.float(), k_ref, v_ref, md.slot_mapping)
    ref = TorchAttentionBackend().prefill(q.float(), k.float(), v.float(), k_ref, v_ref, md, scale)
    backend = TritonAttentionBackend()
    backend.store_kv(k, v, k_cache, v_cache, md.slot_mapping)
    if kw:
        paged = md.has_cached_prefix
        out = triton_attention.varlen_prefill(
            q,
            k_cache if paged else k,
            v_cache if paged else v,
            md.cu_seqlens_q,
            md.max_seqlen_q,
            md.context_lens if paged else None,
            table if paged else None,
            scale,
            **kw,
        )
    else:
        out = backend.prefill(q, k, v, k_cache, v_cache, md, scale)
    return out, ref


@pytest.mark.parametrize(*quick_first("dtype", [torch.float32, torch.float16], quick=1))
@pytest.mark.parametrize(*quick_first("group", [1, 2, 3, 4], quick=1))
def test_prefill_without_cached_prefix(dtype, group):
    q_lens = [1, 9, 70, 130]
    out, ref = run_prefill(q_lens, q_lens, 2 * group, 2, 40, 16, dtype)
    assert_close(out, ref, dtype)


def test_prefill_reads_k_and_v_through_their_own_strides():
    """v as a view into the fused qkv projection (row stride = its width), k a separate tensor, as
    the fused q/k norm + RoPE path passes them: no copy, same output as contiguous inputs."""
    gen = torch.Generator().manual_seed(5)
    heads, kv_heads, head_dim, q_lens = 4, 2, 32, [3, 40, 17]
    tokens = sum(q_lens)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=gen).to(DEVICE, torch.float16)
    q = qkv[:, : heads * head_dim].reshape(tokens, heads, head_dim).clone()
    k = qkv[:, heads * head_dim : (heads + kv_heads) * head_dim].reshape(tokens, kv_heads, head_dim).clone()
    v = qkv[:, (heads + kv_heads) * head_dim :].view(tokens, kv_heads, head_dim)
    cu = torch.tensor([0, *itertools.accumulate(q_lens)], dtype=torch.int32, device=DEVICE)
    args = (cu, max(q_lens), None, None, 0.2)
    out = triton_attention.varlen_prefill(q, k, v, *args)
    assert v.stride(0) != k.stride(0)
    assert torch.equal(out, triton_attention.varlen_prefill(q, k, v.contiguous(), *args))


@pytest.mark.parametrize(*quick_first("dtype", [torch.float32, torch.float16], quick=1))
@pytest.mark.parametrize(*quick_first("block_size", [1, 16, 64], quick=1))
@pytest.mark.parametrize(*quick_first("group", [1, 2, 3, 4], quick=1))
def test_prefill_with_cached_prefix(dtype, block_size, group):
    # Whole prompt, chunk after a cached prefix, a single token, and a chunk of one tile.
    ctx_lens = [40, 150, 5, 97, 130]
    q_lens = [40, 30, 5, 1, 64]
    out, ref = run_prefill(ctx_lens, q_lens, 2 * group, 2, 32, block_size, dtype)
    assert_close(out, ref, dtype)


@pytest.mark.parametrize(*quick_first("group", [1, 2, 3, 4], quick=1))
@pytest.mark.parametrize("cached", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["new", "cached"])
def test_prefill_large_tiles_match_reference(monkeypatch, group, cached):
    """The tiles of large steps (128 rows, 32 keys), here at any step size."""
    monkeypatch.setattr(prefill_tiles_module, "LARGE_GRID_TILES", 0)
    assert prefill_config(32, 2 * group, 2, 1)[1:3] == (32, 8)
    q_lens = [1, 9, 70, 130]
    ctx_lens = [40, 150, 5, 130] if cached else q_lens
    out, ref = run_prefill(
        ctx_lens, [min(q, c) for q, c in zip(q_lens, ctx_lens)], 2 * group, 2, 32, 16, torch.float16
    )
    assert_close(out, ref, torch.float16)


@pytest.mark.slow  # explicit tile shapes; the quick loop's prefill cases run the chosen tiles
@pytest.mark.parametrize(("block_size", "block_m", "block_n"), [(4, 16, 16), (64, 32, 16), (8, 16, 32)])
def test_prefill_small_tiles_cross_pages_and_diagonal(block_size, block_m, block_n):
    ctx_lens, q_lens = [100, 77, 33], [100, 45, 2]
    kw = {"block_m": block_m, "block_n": block_n}
    out, ref = run_prefill(ctx_lens, q_lens, 4, 2, 32, block_size, torch.float16, **kw)
    assert_close(out, ref, torch.float16)
    out, ref = run_prefill(q_lens, q_lens, 4, 2, 32, block_size, torch.float16, **kw)
    assert_close(out, ref, torch.float16)


@pytest.mark.parametrize(*quick_first("head_dim", [16, 40, 128, 256], quick=1))
def test_prefill_head_dims(head_dim):
    out, ref = run_prefill([20, 70], [20, 50], 4, 2, head_dim, 16, torch.float16, seed=head_dim)
    assert_close(out, ref, torch.float16)


@pytest.mark.slow  # a 256-token page under the interpreter
def test_prefill_large_block():
    out, ref = run_prefill([300, 40], [100, 40], 4, 2, 32, 256, torch.float16)
    assert_close(out, ref, torch.float16)


def mixed_step(ctx_lens, q_lens, num_decodes, block_size, dtype, seed=0):
    """Caches holding a mixed step's contexts (its new K/V stored), its queries, and the eager
    mixed metadata (decodes first, then prefill sequences)."""
    gen = torch.Generator().manual_seed(seed)
    num_blocks = sum(cdiv(n, block_size) for n in ctx_lens) + 3
    k_cache, v_cache = make_cache(num_blocks, block_size, 2, 32, dtype, gen)
    table = make_block_tables(ctx_lens, block_size, num_blocks, gen)
    md = prefill_metadata(ctx_lens[num_decodes:], q_lens[num_decodes:], table[num_decodes:], block_size)
    md.slot_mapping = slots_for(table, ctx_lens, q_lens, block_size)
    md.context_lens = torch.tensor(ctx_lens, dtype=torch.int32, device=DEVICE)
    md.block_tables, md.num_decodes, md.has_cached_prefix = table, num_decodes, True
    q = torch.randn(sum(q_lens), 4, 32, generator=gen).to(DEVICE, dtype)
    return q, k_cache, v_cache, md


def test_step_graph_mixed_attention_matches_the_eager_one_with_padding():
    """The fixed-grid form a step graph captures (decode slots and tile table padded beyond the
    step's sequences and rows) gives the eager mixed step's rows."""
    ctx_lens, q_lens, d = [20, 45, 7, 40, 70], [1, 1, 1, 40, 30], 3
    q, k_cache, v_cache, md = mixed_step(ctx_lens, q_lens, d, 16, torch.float32)
    ref = TorchAttentionBackend().mixed(q, None, None, k_cache, v_cache, md, 0.3)  # k/v read from the cache
    tokens, padded, block_m = sum(q_lens), 96, 16
    tiles = prefill_tiles(q_lens, ctx_lens, d, block_m)
    fixed = AttentionMetadata(
        has_prefill=True,
        slot_mapping=md.slot_mapping,
        context_lens=torch.tensor(ctx_lens + [0], dtype=torch.int32, device=DEVICE),
        block_tables=torch.cat([md.block_tables, torch.zeros_like(md.block_tables[:1])]),
        cu_seqlens_q=md.cu_seqlens_q,
        max_seqlen_q=padded,
        has_cached_prefix=True,
        num_decodes=5,
        prefill_tiles=torch.cat([torch.tensor(tiles), torch.full((4, 4), -1, dtype=torch.int32)]).to(DEVICE),
        decode_context_lens=torch.tensor(ctx_lens[:d] + [0, 0], dtype=torch.int32, device=DEVICE),
    )
    q_padded = torch.cat([q, torch.randn(padded - tokens, 4, 32).to(DEVICE, q.dtype)])
    with pytest.MonkeyPatch.context() as patch:  # the tiles were built for this tile height
        patch.setattr(triton_attention, "_prefill_config", lambda *shape: (block_m, 16, 4, 1))
        out = TritonAttentionBackend().mixed(q_padded, q_padded, q_padded, k_cache, v_cache, fixed, 0.3)
    assert_close(out[:tokens], ref, torch.float32)


def test_step_graph_prefill_without_decode_slots_matches_the_eager_one():
    """A step graph of steps without decodes (no decode slots; attention through prefill()) gives
    the eager prefill's rows."""
    ctx_lens, q_lens = [45, 40, 70], [12, 40, 30]
    q, k_cache, v_cache, md = mixed_step(ctx_lens, q_lens, 0, 16, torch.float32)
    ref = TorchAttentionBackend().prefill(q, None, None, k_cache, v_cache, md, 0.3)
    tokens, padded, block_m = sum(q_lens), 96, 16
    tiles = prefill_tiles(q_lens, ctx_lens, 0, block_m)
    fixed = AttentionMetadata(
        has_prefill=True,
        slot_mapping=md.slot_mapping,
        context_lens=torch.tensor(ctx_lens + [0], dtype=torch.int32, device=DEVICE),
        block_tables=torch.cat([md.block_tables, torch.zeros_like(md.block_tables[:1])]),
        cu_seqlens_q=torch.zeros(5, dtype=torch.int32, device=DEVICE),  # unread
        max_seqlen_q=padded,
        has_cached_prefix=True,
        prefill_tiles=torch.cat([torch.tensor(tiles), torch.full((3, 4), -1, dtype=torch.int32)]).to(DEVICE),
        decode_context_lens=torch.zeros(0, dtype=torch.int32, device=DEVICE),
    )
    q_padded = torch.cat([q, torch.randn(padded - tokens, 4, 32).to(DEVICE, q.dtype)])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(triton_attention, "_prefill_config", lambda *shape: (block_m, 16, 4, 1))
        out = TritonAttentionBackend().prefill(q_padded, q_padded, q_padded, k_cache, v_cache, fixed, 0.3)
    assert_close(out[:tokens], ref, torch.float32)


def test_prefill_tiles_grow_taller_and_narrower_once_the_grid_holds_512_of_them():
    """128 rows x 32 keys a tile (8 warps) from 512 such tiles a step (tokens x the group padded x kv
    heads >= 65,536 rows), else 64 rows x 64 keys; rows are queries x the padded group; under TP a rank's
    heads count; large heads keep their tiles."""
    assert prefill_config(128, 16, 8, 4095) == (32, 64, 4, 3)  # Qwen3-0.6B
    assert prefill_config(128, 16, 8, 4096) == (64, 32, 8, 2)
    assert prefill_config(128, 8, 4, 4096) == (32, 64, 4, 3)  # its rank at TP=2
    assert prefill_config(128, 8, 4, 8192) == (64, 32, 8, 2)
    assert prefill_config(128, 32, 8, 2048) == (32, 32, 8, 2)  # 4 heads a kv head
    assert prefill_config(128, 12, 4, 4095) == (16, 64, 4, 3)  # 3, padded to 4
    assert prefill_config(128, 12, 4, 4096) == (32, 32, 8, 2)
    assert prefill_config(128, 8, 8, 8192) == (128, 32, 8, 2)
    assert prefill_config(256, 16, 8, 100) == prefill_config(256, 16, 8, 10**6) == (32, 32, 4, 2)


def test_prefill_tiles_cover_each_prefill_row_once_longest_first():
    """Sequence 2 has 30 cached tokens: its tiles read 94 and 100 keys; the table runs from the
    tile that reads the most keys to the one that reads the fewest."""
    tiles = prefill_tiles([1, 1, 70, 5, 129], [9, 9, 100, 5, 129], 2, 64)
    assert tiles.tolist() == [
        [4, 77, 129, 2],
        [4, 77, 129, 1],
        [2, 2, 70, 1],
        [2, 2, 70, 0],
        [4, 77, 129, 0],
        [3, 72, 5, 0],
    ]


def test_prefill_tiles_of_the_python_loop_equal_numpys(monkeypatch):
    """Few tiles take a Python loop, more take numpy: both give the same table."""
    from nanoexp.kernels import prefill_tiles as tiles_module

    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(1, 12)
        first = rng.randint(0, n - 1)
        query = [1 if i < first else rng.randint(1, 900) for i in range(n)]
        context = [q + rng.randint(0, 500) for q in query]
        block_m = rng.choice([16, 64])
        loop = tiles_module.few_prefill_tiles(query, context, first, block_m)
        monkeypatch.setattr(tiles_module, "PYTHON_TILES", -1)
        vectorized = tiles_module.prefill_tiles(query, context, first, block_m)
        monkeypatch.undo()
        assert loop.dtype == vectorized.dtype == np.int32 and loop.tolist() == vectorized.tolist()


def test_prefill_rejects_too_small_max_seqlen_q():
    gen = torch.Generator().manual_seed(0)
    table = make_block_tables([8, 8], 16, 4, gen)
    md = prefill_metadata([8, 8], [8, 8], table, 16)
    md.max_seqlen_q = 1
    q = torch.randn(16, 2, 16).to(DEVICE)
    k_cache, v_cache = make_cache(4, 16, 2, 16, torch.float32, gen)
    with pytest.raises(ValueError, match="max_seqlen_q"):
        TritonAttentionBackend().prefill(q, q, q, k_cache, v_cache, md, 0.25)


# ---------------------------------------------------------------- backend selection


def test_select_backends():
    cpu = torch.device("cpu")
    assert make_attention_backend("torch", cpu, 16).name == "torch"
    assert make_attention_backend("auto", cpu, 256).name == "torch"
    with pytest.raises(ValueError, match="attention_backend"):
        make_attention_backend("flash_attn", cpu, 256)
    with pytest.raises(ValueError, match="engine.attention_backend='nope' is invalid"):
        ExecutionConfig(attention_backend="nope")


def test_select_triton_on_cpu_needs_interpreter(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert make_attention_backend("triton", cpu, 16).name == "triton"
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match="attention_backend='triton'.*'torch'"):
        make_attention_backend("triton", cpu, 16)


# ---------------------------------------------------------------- GPU, real shapes

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("block_size", [256, 16])
@pytest.mark.parametrize("batch", [1, 64])
def test_gpu_bf16_decode_real_shapes(block_size, batch):
    gen = torch.Generator().manual_seed(block_size + batch)
    ctx_lens = torch.randint(1, 1025, (batch,), generator=gen).tolist()
    ctx_lens[0] = 1024
    if batch > 1:
        ctx_lens[1] = 1
    out, ref = run_decode(ctx_lens, 16, 8, 128, block_size, torch.bfloat16, seed=block_size)
    assert rel_l2(out, ref) < 1e-2


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("block_size", [256, 16])
def test_gpu_bf16_prefill_real_shapes(block_size):
    # Whole prompts, chunks after cached prefixes, and one single-token chunk.
    ctx_lens = [1024, 1024, 700, 1024, 300, 1000, 64, 513]
    q_lens = [1024, 512, 700, 1, 300, 999, 64, 129]
    out, ref = run_prefill(ctx_lens, q_lens, 16, 8, 128, block_size, torch.bfloat16)
    assert rel_l2(out, ref) < 1e-2
    out, ref = run_prefill(q_lens, q_lens, 16, 8, 128, block_size, torch.bfloat16)
    assert rel_l2(out, ref) < 1e-2


@pytest.mark.gpu
@needs_cuda
def test_gpu_decode_replays_in_cuda_graph():
    """Split count depends on static shapes only, so a captured decode stays correct."""
    batch, block_size, max_blocks = 8, 16, 64
    gen = torch.Generator().manual_seed(5)
    k_cache, v_cache = make_cache(batch * max_blocks, block_size, 8, 128, torch.bfloat16, gen)
    table = torch.randperm(batch * max_blocks, generator=gen).view(batch, max_blocks)
    md = decode_metadata([1] * batch, table.to(DEVICE, torch.int32))
    q = torch.randn(batch, 16, 128, generator=gen).to(DEVICE, torch.bfloat16)
    backend = TritonAttentionBackend()
    backend.decode(q, k_cache, v_cache, md, 0.088)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = backend.decode(q, k_cache, v_cache, md, 0.088)
    for lens in ([1, 2, 3, 4, 5, 6, 7, 8], [1024, 17, 999, 256, 1, 640, 300, 1000]):
        md.context_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        md.max_seqlen_k = max(lens)  # read by the reference only (the graph's kernel takes none)
        q.copy_(torch.randn(q.shape, generator=gen))
        graph.replay()
        ref = TorchAttentionBackend().decode(q.float(), k_cache.float(), v_cache.float(), md, 0.088)
        assert rel_l2(out, ref) < 1e-2
