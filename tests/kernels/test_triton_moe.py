"""The fused MoE kernels against the torch reference (the Triton interpreter on CPU), and the grouping."""

from __future__ import annotations

import pytest
import torch

from nanoexp.kernels.moe_ref import experts_reference, route
from nanoexp.kernels.triton_moe import REGIMES, fused_moe, group_by_expert

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def moe_inputs(tokens, experts, top_k, hidden, inter, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen).to(DEVICE, dtype)
    w13 = (torch.randn(experts, 2 * inter, hidden, generator=gen) / hidden**0.5).to(DEVICE, dtype)
    w2 = (torch.randn(experts, hidden, inter, generator=gen) / inter**0.5).to(DEVICE, dtype)
    logits = torch.randn(tokens, experts, generator=gen).to(DEVICE, dtype)
    weights, ids = route(logits, top_k, renormalize=True)
    return x, w13, w2, weights, ids


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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
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
    out = fused_moe(x, w13, w2, weights, ids, tiles=REGIMES[regime][1])
    torch.testing.assert_close(out, experts_reference(x, w13, w2, weights, ids), atol=1e-5, rtol=1e-5)


def test_other_ranks_experts_add_nothing():
    x, w13, w2, weights, ids = moe_inputs(7, 8, 3, 32, 16, torch.float32, seed=3)
    local = torch.where(ids >= 4, ids - 4, 4)  # rank 1 of 2 holds experts 4..7
    out = fused_moe(x, w13[4:], w2[4:], weights, local, all_local=False)
    ref = experts_reference(x, w13[4:], w2[4:], weights, torch.where(ids >= 4, ids - 4, -1))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
