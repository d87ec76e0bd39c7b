"""Column-parallel fp8 layers (fused q/k/v, gate/up) at TP sizes whose shards are not multiples of 128,
each rank simulated in-process: every rank's rows, with the scale rows covering them, compute exactly what
TP=1 computes for those rows. (Row-parallel layers, whose activation groups straddle ranks, need the
ranks' all-reduce: tests/loader/test_fp8_checkpoint.py runs them under real TP.)"""

from __future__ import annotations

import pytest
import torch
from fp8_checkpoints import published_quantize

import nanoexp.layers.linear as linear
from nanoexp.kernels.fp8_reference import Fp8Layout, w8a8_reference
from nanoexp.layers.quantization import building

HIDDEN = 200  # two K blocks, the second ragged


def build(monkeypatch, cls, args, rank: int, size: int):
    monkeypatch.setattr(linear, "tp_rank", lambda: rank)
    monkeypatch.setattr(linear, "tp_size", lambda: size)
    with building("fp8"):
        return cls(*args)


def reference(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """TP=1: the checkpoint tensor's own blocks."""
    layout = Fp8Layout(q.shape[0], q.shape[1], 0, 128)
    padded = torch.zeros(q.shape[0], layout.k_padded, dtype=q.dtype)
    padded[:, : q.shape[1]] = q
    return w8a8_reference(x, padded, s, layout)


@pytest.mark.parametrize("size", [1, 2, 3, 4, 8])
def test_merged_gate_up_shards_match_tp1(monkeypatch, size):
    torch.manual_seed(size)
    inter = 24 * 8 * 3  # 576: per rank 576, 288, 192, 144, 72 rows (straddling at 3, 4 and 8)
    parts = [published_quantize(torch.randn(inter, HIDDEN) * 0.05) for _ in range(2)]
    x = torch.randn(5, HIDDEN)
    want = [reference(x, q, s) for q, s in parts]
    per_rank = inter // size
    for rank in range(size):
        layer = build(monkeypatch, linear.MergedColumnParallelLinear, (HIDDEN, [inter, inter]), rank, size)
        for shard, (q, s) in enumerate(parts):
            layer.weight.weight_loader(layer.weight, q, shard)
            layer.weight_scale_inv.weight_loader(layer.weight_scale_inv, s, shard)
        got = layer(x)
        rows = slice(rank * per_rank, (rank + 1) * per_rank)
        assert torch.equal(got[:, :per_rank], want[0][:, rows]) and torch.equal(
            got[:, per_rank:], want[1][:, rows]
        )


@pytest.mark.parametrize(("size", "kv_heads"), [(1, 2), (2, 2), (4, 2), (4, 4), (8, 2)])
def test_qkv_shards_match_tp1_with_replicated_kv_heads(monkeypatch, size, kv_heads):
    torch.manual_seed(size + kv_heads)
    heads, head_dim = 8, 48  # q 384 rows, kv 96 or 192: per-rank parts of 48..192 rows
    names = ("q", "k", "v")
    rows_of = {"q": heads * head_dim, "k": kv_heads * head_dim, "v": kv_heads * head_dim}
    parts = {n: published_quantize(torch.randn(rows_of[n], HIDDEN) * 0.05) for n in names}
    x = torch.randn(3, HIDDEN)
    want = {n: reference(x, *parts[n]) for n in names}
    for rank in range(size):
        layer = build(
            monkeypatch, linear.QKVParallelLinear, (HIDDEN, head_dim, heads, kv_heads, False), rank, size
        )
        for n in names:
            layer.weight.weight_loader(layer.weight, parts[n][0], n)
            layer.weight_scale_inv.weight_loader(layer.weight_scale_inv, parts[n][1], n)
        got = layer(x)
        for n in names:
            offset, count, start = layer.rows_of(n)
            assert torch.equal(got[:, offset : offset + count], want[n][:, start : start + count]), (rank, n)
