"""Fused decode-layer kernels against what they replace, at Qwen3-0.6B shapes (H=16, Hkv=8, D=128, bf16).

1. q/k RMSNorm + RoPE + KV store: the torch.compile'd `qk_norm_rope` plus the `store_kv` kernel
   (today's decode graph) against the one Triton kernel, per token count.
2. Split-K paged decode: the split kernel plus the reduce kernel against the one-pass kernel whose
   last split combines, per (batch, context).

Each op is timed twice with CUDA events (median of repeats): launched directly, and replayed from
a CUDA graph of REPLAYS back-to-back calls (per-call time), which is how the engine's decode runs.
Every pair is checked for agreement before it is timed.

    python experiments/nanovllm_bench/bench_fused.py [--block-size 256] [--out table.md]
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable

import torch
from cuda_timing import time_ms

from nanoexp.kernels.triton_attention import choose_num_splits, paged_decode
from nanoexp.kernels.triton_fused import qk_norm_rope_store
from nanoexp.kernels.triton_kv import store_kv
from nanoexp.layers.fusion import fused
from nanoexp.layers.rope import RotaryEmbedding, qk_norm_rope

HEADS, KV_HEADS, HEAD_DIM, DTYPE = 16, 8, 128, torch.bfloat16
TOKENS = [1, 16, 64, 256]
DECODE_SHAPES = [(1, 128), (1, 1024), (16, 1024), (64, 1024), (256, 1024)]
REPLAYS = 20


def graph_ms(fn: Callable[[], object]) -> float:
    """Per-call time of fn replayed from one CUDA graph holding REPLAYS calls."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # warm-up (compiles, workspaces) outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(REPLAYS):
            fn()
    return time_ms(graph.replay) / REPLAYS


def torch_norm_rope_store(qkv, positions, cos_sin, q_w, k_w, k_cache, v_cache, slots):
    """Today's decode graph: the compiled q/k norm + RoPE, then the store_kv kernel."""
    tokens = qkv.shape[0]
    q, k, v = qkv.view(tokens, -1, HEAD_DIM).split([HEADS, KV_HEADS, KV_HEADS], dim=1)
    q, k = qk_norm_rope(positions, q, k, q_w, k_w, 1e-6, cos_sin)
    store_kv(k, v, k_cache, v_cache, slots)
    return q


def fused_norm_rope_store(qkv, positions, cos_sin, q_w, k_w, k_cache, v_cache, slots):
    return qk_norm_rope_store(qkv, positions, cos_sin, q_w, k_w, 1e-6, HEADS, KV_HEADS, k_cache, v_cache,
                              slots)[0]  # fmt: skip


def timings(a: Callable[[], object], b: Callable[[], object]) -> list[float]:
    """Direct launches of a and b, then per-call graph replays of a and b (ms)."""
    return [time_ms(a), time_ms(b), graph_ms(a), graph_ms(b)]


def row(cells: list, times: list[float], diff: float) -> str:
    us = [f"{t * 1e3:.1f}" for t in times]
    return "| " + " | ".join([*map(str, cells), *us, f"{times[2] / times[3]:.2f}x", f"{diff:.3g}"]) + " |"


def norm_rope_rows(block_size: int) -> list[str]:
    dev = torch.device("cuda")
    cos_sin = RotaryEmbedding(HEAD_DIM, 40960, 1e6).to(dev).cos_sin
    q_w, k_w = ((1 + 0.1 * torch.randn(HEAD_DIM, device=dev)).to(DTYPE) for _ in range(2))
    num_blocks = 64
    shape = (num_blocks, block_size, KV_HEADS, HEAD_DIM)
    caches = [torch.zeros(shape, device=dev, dtype=DTYPE) for _ in range(4)]
    rows = []
    for tokens in TOKENS:
        qkv = torch.randn(tokens, (HEADS + 2 * KV_HEADS) * HEAD_DIM, device=dev, dtype=DTYPE)
        positions = torch.randint(0, 4096, (tokens,), device=dev)
        slots = torch.randperm(num_blocks * block_size, device=dev)[:tokens]
        args = (qkv, positions, cos_sin, q_w, k_w)
        old = functools.partial(torch_norm_rope_store, *args, *caches[:2], slots)
        new = functools.partial(fused_norm_rope_store, *args, *caches[2:], slots)
        with fused(True):
            diff = (old().float() - new().float()).abs().max().item()
            k_diff = (caches[0].float() - caches[2].float()).abs().max().item()
            # a few bf16 steps at most; a wrong kernel is off by O(1)
            assert diff < 0.125 and k_diff < 0.125 and torch.equal(caches[1], caches[3]), (diff, k_diff)
            rows.append(row([tokens], timings(old, new), diff))
    return [
        "| tokens | compiled + store_kv us | fused us | graph: compiled + store_kv us | graph: fused us "
        "| graph speed-up | max abs diff q |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
    ]


def decode_rows(block_size: int) -> list[str]:
    dev = torch.device("cuda")
    num_sms = torch.cuda.get_device_properties(dev).multi_processor_count
    rows = []
    for batch, context in DECODE_SHAPES:
        per_seq = -(-context // block_size)
        num_blocks = batch * per_seq
        k_cache = torch.randn(num_blocks, block_size, KV_HEADS, HEAD_DIM, device=dev, dtype=DTYPE)
        v_cache = torch.randn_like(k_cache)
        tables = torch.randperm(num_blocks, device=dev, dtype=torch.int32).view(batch, per_seq)
        lens = torch.full((batch,), context, device=dev, dtype=torch.int32)
        q = torch.randn(batch, HEADS, HEAD_DIM, device=dev, dtype=DTYPE)
        splits = choose_num_splits(batch, KV_HEADS, per_seq * block_size, num_sms)
        args = (q, k_cache, v_cache, tables, lens, HEAD_DIM**-0.5)
        two = functools.partial(paged_decode, *args, fused_reduce=False)
        one = functools.partial(paged_decode, *args, fused_reduce=True)
        diff = (two().float() - one().float()).abs().max().item()
        assert diff < 1e-2, diff
        rows.append(row([batch, context, splits], timings(two, one), diff))
    return [
        "| batch | context | splits | two kernels us | one pass us | graph: two kernels us "
        "| graph: one pass us | graph speed-up | max abs diff |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--block-size", type=int, default=256)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    gpu = torch.cuda.get_device_name()
    lines = [f"Qwen3-0.6B shapes (H={HEADS}, Hkv={KV_HEADS}, D={HEAD_DIM}, bf16), block size "
             f"{args.block_size}, {gpu}; median of 30 repeats; graph columns: per call, "
             f"{REPLAYS} calls per graph.",
             "", "### q/k norm + RoPE + KV store", "", *norm_rope_rows(args.block_size),
             "", "### split-K paged decode", "", *decode_rows(args.block_size)]  # fmt: skip
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
