"""The fused q/k norm + RoPE + KV store into an fp8 cache, V pages row-major against key-major
(kernels/base.py), at Qwen3-0.6B shapes (16 q heads, 8 KV heads, head_dim 128, block size 256).

Each timing is one CUDA graph of 28 stores into 28 distinct caches (a step's layers), followed by
advancing every slot by one, replayed back to back: consecutive replays write the next position
of each sequence, as consecutive decode steps do. Decode: one token per sequence in its own page;
prefill: 16 sequences of 1,024 consecutive slots.

    python experiments/kernels/bench_v_store.py [--out table.md]
"""

from __future__ import annotations

import argparse

import torch
from graph_timing import stream_table

from nanoexp.kernels.base import FP8_DTYPE, key_major_values
from nanoexp.kernels.triton_fused import qk_norm_rope_store

LAYERS, HEADS, KV_HEADS, DIM, BLOCK = 28, 16, 8, 128, 256
CASES = (("decode", 64, 1), ("decode", 256, 1), ("prefill", 16, 1024))  # (kind, sequences, tokens each)


def time_replays_us(graph: torch.cuda.CUDAGraph, replays: int = 20) -> float:
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / replays


def time_case(seqs: int, tokens_each: int, key_major: bool) -> float:
    pages_each = 4 if tokens_each == 1 else tokens_each // BLOCK + 1
    blocks = seqs * pages_each
    caches = []
    for _ in range(LAYERS):
        k = torch.zeros(blocks, BLOCK, KV_HEADS, DIM, device="cuda", dtype=FP8_DTYPE)
        v = torch.zeros_like(k)
        caches.append((k, key_major_values(v) if key_major else v))
    tokens = seqs * tokens_each
    qkv = torch.randn(tokens, (HEADS + 2 * KV_HEADS) * DIM, device="cuda", dtype=torch.bfloat16)
    starts = torch.arange(seqs, device="cuda") * pages_each * BLOCK + (BLOCK // 2 if tokens_each == 1 else 0)
    slots = (starts[:, None] + torch.arange(tokens_each, device="cuda")[None, :]).flatten().contiguous()
    positions = torch.zeros(tokens, device="cuda", dtype=torch.int64)
    cos_sin = torch.randn(4096, DIM, device="cuda")
    weight = torch.ones(DIM, device="cuda", dtype=torch.bfloat16)
    scale = torch.ones(1, device="cuda")

    def step():
        for k, v in caches:
            qk_norm_rope_store(qkv, positions, cos_sin, weight, weight, 1e-6, HEADS, KV_HEADS, k, v, slots,
                               k_scale=scale, v_scale=scale)  # fmt: skip
        slots.add_(1 if tokens_each == 1 else 0)

    step()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return time_replays_us(graph) / LAYERS


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    header = ["| kind | sequences x tokens | V row-major us/layer | V key-major us/layer |",
              "|---|---|---:|---:|"]
    rows = (
        f"| {kind} | {seqs} x {each} | "
        + " | ".join(f"{time_case(seqs, each, key_major):.1f}" for key_major in (False, True)) + " |"
        for kind, seqs, each in CASES
    )
    stream_table(header, rows, args.out)


if __name__ == "__main__":
    main()
