"""The fused MoE experts (kernels/triton_moe.py) at Qwen3-30B-A3B's shapes (128 experts, top-8, hidden
2048, expert intermediate 768, bf16) against their floors: bytes of the experts the tokens touch over the
card's bandwidth, FLOPs over its bf16 rate. Each size is timed as a CUDA graph of calls on different
weight copies (so no call finds its experts in L2), after a check against the torch reference.

    python experiments/moe/bench_moe.py [--budget-s 60] [--tokens 1 16 64 256 4096] [--fp8]

Prints, per token count: the default tiles' time and ratio to floor, then every candidate tile (one GEMM's
tile changed at a time) within the time budget, best first. Up to DECODE_UP_TO tokens the decode path
(kernels/triton_moe_decode.py: two launches, no grouping) is timed beside the grouped path, its default
tiles and its candidates among the others, and a line says which path wins at that size (what
DECODE_MAX_TOKENS should be). --fp8: the same two paths with block-scaled e4m3 experts (random weights and
scales: timing only, checked against each other), at the decode sizes given."""

from __future__ import annotations

import argparse
import time

import torch

from nanoexp.kernels.fp8_reference import FP8_DTYPE
from nanoexp.kernels.moe_ref import Fp8ExpertScales, experts_reference, route
from nanoexp.kernels.triton_moe import (
    GemmTile,
    MoeTiles,
    experts_triton,
    fp8_tiles_for,
    fused_moe,
    fused_moe_fp8,
    group_by_expert,
    group_by_expert_kernel,
    make_triton_moe,
    route_triton,
    tiles_for,
)
from nanoexp.kernels.triton_moe_decode import (
    DECODE_TILES,
    DecodeTiles,
    GemvTile,
    decode_moe,
    route_decode_moe,
)
from nanoexp.layers.quantization import layout_for

EXPERTS, TOP_K, HIDDEN, INTER = 128, 8, 2048, 768
DEVICE = "cuda"
COPIES = 4  # weight sets per graph: 4 x 1.2 GB, far beyond L2
GATE_UP = [
    (16, 128, 4, 4),
    (32, 128, 4, 4),
    (64, 128, 4, 4),
    (64, 256, 4, 3),
    (128, 64, 4, 4),
    (128, 128, 8, 3),
    (64, 64, 4, 4),
]
DOWN = [
    (32, 128, 4, 4),
    (64, 128, 4, 4),
    (128, 64, 4, 4),
    (128, 128, 4, 3),
    (256, 64, 8, 3),
    (64, 256, 4, 3),
    (32, 256, 4, 4),
]
# the decode path's tiles (block_n, block_k, num_warps, num_stages): gate_up's program count at one token is
# 8 slots x 768 / block_n; down's is 2048 / block_n, each streaming its token's 8 experts at once
DECODE_GATE_UP = [
    (8, 128, 4, 1),
    (32, 128, 8, 1),
    (16, 256, 4, 1),
    (32, 64, 4, 1),
    (16, 64, 4, 1),
    (16, 128, 4, 1),
    (16, 256, 8, 1),
    (8, 256, 4, 1),
    (8, 256, 8, 1),
    (8, 128, 8, 1),
    (16, 512, 8, 1),
    (8, 512, 4, 1),
]
DECODE_DOWN = [
    (4, 128, 4, 1),
    (8, 64, 4, 1),
    (16, 64, 8, 1),
    (4, 256, 8, 1),
    (8, 128, 4, 1),
    (2, 128, 4, 1),
    (4, 256, 8, 1),
    (2, 256, 4, 1),
    (8, 256, 8, 1),
    (4, 256, 4, 1),
]
DECODE_UP_TO = 16  # token counts where the decode path is timed too
PREFILL_GATE_UP = [(64, 64, 8, 3), (128, 64, 8, 3), (64, 64, 4, 4), (64, 32, 4, 4), (128, 32, 8, 4)]
PREFILL_DOWN = [(128, 64, 8, 3), (256, 64, 8, 3), (64, 64, 4, 3), (128, 32, 4, 4), (128, 64, 4, 4)]


def card() -> tuple[str, float, float]:
    """(name, copy bandwidth B/s, bf16 dense FLOP/s): DESIGN.md's measured floors."""
    name = torch.cuda.get_device_name()
    bandwidth = 4.2e12 if "H200" in name else 3.0e12
    return name, bandwidth, 790e12


def graph_us(calls, replays: int = 10) -> float:
    """Mean time per call of `calls` replayed back to back from one CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for call in calls:
            call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / (replays * len(calls))


def inputs(tokens: int, seed: int = 0):
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    x = torch.randn(tokens, HIDDEN, device=DEVICE, generator=gen).bfloat16()
    logits = torch.randn(tokens, EXPERTS, device=DEVICE, generator=gen).bfloat16()
    weights, ids = route(logits, TOP_K, renormalize=True)
    return x, weights, ids


def floors(ids: torch.Tensor, tokens: int) -> tuple[float, float, int]:
    """(bytes, FLOPs, experts touched): each touched expert's three matrices read once, x read and the
    output written; 2 FLOPs per multiply-add of the 3 projections of each (token, expert) pair."""
    touched = int(ids.unique().numel())
    expert_bytes = 3 * INTER * HIDDEN * 2
    return (
        touched * expert_bytes + 2 * tokens * HIDDEN * 2,
        2.0 * tokens * TOP_K * 3 * INTER * HIDDEN,
        touched,
    )


def candidates(tokens: int) -> list[MoeTiles]:
    base = tiles_for(tokens)
    prefill = tokens > 256
    ups, downs = (PREFILL_GATE_UP, PREFILL_DOWN) if prefill else (GATE_UP, DOWN)
    out = [MoeTiles(base.block_m, GemmTile(*t), base.down) for t in ups]
    out += [MoeTiles(base.block_m, base.gate_up, GemmTile(*t)) for t in downs]
    for block_m in (64,) if prefill else (16, 32) if tokens >= 64 else ():
        out.append(MoeTiles(block_m, base.gate_up, base.down))
    return [t for t in out if t != base]


def decode_candidates() -> list[DecodeTiles]:
    out = [DecodeTiles(GemvTile(*t), DECODE_TILES.down) for t in DECODE_GATE_UP]
    return out + [DecodeTiles(DECODE_TILES.gate_up, GemvTile(*t)) for t in DECODE_DOWN]


def describe(tiles: MoeTiles | DecodeTiles) -> str:
    if isinstance(tiles, DecodeTiles):
        g, d = tiles.gate_up, tiles.down
        return (
            f"decode gate_up(BN={g.block_n},BK={g.block_k},w={g.num_warps},s={g.num_stages}) "
            f"down+sum(BN={d.block_n},BK={d.block_k},w={d.num_warps},s={d.num_stages})"
        )
    g, d = tiles.gate_up, tiles.down
    return (
        f"BM={tiles.block_m} gate_up(BN={g.block_n},BK={g.block_k},w={g.num_warps},s={g.num_stages}) "
        f"down(BN={d.block_n},BK={d.block_k},w={d.num_warps},s={d.num_stages})"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 16, 64, 256, 4096])
    parser.add_argument("--budget-s", type=float, default=60.0)
    parser.add_argument("--fp8", action="store_true", help="also the two paths with fp8 experts")
    args = parser.parse_args()
    name, bandwidth, flops_rate = card()
    print(f"card: {name}; floors at {bandwidth / 1e12:.1f} TB/s and {flops_rate / 1e12:.0f} TFLOP/s (bf16)")
    gen = torch.Generator(device=DEVICE).manual_seed(1)
    sets = [
        (
            torch.randn(EXPERTS, 2 * INTER, HIDDEN, device=DEVICE, generator=gen).bfloat16() * 0.02,
            torch.randn(EXPERTS, HIDDEN, INTER, device=DEVICE, generator=gen).bfloat16() * 0.02,
        )
        for _ in range(COPIES)
    ]
    for tokens in args.tokens:  # each size gets its share of the candidates' time budget
        bench(tokens, sets, bandwidth, flops_rate, time.perf_counter() + args.budget_s / len(args.tokens))
    if args.fp8:
        del sets
        fp8_sets = [fp8_experts(gen) for _ in range(COPIES)]
        print(f"\nfp8 experts (block-scaled e4m3, {COPIES} copies), decode path against grouped:")
        for tokens in [t for t in args.tokens if t <= DECODE_UP_TO]:
            bench_fp8(tokens, fp8_sets, bandwidth)


def bench(tokens: int, sets, bandwidth: float, flops_rate: float, deadline: float) -> None:
    x, weights, ids = inputs(tokens)
    w13, w2 = sets[0]
    ref = experts_reference(x.float(), w13.float(), w2.float(), weights.float(), ids)
    outs = [fused_moe(x, w13, w2, weights, ids), experts_triton(x, w13, w2, weights, ids.int())]
    if tokens <= DECODE_UP_TO:
        outs.append(decode_moe(x, w13, w2, weights, ids.int()))
    err = max(((out.float() - ref).norm() / ref.norm()).item() for out in outs)
    nbytes, flops, touched = floors(ids, tokens)
    floor_us = max(nbytes / bandwidth, flops / flops_rate) * 1e6
    bound = "bytes" if nbytes / bandwidth > flops / flops_rate else "FLOPs"

    ids32 = ids.int()
    engine = make_triton_moe(x.device)

    def timed(tiles: MoeTiles | DecodeTiles | None) -> float:
        """The experts with `tiles`, grouped as the engine groups (the one-kernel grouping where it passed
        its check): a candidate's time is what the engine would spend with it, once its output is within
        the defaults' error of the reference (else an error: a fast wrong tile is no candidate)."""
        if isinstance(tiles, DecodeTiles):
            calls = [lambda w=w: decode_moe(x, w[0], w[1], weights, ids32, tiles=tiles) for w in sets]
        else:
            group = engine.grouping
            calls = [
                lambda w=w: fused_moe(x, w[0], w[1], weights, ids32, tiles=tiles, group=group) for w in sets
            ]
        tile_err = ((calls[0]().float() - ref).norm() / ref.norm()).item()
        if tile_err > 2 * err + 1e-3:
            raise ValueError(f"rel. err {tile_err:.2e} against the defaults' {err:.2e}")
        return graph_us(calls)

    dispatched = graph_us([lambda w=w: engine.experts(x, w[0], w[1], weights, ids32) for w in sets])
    path = "decode" if tokens <= engine.decode_max_tokens else "grouped"
    default = timed(None)
    block_m = tiles_for(tokens).block_m
    group = graph_us([lambda: group_by_expert(ids.reshape(-1), EXPERTS, block_m)] * COPIES)
    try:
        group_kernel = graph_us(
            [lambda: group_by_expert_kernel(ids32.reshape(-1), EXPERTS, block_m)] * COPIES
        )
        one_launch = graph_us(
            [lambda w=w: fused_moe(x, w[0], w[1], weights, ids32, group=group_by_expert_kernel) for w in sets]
        )
        kernel_grouping = f"one-kernel grouping {group_kernel:.1f} us; grouped with it {one_launch:.1f} us"
    except Exception as exc:  # noqa: BLE001 - the alternative failing is a result, not the end of the run
        kernel_grouping = f"one-kernel grouping failed: {type(exc).__name__}: {str(exc)[:200]}"
    logits = torch.randn(tokens, EXPERTS, device=DEVICE).bfloat16()
    fused_route = graph_us([lambda: route_triton(logits, TOP_K, True)] * COPIES)
    counts = torch.zeros(EXPERTS, dtype=torch.int32, device=DEVICE)
    counted_route = graph_us([lambda: route_triton(logits, TOP_K, True, counts=counts)] * COPIES)
    torch_route = graph_us([lambda: route(logits, TOP_K, True)] * COPIES)
    print(
        f"\ntokens={tokens}: experts touched {touched}, floor {floor_us:.1f} us ({bound}: "
        f"{nbytes / 1e6:.1f} MB, {flops / 1e9:.2f} GFLOP); rel. err vs torch {err:.2e}\n"
        f"  engine path ({path}): {dispatched:.1f} us = {dispatched / floor_us:.2f}x floor "
        f"({nbytes / dispatched / 1e6:.2f} TB/s, {flops / dispatched / 1e6:.1f} TFLOP/s)\n"
        f"  grouped as the engine groups, default {describe(tiles_for(tokens))}: {default:.1f} us = "
        f"{default / floor_us:.2f}x; torch-op grouping alone {group:.1f} us ({kernel_grouping})\n"
        f"  routing: one kernel {fused_route:.1f} us ({counted_route:.1f} us counting the expert load), "
        f"torch ops {torch_route:.1f} us"
    )
    if tokens <= DECODE_UP_TO:
        decode = timed(DECODE_TILES)
        winner = "decode" if decode < default else "grouped"
        print(
            f"  decode path, default {describe(DECODE_TILES)}: {decode:.1f} us = {decode / floor_us:.2f}x; "
            f"at {tokens} tokens the {winner} path wins by {abs(default - decode):.1f} us"
        )

        def routed_then_grouped(w):
            routes = route_triton(logits, TOP_K, True, counts=counts)
            return fused_moe(x, w[0], w[1], *routes, group=engine.grouping)

        folded = graph_us(
            [lambda w=w: route_decode_moe(x, logits, w[0], w[1], TOP_K, True, counts=counts) for w in sets]
        )
        routed = graph_us([lambda w=w: routed_then_grouped(w) for w in sets])
        routed_decode = graph_us(
            [
                lambda w=w: decode_moe(x, w[0], w[1], *route_triton(logits, TOP_K, True, counts=counts))
                for w in sets
            ]
        )
        print(
            f"  with the routing (the layer after its router GEMM, load counted): the decode path with the "
            f"routing folded (FOLD_ROUTING_MAX_TOKENS) {folded:.1f} us, routing kernel + decode path "
            f"{routed_decode:.1f} us, routing kernel + grouped {routed:.1f} us"
        )
    results = []
    tried = (decode_candidates() if tokens <= DECODE_UP_TO else []) + candidates(tokens)
    for tiles in tried:
        if time.perf_counter() > deadline:
            print("  (time budget spent: remaining candidates not run)")
            break
        try:
            results.append((timed(tiles), describe(tiles)))
        except Exception as exc:  # noqa: BLE001 - a tile that does not compile (shared memory) is a result
            results.append((float("inf"), f"{describe(tiles)}: {type(exc).__name__}: {str(exc)[:80]}"))
    for us, what in sorted(results):
        print(f"  {us:8.1f} us  {us / floor_us:5.2f}x  {what}")


def fp8_experts(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, Fp8ExpertScales]:
    """One copy of random block-scaled e4m3 experts at the model's shapes (TP=1 layouts, 128-row scale
    blocks): weights as they stream, not a quantized model's values."""
    gate_up = layout_for(2 * INTER, HIDDEN, 0, [INTER, INTER])
    down = layout_for(HIDDEN, INTER, 0, [HIDDEN])
    w13 = torch.randn(EXPERTS, 2 * INTER, gate_up.k_padded, device=DEVICE, generator=gen).to(FP8_DTYPE)
    w2 = torch.randn(EXPERTS, HIDDEN, down.k_padded, device=DEVICE, generator=gen).to(FP8_DTYPE)
    s13 = torch.rand(EXPERTS, gate_up.scale_rows, gate_up.k_blocks, device=DEVICE, generator=gen) * 1e-3
    s2 = torch.rand(EXPERTS, down.scale_rows, down.k_blocks, device=DEVICE, generator=gen) * 1e-3
    return w13, w2, Fp8ExpertScales(s13, s2, gate_up, down)


def bench_fp8(tokens: int, sets, bandwidth: float) -> None:
    """The decode path against the grouped fp8 GEMMs (with their two quantization launches) at one size."""
    x, weights, ids = inputs(tokens)
    ids32 = ids.int()
    w13, w2, fp8 = sets[0]
    decode = decode_moe(x, w13, w2, weights, ids32, fp8)
    grouped = fused_moe_fp8(x, w13, w2, weights, ids32, fp8, group=group_by_expert_kernel)
    err = ((decode.float() - grouped.float()).norm() / grouped.float().norm()).item()
    touched = int(ids.unique().numel())
    scale_bytes = (fp8.w13[0].numel() + fp8.w2[0].numel()) * 4
    floor_us = (
        (touched * (w13[0].numel() + w2[0].numel() + scale_bytes) + 4 * tokens * HIDDEN) / bandwidth * 1e6
    )
    decode_us = graph_us([lambda s=s: decode_moe(x, s[0], s[1], weights, ids32, s[2]) for s in sets])
    tiles = fp8_tiles_for(tokens, x.dtype)
    grouped_us = graph_us(
        [
            lambda s=s: fused_moe_fp8(
                x, s[0], s[1], weights, ids32, s[2], tiles=tiles, group=group_by_expert_kernel
            )
            for s in sets
        ]
    )
    winner = "decode" if decode_us < grouped_us else "grouped"
    print(
        f"  tokens={tokens}: floor {floor_us:.1f} us (bytes, {touched} experts); decode {decode_us:.1f} us = "
        f"{decode_us / floor_us:.2f}x, grouped {grouped_us:.1f} us = {grouped_us / floor_us:.2f}x: {winner} "
        f"wins; rel. difference of the two {err:.2e}"
    )


if __name__ == "__main__":
    main()
