"""Times the tiled paged prefill kernel (a step graph's attention) over tile shapes, GPU only.

For each case (sequences x query length, the rest of the step graph's grid padded as the runner
pads it) and each (BLOCK_M queries, BLOCK_N keys, num_warps, num_stages), replays the launch in a CUDA graph
(triton.testing.do_bench_cudagraph) and checks the output against the default shape's. Also times
the decode kernel over a step graph's empty decode slots at its default split count and at one.

    python experiments/tools/prefill_kernel_sweep.py [--cases 1x16,1x512,8x512,1x4096] [--heads 16x8]
        [--default-only] [--top 8]
"""

from __future__ import annotations

import argparse
import itertools

import torch
from triton.testing import do_bench_cudagraph

from nanoexp.kernels.prefill_tiles import prefill_block_m, prefill_tiles
from nanoexp.kernels.triton_attention import paged_decode, varlen_prefill

HEAD_DIM, BLOCK_SIZE, MAX_SEQS, MAX_MODEL_LEN = 128, 256, 256, 40960
HEADS, KV_HEADS = 16, 8  # --heads


def case_inputs(num_seqs: int, q_len: int, graph_tokens: int, block_m: int):
    dev = torch.device("cuda")
    blocks_per_seq = -(-q_len // BLOCK_SIZE)
    k_cache = torch.randn(
        num_seqs * blocks_per_seq + 1, BLOCK_SIZE, KV_HEADS, HEAD_DIM, device=dev, dtype=torch.bfloat16
    )
    v_cache = torch.randn_like(k_cache)
    seqs = min(graph_tokens, MAX_SEQS)
    tables = torch.zeros(seqs, MAX_MODEL_LEN // BLOCK_SIZE, dtype=torch.int32, device=dev)
    for s in range(num_seqs):
        tables[s, :blocks_per_seq] = torch.arange(s * blocks_per_seq, (s + 1) * blocks_per_seq)
    lens = [q_len] * num_seqs
    context = torch.zeros(seqs, dtype=torch.int32, device=dev)
    context[:num_seqs] = q_len
    tiles = torch.full((graph_tokens // block_m + seqs + 1, 4), -1, dtype=torch.int32, device=dev)
    table = torch.from_numpy(prefill_tiles(lens, lens, 0, block_m))
    tiles[: len(table)] = table.to(dev)
    q = torch.randn(graph_tokens, HEADS, HEAD_DIM, device=dev, dtype=torch.bfloat16)
    cu = torch.zeros(seqs + 1, dtype=torch.int32, device=dev)
    return q, k_cache, v_cache, cu, context, tables, tiles


def run(case, block_m, block_n, warps, stages, graph_tokens):
    q, k_cache, v_cache, cu, context, tables, tiles = case_inputs(*case, graph_tokens, block_m)
    out = torch.zeros_like(q)

    def launch():
        varlen_prefill(
            q,
            k_cache,
            v_cache,
            cu,
            graph_tokens,
            context,
            tables,
            HEAD_DIM**-0.5,
            block_m=block_m,
            block_n=block_n,
            tiles=tiles,
            out=out,
            num_warps=warps,
            num_stages=stages,
        )

    launch()
    torch.manual_seed(0)
    return do_bench_cudagraph(launch, rep=50) * 1e3, out[: case[0] * case[1]].float()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default="1x16,1x512,8x512,1x4096")
    parser.add_argument("--heads", default="16x8", help="query heads x kv heads")
    parser.add_argument("--default-only", action="store_true", help="time the default shape only")
    parser.add_argument("--top", type=int, default=8, help="the fastest shapes printed per case")
    args = parser.parse_args()
    global HEADS, KV_HEADS
    HEADS, KV_HEADS = (int(x) for x in args.heads.split("x"))
    for spec in args.cases.split(","):
        num_seqs, q_len = (int(x) for x in spec.split("x"))
        graph_tokens = max(16, 1 << (num_seqs * q_len - 1).bit_length())
        default_m = prefill_block_m(HEAD_DIM, HEADS, KV_HEADS, graph_tokens)
        torch.manual_seed(0)
        base_us, reference = run((num_seqs, q_len), default_m, None, None, None, graph_tokens)
        flops = num_seqs * q_len * q_len * HEADS * HEAD_DIM * 2  # causal QK^T and PV
        print(
            f"{spec} (graph {graph_tokens}): default BLOCK_M={default_m}: {base_us:.1f} us "
            f"({flops / base_us / 1e6:.0f} TFLOP/s)",
            flush=True,
        )
        rows = []
        shapes = [] if args.default_only else itertools.product((16, 32, 64), (32, 64, 128), (4, 8), (2, 3))
        for block_m, block_n, warps, stages in shapes:
            try:
                torch.manual_seed(0)
                us, out = run((num_seqs, q_len), block_m, block_n, warps, stages, graph_tokens)
            except Exception as e:  # noqa: BLE001 - a shape that does not fit shared memory
                print(f"  {block_m}x{block_n} w{warps} s{stages}: {type(e).__name__}", flush=True)
                continue
            err = (out - reference).abs().max().item()
            rows.append((us, block_m, block_n, warps, stages, err))
        for us, block_m, block_n, warps, stages, err in sorted(rows)[: args.top]:
            print(f"  {block_m:3d}x{block_n:3d} w{warps} s{stages}: {us:7.1f} us  max|diff| {err:.1e}")
    for slots in (16, 256):
        for splits in (None, 1):
            us = empty_decode_us(slots, splits)
            print(f"decode over {slots} empty slots, splits {splits or 'default'}: {us:.1f} us")


def empty_decode_us(slots: int, splits: int | None) -> float:
    dev = torch.device("cuda")
    q = torch.randn(slots, HEADS, HEAD_DIM, device=dev, dtype=torch.bfloat16)
    cache = torch.randn(2, BLOCK_SIZE, KV_HEADS, HEAD_DIM, device=dev, dtype=torch.bfloat16)
    tables = torch.zeros(slots, MAX_MODEL_LEN // BLOCK_SIZE, dtype=torch.int32, device=dev)
    empty = torch.zeros(slots, dtype=torch.int32, device=dev)
    launch = lambda: paged_decode(q, cache, cache, tables, empty, 0.1, num_splits=splits)  # noqa: E731
    return do_bench_cudagraph(launch) * 1e3


if __name__ == "__main__":
    main()
