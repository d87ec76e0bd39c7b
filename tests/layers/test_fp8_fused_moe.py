"""fp8 MoE experts sharded by tensor parallelism (each expert's intermediate rows, at TP sizes whose shards
are not multiples of 128) or by expert parallelism (whole experts), each rank simulated in-process: every
rank's fp8 weights and scales dequantize exactly to its slice of the checkpoint's, whether the checkpoint
was FP8 or is quantized at load. (The ranks' shared activation amax needs real ranks:
tests/models/test_moe_fp8.py runs TP=2 with gloo.)"""

from __future__ import annotations

import pytest
import torch
from fp8_checkpoints import published_quantize

import nanoexp.layers.fused_moe as fused_moe
from nanoexp.kernels.fp8_reference import expand_scale
from nanoexp.layers.quantization import building

EXPERTS, HIDDEN, INTER = 4, 200, 384  # K of gate/up: two blocks, the second ragged
SHARDS = {"gate": "w13", "up": "w13", "down": "w2"}


def build(monkeypatch, rank: int, size: int, expert_parallel: bool) -> fused_moe.FusedMoE:
    monkeypatch.setattr(fused_moe, "tp_rank", lambda: rank)
    monkeypatch.setattr(fused_moe, "tp_size", lambda: size)
    with building("fp8"):
        return fused_moe.FusedMoE(EXPERTS, 2, HIDDEN, INTER, True, expert_parallel)


def dequantized(q: torch.Tensor, s: torch.Tensor, layout) -> torch.Tensor:
    """[n, k_padded] of one expert's fp8 weight times its scales."""
    blocks = q.float().view(layout.n, layout.k_blocks, 128) * expand_scale(s, layout)[..., None]
    return blocks.view(layout.n, -1)


def checkpoint_dequantized(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    rows, cols = q.shape
    return q.float() * s.repeat_interleave(128, 0)[:rows].repeat_interleave(128, 1)[:, :cols]


@pytest.fixture(scope="module")
def checkpoint() -> dict[tuple[int, str], torch.Tensor]:
    """Each expert's unquantized gate, up and down weights."""
    torch.manual_seed(0)
    shape = {"gate": (INTER, HIDDEN), "up": (INTER, HIDDEN), "down": (HIDDEN, INTER)}
    return {(e, s): torch.randn(*shape[s]) * 0.05 for e in range(EXPERTS) for s in SHARDS}


def load(layer: fused_moe.FusedMoE, checkpoint, quantized: bool, without_scale=None) -> None:
    for (expert, shard), w in checkpoint.items():
        param = getattr(layer, SHARDS[shard])
        if quantized:
            q, s = published_quantize(w)
            param.weight_loader(param, q, expert, shard)
            scale = getattr(layer, SHARDS[shard] + "_scale_inv")
            if (expert, shard) != without_scale:
                scale.weight_loader(scale, s, expert, shard)
        else:  # the unquantized tensor, quantized at load by the published rule
            param.weight_loader(param, w.to(torch.bfloat16).float(), expert, shard)


@pytest.mark.parametrize("quantized", [True, False], ids=["fp8_checkpoint", "quantized_at_load"])
@pytest.mark.parametrize(
    "size,expert_parallel",
    [(1, False), (2, False), (3, False), (4, False), (8, False), (2, True), (4, True)],
)
def test_every_ranks_fp8_experts_are_its_slice_of_the_checkpoint(
    monkeypatch, checkpoint, size, expert_parallel, quantized
):
    if not quantized:  # what the rank should hold: the published rule applied to the same bf16 values
        checkpoint = {key: w.to(torch.bfloat16).float() for key, w in checkpoint.items()}
    want = {key: checkpoint_dequantized(*published_quantize(w)) for key, w in checkpoint.items()}
    for rank in range(size):
        layer = build(monkeypatch, rank, size, expert_parallel)
        load(layer, checkpoint, quantized)
        assert layer.missing_pieces() == []
        assert layer.fp8 is not None
        gate_up, down = layer.fp8.layouts["w13"], layer.fp8.layouts["w2"]
        inter, start = layer.local_inter, layer.inter_start
        for local in range(layer.num_local):
            expert = layer.first_expert + local
            w13 = dequantized(layer.w13[local], layer.w13_scale_inv[local], gate_up)
            w2 = dequantized(layer.w2[local], layer.w2_scale_inv[local], down)
            assert torch.equal(w13[:inter, :HIDDEN], want[expert, "gate"][start : start + inter])
            assert torch.equal(w13[inter:, :HIDDEN], want[expert, "up"][start : start + inter])
            k0 = down.k_offset
            assert torch.equal(w2[:, k0 : k0 + inter], want[expert, "down"][:, start : start + inter])
            assert not w13[:, HIDDEN:].any() and not w2[:, :k0].any() and not w2[:, k0 + inter :].any()


def test_tp4_shards_straddle_and_share_their_down_amax(monkeypatch):
    """768 / 4 = 192 rows a rank (Qwen3-30B-A3B at TP=4): gate/up scales per row; rank 1's down K shard
    sits at offset 64 of a 128-group, which it shares with rank 0, so the ranks exchange that amax."""
    monkeypatch.setattr(fused_moe, "tp_rank", lambda: 1)
    monkeypatch.setattr(fused_moe, "tp_size", lambda: 4)
    with building("fp8"):
        layer = fused_moe.FusedMoE(8, 2, 256, 768, True)
    assert layer.fp8 is not None
    gate_up, down = layer.fp8.layouts["w13"], layer.fp8.layouts["w2"]
    assert gate_up.row_block == 1 and tuple(layer.w13_scale_inv.shape) == (8, 384, 2)
    assert (down.k_start, down.k_offset, down.k_blocks) == (192, 64, 2) and layer.fp8.sync_amax
    assert tuple(layer.w2.shape) == (8, 256, 256) and tuple(layer.w2_scale_inv.shape) == (8, 2, 2)
    with building("fp8"):
        whole = fused_moe.FusedMoE(8, 2, 256, 768, True, expert_parallel=True)
    assert whole.fp8 is not None and not whole.fp8.sync_amax and whole.fp8.layouts["w13"].row_block == 128


def test_missing_expert_scales_are_named(monkeypatch, checkpoint):
    layer = build(monkeypatch, 0, 1, False)
    load(layer, checkpoint, quantized=True, without_scale=(2, "up"))
    assert layer.missing_pieces() == ["2.up_proj.weight_scale_inv"]
