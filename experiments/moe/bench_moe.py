"""The fused MoE experts (kernels/triton_moe.py) at Qwen3-30B-A3B's shapes (128 experts, top-8, hidden
2048, expert intermediate 768, bf16) against their floors: bytes of the experts the tokens touch over the
card's bandwidth, FLOPs over its bf16 rate. Each size is timed as a CUDA graph of calls on different
weight copies (so no call finds its experts in L2), after a check against the torch reference.

    python experiments/moe/bench_moe.py [--budget-s 60] [--tokens 1 16 64 256 4096]

Prints, per token count: the default tiles' time and ratio to floor, then every candidate tile (one GEMM's
tile changed at a time) within the time budget, best first."""

from __future__ import annotations

import argparse
import time

import torch

from nanoexp.kernels.moe_ref import experts_reference, route
from nanoexp.kernels.triton_moe import (
    SLOT_TILES,
    GemmTile,
    MoeTiles,
    SlotTiles,
    experts_triton,
    fused_moe,
    group_by_expert,
    group_by_expert_kernel,
    make_triton_moe,
    route_triton,
    slot_moe,
    tiles_for,
)

EXPERTS, TOP_K, HIDDEN, INTER = 128, 8, 2048, 768
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
SLOT_GATE_UP = [
    (16, 128, 4, 3),
    (64, 128, 4, 3),
    (32, 256, 4, 3),
    (16, 256, 4, 2),
    (32, 64, 4, 4),
    (32, 128, 8, 3),
]
SLOT_DOWN = [
    (32, 128, 4, 3),
    (64, 128, 4, 3),
    (32, 256, 4, 3),
    (16, 256, 4, 2),
    (32, 64, 4, 4),
    (32, 128, 8, 3),
]
SLOT_PATH_UP_TO = 64  # token counts where the slot path is timed too
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
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(tokens, HIDDEN, device="cuda", generator=gen).bfloat16()
    logits = torch.randn(tokens, EXPERTS, device="cuda", generator=gen).bfloat16()
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


def slot_candidates() -> list[SlotTiles]:
    out = [SlotTiles(GemmTile(*t), SLOT_TILES.down) for t in SLOT_GATE_UP]
    return out + [SlotTiles(SLOT_TILES.gate_up, GemmTile(*t)) for t in SLOT_DOWN]


def describe(tiles: MoeTiles | SlotTiles) -> str:
    if isinstance(tiles, SlotTiles):
        g, d = tiles.gate_up, tiles.down
        return (
            f"slot gate_up(BN={g.block_n},BK={g.block_k},w={g.num_warps},s={g.num_stages}) "
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
    args = parser.parse_args()
    name, bandwidth, flops_rate = card()
    print(f"card: {name}; floors at {bandwidth / 1e12:.1f} TB/s and {flops_rate / 1e12:.0f} TFLOP/s (bf16)")
    gen = torch.Generator(device="cuda").manual_seed(1)
    sets = [
        (
            torch.randn(EXPERTS, 2 * INTER, HIDDEN, device="cuda", generator=gen).bfloat16() * 0.02,
            torch.randn(EXPERTS, HIDDEN, INTER, device="cuda", generator=gen).bfloat16() * 0.02,
        )
        for _ in range(COPIES)
    ]
    for tokens in args.tokens:  # each size gets its share of the candidates' time budget
        bench(tokens, sets, bandwidth, flops_rate, time.perf_counter() + args.budget_s / len(args.tokens))


def bench(tokens: int, sets, bandwidth: float, flops_rate: float, deadline: float) -> None:
    x, weights, ids = inputs(tokens)
    w13, w2 = sets[0]
    ref = experts_reference(x.float(), w13.float(), w2.float(), weights.float(), ids)
    outs = (fused_moe(x, w13, w2, weights, ids), experts_triton(x, w13, w2, weights, ids.int()))
    err = max(((out.float() - ref).norm() / ref.norm()).item() for out in outs)
    nbytes, flops, touched = floors(ids, tokens)
    floor_us = max(nbytes / bandwidth, flops / flops_rate) * 1e6
    bound = "bytes" if nbytes / bandwidth > flops / flops_rate else "FLOPs"

    ids32 = ids.int()
    engine = make_triton_moe(x.device)

    def timed(tiles: MoeTiles | SlotTiles | None) -> float:
        """The experts with `tiles`, grouped as the engine groups (the one-kernel grouping where it passed
        its check): a candidate's time is what the engine would spend with it."""
        if isinstance(tiles, SlotTiles):
            calls = [lambda w=w: slot_moe(x, w[0], w[1], weights, ids32, tiles=tiles) for w in sets]
        else:
            group = engine.grouping
            calls = [
                lambda w=w: fused_moe(x, w[0], w[1], weights, ids32, tiles=tiles, group=group) for w in sets
            ]
        return graph_us(calls)

    dispatched = graph_us([lambda w=w: engine.experts(x, w[0], w[1], weights, ids32) for w in sets])
    path = "slot" if tokens <= engine.slot_max_tokens else "grouped"
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
    logits = torch.randn(tokens, EXPERTS, device="cuda").bfloat16()
    fused_route = graph_us([lambda: route_triton(logits, TOP_K, True)] * COPIES)
    counts = torch.zeros(EXPERTS, dtype=torch.int32, device="cuda")
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
    if tokens <= SLOT_PATH_UP_TO:
        slot = timed(SLOT_TILES)
        print(f"  slot, default {describe(SLOT_TILES)}: {slot:.1f} us = {slot / floor_us:.2f}x")
    results = []
    tried = candidates(tokens) + (slot_candidates() if tokens <= SLOT_PATH_UP_TO else [])
    for tiles in tried:
        if time.perf_counter() > deadline:
            print("  (time budget spent: remaining candidates not run)")
            break
        try:
            results.append((timed(tiles), describe(tiles)))
        except Exception as exc:  # noqa: BLE001 - a tile that does not compile (shared memory) is a result
            results.append((float("inf"), f"{describe(tiles)}: {type(exc).__name__}"))
    for us, what in sorted(results):
        print(f"  {us:8.1f} us  {us / floor_us:5.2f}x  {what}")


if __name__ == "__main__":
    main()
