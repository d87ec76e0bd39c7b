"""The MoE decode path (kernels/triton_moe_decode.py: gate_up per slot, down with the top-k sum fused, no
grouping) against the torch reference of the experts: on CPU under the Triton interpreter (tiny shapes,
float32 and float16), and on the GPU at Qwen3-30B-A3B's shapes, in CUDA graphs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from moe_kernel_inputs import DEVICE, fp8_moe_inputs, moe_inputs, relative_error

from nanoexp.kernels import triton_moe
from nanoexp.kernels.fp8_reference import group_amax
from nanoexp.kernels.moe_ref import Fp8ExpertScales, experts_reference
from nanoexp.kernels.triton_moe import TritonMoe, fused_moe, fused_moe_fp8, group_by_expert_kernel
from nanoexp.kernels.triton_moe_decode import DecodeTiles, GemvTile, decode_moe, route_decode_moe

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-2, torch.bfloat16: 2e-2}


def float_reference(x, w13, w2, weights, ids, fp8=None) -> torch.Tensor:
    """experts_reference in float32 (fp8 experts: their e4m3 weights as they are)."""
    if fp8 is None:
        w13, w2 = w13.float(), w2.float()
    return experts_reference(x.float(), w13, w2, weights.float(), ids, fp8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("top_k", [2, 8])
@pytest.mark.parametrize("tokens", [1, 2, 3, 4])
def test_decode_path_matches_the_reference(tokens, top_k, dtype):
    x, w13, w2, weights, ids = moe_inputs(tokens, 16, top_k, 40, 24, dtype, seed=tokens + top_k)
    out = decode_moe(x, w13, w2, weights, ids.int())
    assert out.dtype == dtype
    want = float_reference(x, w13, w2, weights, ids).to(dtype)
    torch.testing.assert_close(out, want, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


@pytest.mark.parametrize("dtype,big", [(torch.float16, 2048.0), (torch.float32, 2.0**24)])
def test_the_top_k_sum_adds_experts_in_id_order_rounding_each_sum(dtype, big):
    """Every product exact (x = e_0, silu(32) = 32, up 1/32: each SwiGLU output is 1, each down output its
    weight); one token's experts 2, 0, 1 give 1, big, 1 in the first column, where big + 1 is a tie that
    rounds to even. The reference (index_add_ in expert order, in the model dtype) gets big: 1 + big -> big,
    then + 1 -> big; the slots' order (1 + 1 + big) or one rounding of the fp32 sum would give big + 2."""
    experts, hidden, inter = 4, 8, 4
    x = torch.zeros(1, hidden)
    x[0, 0] = 1.0
    w13 = torch.zeros(experts, 2 * inter, hidden)
    w13[:, 0, 0], w13[:, inter, 0] = 32.0, 1 / 32
    w2 = torch.zeros(experts, hidden, inter)
    w2[:, 0, 0] = torch.tensor([1.0, big, 1.0, 7.0])  # column 0
    w2[:, 1, 0] = torch.tensor([0.5, 3.0, -2.0, 9.0])  # column 1: exact in any order
    ids = torch.tensor([[2, 0, 1]])
    weights = torch.ones(1, 3)
    args = [t.to(DEVICE, dtype) for t in (x, w13, w2, weights)]
    want = experts_reference(args[0], args[1], args[2], args[3], ids.to(DEVICE))
    assert want[0, 0].item() == big and want[0, 1].item() == 1.5
    out = decode_moe(args[0], args[1], args[2], args[3], ids.to(DEVICE, torch.int32))
    assert torch.equal(out, want)
    # an EP rank holding experts 0 and 1 (2 is another rank's): big + 1, a tie, rounds to big
    local = torch.tensor([[3, 0, 1]], device=DEVICE, dtype=torch.int32)
    partial = decode_moe(args[0], args[1][:2], args[2][:2], args[3], local)
    assert partial[0, 0].item() == big and partial[0, 1].item() == 3.5


@pytest.mark.parametrize("sentinel", ["past_the_local_experts", "negative"])
def test_other_ranks_experts_add_nothing(sentinel):
    x, w13, w2, weights, ids = moe_inputs(3, 8, 3, 32, 16, torch.float32, seed=5)
    other = 4 if sentinel == "past_the_local_experts" else -1
    local = torch.where(ids >= 4, ids - 4, other).int()  # rank 1 of 2 holds experts 4..7
    out = decode_moe(x, w13[4:], w2[4:], weights, local)
    want = experts_reference(x, w13[4:], w2[4:], weights, torch.where(ids >= 4, ids - 4, -1))
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)


def test_a_token_with_no_local_expert_is_zero():
    x, w13, w2, weights, ids = moe_inputs(2, 8, 2, 32, 16, torch.float32, seed=6)
    local = torch.full_like(ids, 4).int()
    local[1] = torch.tensor([0, 1])
    out = decode_moe(x, w13[:4], w2[:4], weights, local)
    assert torch.equal(out[0], torch.zeros_like(out[0])) and out[1].abs().sum() > 0


@pytest.mark.parametrize("tile", [GemvTile(8, 16), GemvTile(64, 64, 2, 1)])
def test_other_tiles_match_the_reference(tile):
    """Column tiles narrower and wider than the layer, K steps that leave a ragged end."""
    x, w13, w2, weights, ids = moe_inputs(2, 8, 2, 40, 24, torch.float32, seed=7)
    out = decode_moe(x, w13, w2, weights, ids.int(), tiles=DecodeTiles(tile, tile))
    torch.testing.assert_close(out, experts_reference(x, w13, w2, weights, ids), atol=1e-5, rtol=1e-5)


# fp8 experts: hidden 200 (the gate_up's two K groups, the second ragged) and expert intermediate 192 (gate/up
# scales per row, the down projection's K ragged in its second group)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("tokens,top_k", [(1, 8), (3, 2)])
def test_fp8_decode_path_matches_the_reference(tokens, top_k, dtype):
    x, w13, w2, weights, ids, fp8 = fp8_moe_inputs(tokens, 8, top_k, 200, 192, dtype, seed=tokens)
    assert fp8.gate_up.row_block == 1 and fp8.down.k_blocks == 2
    out = decode_moe(x, w13, w2, weights, ids.int(), fp8)
    assert out.dtype == dtype
    assert relative_error(out, experts_reference(x, w13, w2, weights, ids, fp8)) <= TOLERANCE[dtype]


def test_fp8_other_ranks_experts_add_nothing():
    x, w13, w2, weights, ids, fp8 = fp8_moe_inputs(3, 8, 3, 32, 16, torch.float32, seed=3)
    local = torch.where(ids >= 4, ids - 4, 4)  # rank 1 of 2 holds experts 4..7
    mine = Fp8ExpertScales(fp8.w13[4:], fp8.w2[4:], fp8.gate_up, fp8.down)
    out = decode_moe(x, w13[4:], w2[4:], weights, local.int(), mine)
    want = experts_reference(x, w13[4:], w2[4:], weights, torch.where(ids >= 4, ids - 4, -1), mine)
    assert relative_error(out, want) <= 1e-5


def test_fp8_tp_shard_straddling_groups_quantizes_with_the_given_amax():
    """Rank 1 of 2 at inter 192: its 96 rows at offset 96 of the first 128-group, whose amax the ranks share
    (`down_amax`; here a stand-in for the other rank's larger values)."""
    x, w13, w2, weights, ids, fp8 = fp8_moe_inputs(3, 4, 2, 64, 96, torch.float32, inter_start=96, seed=4)
    assert (fp8.down.k_offset, fp8.down.k_blocks) == (96, 2)
    calls = []

    def shared(act: torch.Tensor) -> torch.Tensor:
        calls.append(act.shape)
        return group_amax(act, fp8.down) * 1.5

    with_amax = Fp8ExpertScales(fp8.w13, fp8.w2, fp8.gate_up, fp8.down, shared)
    out = decode_moe(x, w13, w2, weights, ids.int(), with_amax)
    want = experts_reference(x, w13, w2, weights, ids, with_amax)
    assert relative_error(out, want) <= 1e-5 and calls == [(6, 96), (6, 96)]
    assert relative_error(out, experts_reference(x, w13, w2, weights, ids, fp8)) > 1e-3  # the amax is used
    plain = decode_moe(x, w13, w2, weights, ids.int(), fp8)  # each rank's own amax: the layout's offset
    assert relative_error(plain, experts_reference(x, w13, w2, weights, ids, fp8)) <= 1e-5


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16_experts", "fp8_experts"])
def test_the_bound_kernel_takes_the_decode_path_up_to_its_limit(monkeypatch, fp8):
    calls = []

    def spy(x, *args, **kwargs):
        calls.append(x.shape[0])
        return decode_moe(x, *args, **kwargs)

    monkeypatch.setattr(triton_moe, "decode_moe", spy)
    kernel = TritonMoe(group_by_expert_kernel, "test", decode_max_tokens=2)
    for tokens in (1, 2, 3):
        if fp8:
            x, w13, w2, weights, ids, scales = fp8_moe_inputs(
                tokens, 4, 2, 32, 16, torch.float32, seed=tokens
            )
        else:
            x, w13, w2, weights, ids = moe_inputs(tokens, 4, 2, 32, 16, torch.float32, seed=tokens)
            scales = None
        out = kernel.experts(x, w13, w2, weights, ids.int(), True, scales)
        assert relative_error(out, experts_reference(x, w13, w2, weights, ids, scales)) <= 1e-5
    assert calls == [1, 2]


def test_no_tokens_give_an_empty_output():
    x, w13, w2, weights, ids = moe_inputs(0, 4, 2, 32, 16, torch.float32)
    assert decode_moe(x, w13, w2, weights, ids.int()).shape == (0, 32)


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16_experts", "fp8_experts"])
@pytest.mark.parametrize(
    "tokens,top_k,renormalize,first_local,num_local",
    [(1, 8, True, 0, 16), (3, 2, False, 0, 16), (4, 4, True, 8, 8)],  # the last: rank 1 of EP=2
)
def test_routing_folded_into_gate_up_equals_the_routing_kernel(
    tokens, top_k, renormalize, first_local, num_local, fp8
):
    """route_decode_moe against route_triton then decode_moe: the same output bit for bit, the same load
    counts (a graph's padding row, KV slot -1, routed but not counted)."""
    held = slice(first_local, first_local + num_local)
    if fp8:
        x, w13, w2, _, _, scales = fp8_moe_inputs(tokens, 16, top_k, 32, 16, torch.float32, seed=tokens)
        mine = Fp8ExpertScales(scales.w13[held], scales.w2[held], scales.gate_up, scales.down)
    else:
        x, w13, w2, _, _ = moe_inputs(tokens, 16, top_k, 40, 24, torch.float32, seed=tokens)
        mine = None
    w13, w2 = w13[held], w2[held]
    logits = torch.randn(tokens, 16, generator=torch.Generator().manual_seed(tokens)).to(DEVICE)
    token_slots = torch.arange(tokens, device=DEVICE)
    token_slots[-1] = -1 if tokens > 1 else 0
    counts = {name: torch.zeros(16, dtype=torch.int32, device=DEVICE) for name in ("kernel", "folded")}
    weights, ids = triton_moe.route_triton(
        logits, top_k, renormalize, first_local, num_local, counts["kernel"], token_slots
    )
    want = decode_moe(x, w13, w2, weights, ids, mine)
    out = route_decode_moe(
        x, logits, w13, w2, top_k, renormalize, first_local, counts["folded"], token_slots, mine
    )
    assert torch.equal(out, want)
    assert torch.equal(counts["folded"], counts["kernel"]) and counts["kernel"].sum() > 0


@pytest.mark.parametrize("tokens", [3, 5])  # the decode path, then above decode_max_tokens
def test_the_bound_kernels_moe_is_the_same_with_the_routing_folded_or_not(monkeypatch, tokens):
    x, w13, w2, _, _ = moe_inputs(tokens, 8, 2, 32, 16, torch.float32, seed=11)
    logits = torch.randn(tokens, 8, generator=torch.Generator().manual_seed(12)).to(DEVICE)
    kernel = TritonMoe(group_by_expert_kernel, "test", decode_max_tokens=4)
    outs, counts = {}, {}
    for fold in (True, False):
        monkeypatch.setattr(triton_moe, "FOLD_ROUTING_MAX_TOKENS", 4 if fold else 0)
        counts[fold] = torch.zeros(8, dtype=torch.int32, device=DEVICE)
        outs[fold] = kernel.moe(x, logits, w13, w2, 2, True, 0, counts[fold])
    assert torch.equal(outs[True], outs[False]) and torch.equal(counts[True], counts[False])
    weights, ids = triton_moe.route_triton(logits, 2, True)
    torch.testing.assert_close(outs[True], experts_reference(x, w13, w2, weights, ids), atol=1e-5, rtol=1e-5)


# ---- GPU: Qwen3-30B-A3B's shapes (128 experts, top-8, hidden 2048, expert intermediate 768) ----

QWEN3_30B = (128, 8, 2048, 768)  # experts, top-k, hidden, expert intermediate


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("tokens", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("dtype", [pytest.param(torch.bfloat16, marks=pytest.mark.gpu_quick), torch.float32])
def test_gpu_decode_path_at_qwen3_30b_shapes(tokens, dtype):
    """Against the float32 reference and the grouped path; bfloat16 differs from the grouped path by the
    top-k sum's roundings (the reference's, per expert, against the grouped path's one fp32 sum)."""
    x, w13, w2, weights, ids = moe_inputs(tokens, *QWEN3_30B, dtype)
    out = decode_moe(x, w13, w2, weights, ids.int())
    want = float_reference(x, w13, w2, weights, ids)
    assert relative_error(out, want) <= (1e-5 if dtype == torch.float32 else 1e-2)
    grouped = fused_moe(x, w13, w2, weights, ids.int(), group=group_by_expert_kernel)
    assert relative_error(out, grouped) <= (1e-5 if dtype == torch.float32 else 1e-2)


@pytest.mark.gpu
@pytest.mark.gpu_quick
@needs_cuda
def test_gpu_decode_path_under_expert_parallelism():
    """EP=4: rank 2's 32 experts of 128; the other ranks' slots add nothing."""
    x, w13, w2, weights, ids = moe_inputs(3, *QWEN3_30B, torch.bfloat16)
    mine = slice(64, 96)
    local = torch.where((ids >= 64) & (ids < 96), ids - 64, 32)
    out = decode_moe(x, w13[mine], w2[mine], weights, local.int())
    want = float_reference(x, w13[mine], w2[mine], weights, torch.where(local < 32, local, -1))
    assert relative_error(out, want) <= 1e-2


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("inter_start", [0, 192])  # TP=4 ranks 0 and 1 of Qwen3-30B-A3B (768 / 4 = 192)
@pytest.mark.parametrize("tokens", [1, 4])
@pytest.mark.parametrize("dtype", [pytest.param(torch.bfloat16, marks=pytest.mark.gpu_quick), torch.float32])
def test_gpu_fp8_decode_path_at_qwen3_30b_shapes(tokens, dtype, inter_start):
    """A TP=4 rank's 192 rows of each expert (rank 1's down K shard at offset 64 of a 128-group), against the
    float32 W8A8 reference and the grouped fp8 path. The bound of test_triton_moe_fp8's GPU test: in float32 a
    SwiGLU output within a last-bit difference of an e4m3 rounding boundary moves a whole step (on the CPU one
    such step at 4 tokens already gave 9e-6 against the ~2e-7 of the others). In bf16 the bound is what the
    reference's own bf16 arithmetic moves from float32 (0.011-0.020 at these inputs: SwiGLU rows rounded to
    bf16 before their e4m3 rounding), with a margin; two bf16 paths may each move that far."""
    x, w13, w2, weights, ids, fp8 = fp8_moe_inputs(tokens, 128, 8, 2048, 192, dtype, inter_start, seed=6)
    out = decode_moe(x, w13, w2, weights, ids.int(), fp8)
    want = float_reference(x, w13, w2, weights, ids, fp8)
    grouped = fused_moe_fp8(x, w13, w2, weights, ids.int(), fp8, group=group_by_expert_kernel)
    if dtype == torch.float32:
        assert relative_error(out, want) <= 1e-3 and relative_error(out, grouped) <= 1e-3
        return
    noise = relative_error(experts_reference(x, w13, w2, weights, ids, fp8), want)
    assert relative_error(out, want) <= 1.5 * noise and relative_error(out, grouped) <= 2 * noise


@pytest.mark.gpu
@pytest.mark.gpu_quick
@needs_cuda
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16_experts", "fp8_experts"])
def test_gpu_decode_path_replays_in_a_cuda_graph(fp8):
    """Both launches captured once at 4 tokens, replayed on new tokens, routes and weights."""
    _, top_k, hidden, inter = QWEN3_30B

    def make(seed):
        if fp8:
            return fp8_moe_inputs(4, 16, top_k, hidden, 192, torch.bfloat16, seed=seed)
        return (*moe_inputs(4, 16, top_k, hidden, inter, torch.bfloat16, seed=seed), None)

    x, w13, w2, weights, ids, scales = make(7)
    ids32 = ids.to(torch.int32)
    kernel = TritonMoe(group_by_expert_kernel, "test", decode_max_tokens=4)
    kernel.experts(x, w13, w2, weights, ids32, True, scales)  # compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = kernel.experts(x, w13, w2, weights, ids32, True, scales)
    x2, _, _, weights2, ids2, _ = make(8)
    x.copy_(x2)
    weights.copy_(weights2)
    ids32.copy_(ids2)
    graph.replay()
    assert torch.equal(out, decode_moe(x, w13, w2, weights, ids32, scales))


COMPILE_FOR_HOPPER = r"""
import os, re, subprocess, sys, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from nanoexp.kernels import triton_moe_decode as d

CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
FLOATS = {"eps", "fp8_max"}


def compile_for_sm90(fn, pointers, constexprs, tile):
    dtype = pointers["*"][1:]
    signature = {}
    for param in fn.params:
        name = param.name
        if param.is_constexpr:
            signature[name] = "constexpr"
        elif name.endswith("_ptr"):
            signature[name] = pointers.get(name, pointers["*"])
        else:
            signature[name] = "fp32" if name in FLOATS else "i32"
    source = ASTSource(fn=fn, signature=signature, constexprs={"PDL": True, **constexprs})
    options = {"num_warps": tile.num_warps, "num_stages": tile.num_stages}
    kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        usage = subprocess.run([CUOBJDUMP, "-res-usage", f.name], capture_output=True, text=True).stdout
    print(dtype, fn.__name__, constexprs, re.search(r"STACK:\d+", usage).group(0))


for dtype in ("bf16", "fp32"):
    model = {"*": "*" + dtype, "ids_ptr": "*i32"}
    fp8 = model | {"w_ptr": "*fp8e4nv", "ws_ptr": "*fp32", "amax_ptr": "*fp32"}
    t, f = d.DECODE_TILES, d.DECODE_FP8_TILES
    routed = dict(TOP_K=8, K_PAD=8, BLOCK_E=128, ROUTE=True, RENORMALIZE=True, COUNT=True, HAS_SLOTS=True)
    gate_up = dict(BLOCK_N=t.gate_up.block_n, BLOCK_K=t.gate_up.block_k)
    compile_for_sm90(d._decode_gate_up_kernel, model, gate_up | dict(TOP_K=8), t.gate_up)
    compile_for_sm90(d._decode_gate_up_kernel, model, gate_up | routed, t.gate_up)
    down = dict(TOP_K=8, K_PAD=8, BLOCK_N=t.down.block_n, BLOCK_K=t.down.block_k)
    compile_for_sm90(d._decode_down_sum_kernel, model, down, t.down)
    ieee = dtype == "fp32"
    gate_up = dict(BLOCK_N=f.gate_up.block_n, KB_TILE=1, IEEE=ieee)
    compile_for_sm90(d._decode_fp8_gate_up_kernel, fp8, gate_up | dict(TOP_K=8), f.gate_up)
    compile_for_sm90(d._decode_fp8_gate_up_kernel, fp8, gate_up | routed, f.gate_up)
    for has_amax in (False, True):
        down = dict(TOP_K=8, K_PAD=8, BLOCK_N=f.down.block_n, HAS_AMAX=has_amax, IEEE=ieee)
        compile_for_sm90(d._decode_fp8_down_sum_kernel, fp8, down, f.down)
"""


def test_the_decode_kernels_compile_for_hopper_at_their_default_tiles():
    """Without a GPU: every decode kernel (bf16 and float32, bf16 and fp8 experts, gate_up routing or not)
    lowered to an sm_90 cubin by Triton's own ptxas (what the interpreter cannot check: layouts, 3-D
    reductions, fp8 conversions), the bf16 ones without register spills."""
    import triton

    bundled = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    if not os.path.exists(os.path.join(bundled, "ptxas")):
        pytest.skip("this Triton has no bundled ptxas")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run(
        [sys.executable, "-c", COMPILE_FOR_HOPPER], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert len(lines) == 14, run.stdout
    assert all(line.endswith("STACK:0") for line in lines if line.startswith("bf16")), run.stdout


@pytest.mark.gpu
@pytest.mark.gpu_quick
@needs_cuda
def test_gpu_folded_routing_replays_in_a_cuda_graph():
    """TritonMoe.moe at 4 tokens (routing folded into gate_up) captured once, replayed on new tokens and
    logits: the output of route_triton then decode_moe bit for bit, the same load counts, a padding row
    (KV slot -1) not counted."""
    experts, top_k, hidden, inter = QWEN3_30B
    x, w13, w2, _, _ = moe_inputs(4, *QWEN3_30B, torch.bfloat16, seed=9)
    logits = torch.randn(4, experts, device=DEVICE, dtype=torch.bfloat16)
    token_slots = torch.tensor([3, 1, 2, -1], device=DEVICE)
    counts = torch.zeros(experts, dtype=torch.int32, device=DEVICE)
    kernel = TritonMoe(group_by_expert_kernel, "test", decode_max_tokens=4)
    kernel.moe(x, logits, w13, w2, top_k, True, 0, counts, token_slots)  # compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = kernel.moe(x, logits, w13, w2, top_k, True, 0, counts, token_slots)
    x.copy_(torch.randn_like(x))
    logits.copy_(torch.randn_like(logits))
    counts.zero_()
    graph.replay()
    want_counts = torch.zeros_like(counts)
    weights, ids = triton_moe.route_triton(logits, top_k, True, 0, experts, want_counts, token_slots)
    assert torch.equal(out, decode_moe(x, w13, w2, weights, ids))
    assert torch.equal(counts, want_counts) and int(counts.sum()) == 3 * top_k
