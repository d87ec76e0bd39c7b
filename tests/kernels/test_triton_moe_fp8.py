"""The fp8 grouped MoE GEMMs (kernels/triton_moe.fused_moe_fp8) against the torch W8A8 reference of the
experts (kernels/moe_ref.fp8_experts_reference): on CPU under the Triton interpreter (tiny shapes, float32
and float16) and on the GPU on fp8 tensor cores at Qwen3-30B-A3B's shapes, in CUDA graphs."""

from __future__ import annotations

import pytest
import torch
from helpers import quick_first
from moe_kernel_inputs import fp8_moe_inputs, relative_error

from nanoexp.kernels.fp8_reference import group_amax
from nanoexp.kernels.moe_ref import Fp8ExpertScales, experts_reference
from nanoexp.kernels.triton_moe import (
    REGIMES,
    TritonMoe,
    fp8_tiles_for,
    fused_moe_fp8,
    group_by_expert_kernel,
)


def reference(x, w13, w2, weights, ids, fp8) -> torch.Tensor:
    return experts_reference(x, w13, w2, weights, ids, fp8)


# float32: the reference's sums up to their order; float16: a 1-ulp difference in a SwiGLU output can move
# its e4m3 rounding by a step
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-2, torch.bfloat16: 2e-2}


@pytest.mark.parametrize(*quick_first("dtype", [torch.float32, torch.float16], quick=1))
@pytest.mark.parametrize("tokens", [1, 5, 40])
def test_fused_moe_fp8_matches_the_reference(tokens, dtype):
    # hidden 200: two K blocks of the gate/up GEMM, the second ragged; inter 48: scales per row
    x, w13, w2, weights, ids, fp8 = fp8_moe_inputs(tokens, 8, 2, 200, 48, dtype)
    out = fused_moe_fp8(x, w13, w2, weights, ids, fp8)
    assert out.dtype == dtype
    assert relative_error(out, reference(x, w13, w2, weights, ids, fp8)) <= TOLERANCE[dtype]


@pytest.mark.parametrize("inter", [128, 160])  # 128-row scale blocks; per-row scales and two down K blocks
def test_scale_layouts_match_the_reference(inter):
    x, w13, w2, weights, ids, fp8 = fp8_moe_inputs(9, 4, 2, 64, inter, torch.float32, seed=1)
    assert fp8.gate_up.row_block == (128 if inter % 128 == 0 else 1)
    out = fused_moe_fp8(x, w13, w2, weights, ids, fp8)
    assert relative_error(out, reference(x, w13, w2, weights, ids, fp8)) <= 1e-5


@pytest.mark.parametrize("regime", range(len(REGIMES)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_every_regimes_tiles_match_the_reference(regime, dtype):
    x, w13, w2, weights, ids, fp8 = fp8_moe_inputs(6, 4, 2, 40, 24, dtype, seed=regime)
    tiles = fp8_tiles_for(REGIMES[regime][0] or 4096, dtype)
    out = fused_moe_fp8(x, w13, w2, weights, ids, fp8, tiles=tiles)
    assert relative_error(out, reference(x, w13, w2, weights, ids, fp8)) <= TOLERANCE[dtype]


def test_other_ranks_experts_add_nothing():
    x, w13, w2, weights, ids, fp8 = fp8_moe_inputs(7, 8, 3, 32, 16, torch.float32, seed=3)
    local = torch.where(ids >= 4, ids - 4, 4)  # rank 1 of 2 holds experts 4..7
    mine = Fp8ExpertScales(fp8.w13[4:], fp8.w2[4:], fp8.gate_up, fp8.down)
    out = fused_moe_fp8(x, w13[4:], w2[4:], weights, local, mine, all_local=False)
    want = reference(x, w13[4:], w2[4:], weights, torch.where(ids >= 4, ids - 4, -1), mine)
    assert relative_error(out, want) <= 1e-5


def test_a_tp_shard_straddling_groups_quantizes_with_the_given_amax():
    """Rank 1 of 2 at inter 192: its 96 rows at offset 96 of the first 128-group, whose amax the ranks
    share (`down_amax`; here a stand-in for the other rank's larger values)."""
    x, w13, w2, weights, ids, fp8 = fp8_moe_inputs(11, 4, 2, 64, 96, torch.float32, inter_start=96, seed=4)
    assert (fp8.down.k_offset, fp8.down.k_blocks) == (96, 2)
    calls = []

    def shared(act: torch.Tensor) -> torch.Tensor:
        calls.append(act.shape)
        return group_amax(act, fp8.down) * 1.5

    with_amax = Fp8ExpertScales(fp8.w13, fp8.w2, fp8.gate_up, fp8.down, shared)
    out = fused_moe_fp8(x, w13, w2, weights, ids, with_amax)
    want = reference(x, w13, w2, weights, ids, with_amax)
    assert relative_error(out, want) <= 1e-5 and calls == [(22, 96), (22, 96)]
    assert relative_error(out, reference(x, w13, w2, weights, ids, fp8)) > 1e-3  # the amax is used


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("inter_start", [0, 192])  # TP=4 ranks 0 and 1 of Qwen3-30B-A3B (768 / 4 = 192)
@pytest.mark.parametrize("tokens", [1, 16, 256, 2048])
@pytest.mark.parametrize("dtype", [pytest.param(torch.bfloat16, marks=pytest.mark.gpu_quick), torch.float32])
def test_gpu_fp8_experts_at_qwen3_30b_shapes(tokens, dtype, inter_start):
    """128 experts, top-8, hidden 2048, a TP=4 rank's 192 rows of each expert (rank 1's down K shard at
    offset 64 of a 128-group). Not float32-equal: among millions of SwiGLU outputs a few sit within a
    last-bit difference of an e4m3 rounding boundary and move a whole step (~1e-4 of the output's norm at
    2,048 tokens); bfloat16 rounds them before quantizing, and Hopper's fp8 MMA sums a block in fewer bits."""
    x, w13, w2, weights, ids, fp8 = fp8_moe_inputs(tokens, 128, 8, 2048, 192, dtype, inter_start, seed=6)
    out = fused_moe_fp8(x, w13, w2, weights, ids.to(torch.int32), fp8, group=group_by_expert_kernel)
    want = reference(x.float(), w13, w2, weights.float(), ids, fp8)
    assert relative_error(out, want) <= (1e-3 if dtype == torch.float32 else 2e-2)


@pytest.mark.gpu
@pytest.mark.gpu_quick
@needs_cuda
def test_gpu_fp8_experts_replay_in_a_cuda_graph():
    """Grouping, activation quantization and both GEMMs captured once, replayed on new tokens and routes."""
    x, w13, w2, weights, ids, fp8 = fp8_moe_inputs(24, 16, 4, 256, 128, torch.bfloat16, seed=7)
    ids32 = ids.to(torch.int32)
    kernel = TritonMoe(group_by_expert_kernel, "test", decode_max_tokens=0)
    kernel.experts(x, w13, w2, weights, ids32, True, fp8)  # compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = kernel.experts(x, w13, w2, weights, ids32, True, fp8)
    x2, _, _, weights2, ids2, _ = fp8_moe_inputs(24, 16, 4, 256, 128, torch.bfloat16, seed=8)
    x.copy_(x2)
    weights.copy_(weights2)
    ids32.copy_(ids2)
    graph.replay()
    want = kernel.experts(x, w13, w2, weights, ids32, True, fp8)
    assert torch.equal(out, want)
