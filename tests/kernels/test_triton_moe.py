"""The fused MoE kernels against the torch reference (the Triton interpreter on CPU), and the grouping."""

from __future__ import annotations

import pytest
import torch
from helpers import quick_first
from moe_kernel_inputs import DEVICE, moe_inputs

from nanoexp.kernels.moe_ref import experts_reference, route
from nanoexp.kernels.triton_moe import (
    REGIMES,
    fused_moe,
    group_by_expert,
    group_by_expert_kernel,
    make_triton_moe,
    route_triton,
    same_groups,
    tiles_for,
)
from nanoexp.layers.fused_moe import FusedMoE


@pytest.mark.parametrize("block_m", [1, 4, 16])
def test_grouping_puts_every_slot_once_in_its_experts_blocks(block_m):
    ids = torch.tensor([3, 0, 3, 5, 1, 0, 3, 5, 5, 5, 2, 5], device=DEVICE)  # 5: another rank's expert
    slots, block_expert = group_by_expert(ids, 5, block_m)
    slots, block_expert = slots.cpu().view(-1, block_m), block_expert.cpu()
    seen = []
    for block, expert in zip(slots.tolist(), block_expert.tolist(), strict=True):
        real = [s for s in block if s < ids.numel()]
        if expert == 5:
            assert not real
        assert all(ids[s] == expert for s in real)
        seen += real
    assert sorted(seen) == [s for s in range(ids.numel()) if ids[s] < 5]
    # within an expert, slots stay in order (the stable sort)
    assert seen == sorted(seen, key=lambda s: (int(ids[s]), s))


@pytest.mark.parametrize(*quick_first("dtype", [torch.float32, torch.float16], quick=1))
@pytest.mark.parametrize("tokens", [1, 5, 40])
def test_fused_moe_matches_reference(tokens, dtype):
    x, w13, w2, weights, ids = moe_inputs(tokens, 8, 2, 32, 48, dtype)
    ref = experts_reference(x.float(), w13.float(), w2.float(), weights.float(), ids).to(dtype)
    out = fused_moe(x, w13, w2, weights, ids)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out, ref, atol=tol, rtol=tol)


@pytest.mark.parametrize("regime", range(len(REGIMES)))
def test_every_regimes_tiles_match_reference(regime):
    x, w13, w2, weights, ids = moe_inputs(6, 4, 2, 40, 24, torch.float32, seed=regime)
    limit = REGIMES[regime][0] or 4096
    out = fused_moe(x, w13, w2, weights, ids, tiles=tiles_for(limit, x.element_size()))  # float32's tiles
    torch.testing.assert_close(out, experts_reference(x, w13, w2, weights, ids), atol=1e-5, rtol=1e-5)


def test_other_ranks_experts_add_nothing():
    x, w13, w2, weights, ids = moe_inputs(7, 8, 3, 32, 16, torch.float32, seed=3)
    local = torch.where(ids >= 4, ids - 4, 4)  # rank 1 of 2 holds experts 4..7
    out = fused_moe(x, w13[4:], w2[4:], weights, local, all_local=False)
    ref = experts_reference(x, w13[4:], w2[4:], weights, torch.where(ids >= 4, ids - 4, -1))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize(*quick_first("experts,top_k", [(8, 2), (16, 4), (6, 3)], quick=2))
def test_route_kernel_matches_torch_route(experts, top_k, renormalize):
    gen = torch.Generator().manual_seed(experts + top_k)
    logits = torch.randn(9, experts, generator=gen).to(DEVICE)
    want_w, want_ids = route(logits, top_k, renormalize)
    counts = torch.zeros(experts, dtype=torch.int32, device=DEVICE)
    slots = torch.tensor([4, 9, 0, 1, 2, 3, 5, -1, -1], device=DEVICE)  # the last two: a graph's padding
    weights, ids = route_triton(logits, top_k, renormalize, counts=counts, token_slots=slots)
    assert torch.equal(ids.long(), want_ids)
    torch.testing.assert_close(weights, want_w, atol=1e-6, rtol=1e-6)
    assert torch.equal(counts.long(), torch.bincount(want_ids[:7].flatten(), minlength=experts))


def test_route_kernel_maps_other_ranks_experts_past_the_local_ones():
    logits = torch.randn(5, 8, generator=torch.Generator().manual_seed(0)).to(DEVICE)
    _, want = route(logits, 3, True)
    _, ids = route_triton(logits, 3, True, first_local=4, num_local=4)
    assert torch.equal(ids.long(), torch.where(want >= 4, want - 4, 4))


@pytest.mark.parametrize("tokens", [3, 20])  # the decode path and the grouped one
def test_moe_layer_with_triton_kernels_matches_torch_and_counts_real_tokens(tokens):
    layer = FusedMoE(8, 2, 32, 24, renormalize=True).to(DEVICE)
    gen = torch.Generator().manual_seed(1)
    for param in (layer.w13, layer.w2):
        param.data.copy_(torch.randn(param.shape, generator=gen) * 0.2)
    x = torch.randn(tokens, 32, generator=gen).to(DEVICE)
    logits = torch.randn(tokens, 8, generator=gen).to(DEVICE)
    rows = torch.arange(tokens, device=DEVICE)
    slots = torch.where(rows < tokens - 3, rows, -1)
    triton_moe = make_triton_moe(torch.device(DEVICE))
    assert triton_moe.grouping is group_by_expert_kernel
    counts, outs = {}, {}
    for kernel in (None, triton_moe):
        layer.kernel = kernel
        layer.load_counts = torch.zeros(8, dtype=torch.int32, device=DEVICE)
        outs[kernel] = layer(x, logits, slots)
        counts[kernel] = layer.load_counts
    torch.testing.assert_close(outs[triton_moe], outs[None], atol=1e-5, rtol=1e-5)
    assert torch.equal(counts[triton_moe], counts[None]) and counts[None].sum() == (tokens - 3) * 2


@pytest.mark.parametrize("block_m", [1, 4, 16])
def test_one_kernel_grouping_puts_the_same_slots_in_the_same_blocks(block_m):
    ids = torch.tensor([3, 0, 3, 5, 1, 0, 3, 5, 5, 5, 2, 5, 0, 0, 0], device=DEVICE)
    want_slots, want_experts = group_by_expert(ids, 5, block_m)
    slots, experts = group_by_expert_kernel(ids, 5, block_m)
    assert torch.equal(experts, want_experts)
    assert slots_by_expert(slots, experts) == slots_by_expert(want_slots, want_experts)


def test_one_kernel_grouping_over_several_chunks():
    ids = torch.randint(0, 129, (2500,), generator=torch.Generator().manual_seed(0)).to(DEVICE)  # 128: remote
    want_slots, want_experts = group_by_expert(ids, 128, 16)
    slots, experts = group_by_expert_kernel(ids, 128, 16)
    assert torch.equal(experts, want_experts)
    assert slots_by_expert(slots, experts) == slots_by_expert(want_slots, want_experts)
    assert same_groups(slots, experts, want_slots, want_experts)


def slots_by_expert(slots: torch.Tensor, block_expert: torch.Tensor) -> dict[int, list[int]]:
    """Each expert's slots (padding included), in order: on a GPU the one-kernel grouping's atomic cursor
    fills an expert's rows in any order, across its blocks too."""
    block_m = slots.numel() // block_expert.numel()
    groups: dict[int, list[int]] = {}
    for block, expert in enumerate(block_expert.tolist()):
        groups.setdefault(expert, []).extend(slots[block * block_m : (block + 1) * block_m].tolist())
    return {expert: sorted(group) for expert, group in groups.items()}


def test_same_groups_tells_a_misplaced_slot():
    ids = torch.tensor([0, 1, 0, 1, 1], device=DEVICE)
    slots, experts = group_by_expert(ids, 2, 2)
    shuffled = slots.clone()
    shuffled[[2, 4]] = shuffled[[4, 2]]  # expert 1's slots 1 and 4 trade blocks: the same groups
    assert same_groups(shuffled, experts, slots, experts)
    swapped = slots.clone()
    swapped[[0, 2]] = swapped[[2, 0]]  # a slot of expert 0 moved into expert 1's block
    assert not same_groups(swapped, experts, slots, experts)


@pytest.mark.parametrize("tokens", [5, 40])
def test_fused_moe_with_one_kernel_grouping_matches_reference(tokens):
    x, w13, w2, weights, ids = moe_inputs(tokens, 8, 2, 32, 48, torch.float32, seed=9)
    out = fused_moe(x, w13, w2, weights, ids.int(), group=group_by_expert_kernel)
    torch.testing.assert_close(out, experts_reference(x, w13, w2, weights, ids), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("tokens", [limit or 4096 for limit, _ in REGIMES])
def test_float32_tiles_fit_hopper_shared_memory(tokens):
    """Operand buffers of both GEMMs, all stages, in float32: under 3/4 of an H100's 227 KB (Triton adds
    its own buffers; the 128-row bf16 prefill tile in float32 asked for 240 KB and did not launch)."""
    tiles = tiles_for(tokens, element_size=4)
    gate_up, down, m = tiles.gate_up, tiles.down, tiles.block_m
    gate_up_bytes = gate_up.num_stages * (m + 2 * gate_up.block_n) * gate_up.block_k * 4
    down_bytes = down.num_stages * (m + down.block_n) * down.block_k * 4
    assert max(gate_up_bytes, down_bytes) <= 227 * 1024 * 3 // 4
    assert tiles_for(tokens) == next(t for limit, t in REGIMES if limit is None or tokens <= limit)
