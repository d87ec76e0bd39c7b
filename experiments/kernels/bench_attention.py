"""Micro-benchmark of the Triton attention kernels at Qwen3-0.6B shapes (CUDA only).

Decode: batch x context grid, achieved K/V bandwidth against the HBM floor.
Prefill: 8 sequences of 1024 tokens, straight from k/v and through the paged cache.
Each shape is checked against the torch backend before it is timed.

    python experiments/kernels/bench_attention.py [--json results.json]
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.testing

from nanoexp.experiment.runtime import atomic_files
from nanoexp.kernels.base import AttentionMetadata
from nanoexp.kernels.torch_ref import TorchAttentionBackend
from nanoexp.kernels.triton_attention import choose_num_splits
from nanoexp.kernels.triton_backend import TritonAttentionBackend

HEADS, KV_HEADS, HEAD_DIM = 16, 8, 128
HBM_BYTES_PER_S = 4.2e12
DTYPE = torch.bfloat16
SCALE = HEAD_DIM**-0.5
VERIFY_CHUNK = 16  # sequences per reference call, to bound its fp32 memory


def rel_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref.float()).norm() / ref.float().norm())


def paged_cache(batch: int, ctx: int, block_size: int):
    blocks_per_seq = triton.cdiv(ctx, block_size)
    num_blocks = batch * blocks_per_seq
    shape = (num_blocks, block_size, KV_HEADS, HEAD_DIM)
    k_cache = torch.randn(shape, device="cuda", dtype=DTYPE)
    v_cache = torch.randn(shape, device="cuda", dtype=DTYPE)
    perm = torch.randperm(num_blocks, device="cuda").to(torch.int32)
    return k_cache, v_cache, perm.view(batch, blocks_per_seq)


def verify_decode(q, k_cache, v_cache, md: AttentionMetadata, out: torch.Tensor) -> float:
    worst = 0.0
    ref_backend = TorchAttentionBackend()
    k_ref, v_ref = k_cache.float(), v_cache.float()
    for i in range(0, q.shape[0], VERIFY_CHUNK):
        rows = slice(i, i + VERIFY_CHUNK)
        sub = AttentionMetadata(
            has_prefill=False,
            slot_mapping=md.slot_mapping[rows],
            context_lens=md.context_lens[rows],
            block_tables=md.block_tables[rows],
        )
        ref = ref_backend.decode(q[rows].float(), k_ref, v_ref, sub, SCALE)
        worst = max(worst, rel_l2(out[rows], ref))
    return worst


def bench_decode(batch: int, ctx: int, block_size: int) -> dict:
    k_cache, v_cache, table = paged_cache(batch, ctx, block_size)
    md = AttentionMetadata(
        has_prefill=False,
        slot_mapping=torch.zeros(batch, dtype=torch.int64, device="cuda"),
        context_lens=torch.full((batch,), ctx, dtype=torch.int32, device="cuda"),
        block_tables=table,
        max_seqlen_k=ctx,
    )
    q = torch.randn(batch, HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
    backend = TritonAttentionBackend()
    run = lambda: backend.decode(q, k_cache, v_cache, md, SCALE)
    err = verify_decode(q, k_cache, v_cache, md, run())
    ms = triton.testing.do_bench(run, return_mode="median")
    kv_bytes = 2 * batch * ctx * KV_HEADS * HEAD_DIM * k_cache.element_size()
    floor_us = kv_bytes / HBM_BYTES_PER_S * 1e6
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    return {
        "kind": "decode",
        "batch": batch,
        "context": ctx,
        "splits": choose_num_splits(batch, KV_HEADS, table.shape[1] * block_size, num_sms),
        "us": ms * 1e3,
        "floor_us": floor_us,
        "GB/s": kv_bytes / (ms * 1e-3) / 1e9,
        "pct_floor": 100 * floor_us / (ms * 1e3),
        "rel_l2": err,
    }


def bench_prefill(num_seqs: int, seq_len: int, block_size: int, paged: bool) -> dict:
    k_cache, v_cache, table = paged_cache(num_seqs, seq_len, block_size)
    tokens = num_seqs * seq_len
    cu = torch.arange(0, tokens + 1, seq_len, dtype=torch.int32, device="cuda")
    md = AttentionMetadata(
        has_prefill=True,
        slot_mapping=torch.zeros(tokens, dtype=torch.int64, device="cuda"),
        context_lens=torch.full((num_seqs,), seq_len, dtype=torch.int32, device="cuda"),
        block_tables=table,
        cu_seqlens_q=cu,
        cu_seqlens_k=cu,
        max_seqlen_q=seq_len,
        max_seqlen_k=seq_len,
        has_cached_prefix=paged,  # True forces the paged read even without a real prefix
    )
    pos = torch.arange(seq_len, device="cuda")
    slots = (table[:, pos // block_size].long() * block_size + pos % block_size).flatten()
    md.slot_mapping = slots
    q = torch.randn(tokens, HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
    k = torch.randn(tokens, KV_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
    v = torch.randn(tokens, KV_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
    backend = TritonAttentionBackend()
    backend.store_kv(k, v, k_cache, v_cache, slots)
    run = lambda: backend.prefill(q, k, v, k_cache, v_cache, md, SCALE)
    ref = TorchAttentionBackend().prefill(
        q.float(), k.float(), v.float(), k_cache.float(), v_cache.float(), md, SCALE
    )
    err = rel_l2(run(), ref)
    ms = triton.testing.do_bench(run, return_mode="median")
    causal_flops = 4 * HEADS * HEAD_DIM * num_seqs * seq_len * (seq_len + 1) / 2
    return {
        "kind": "prefill_paged" if paged else "prefill",
        "batch": num_seqs,
        "context": seq_len,
        "us": ms * 1e3,
        "TFLOP/s": causal_flops / (ms * 1e-3) / 1e12,
        "rel_l2": err,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--contexts", type=int, nargs="+", default=[128, 1024, 4096])
    parser.add_argument("--block-size", type=int, default=256)
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    assert torch.cuda.is_available(), "this benchmark needs a CUDA device"
    torch.manual_seed(0)

    rows = []
    print(f"decode  heads {HEADS}/{KV_HEADS} head_dim {HEAD_DIM} bf16 block {args.block_size}")
    print(
        f"{'batch':>6} {'ctx':>6} {'splits':>6} {'us':>9} {'floor us':>9} {'GB/s':>8} "
        f"{'%floor':>7} {'rel_l2':>8}"
    )
    for batch in args.batches:
        for ctx in args.contexts:
            r = bench_decode(batch, ctx, args.block_size)
            rows.append(r)
            print(
                f"{batch:>6} {ctx:>6} {r['splits']:>6} {r['us']:>9.1f} {r['floor_us']:>9.1f} "
                f"{r['GB/s']:>8.0f} {r['pct_floor']:>6.1f}% {r['rel_l2']:>8.1e}"
            )
    print(f"\nprefill  8 x 1024 tokens, causal, block {args.block_size}")
    for paged in (False, True):
        r = bench_prefill(8, 1024, args.block_size, paged)
        rows.append(r)
        print(f"{r['kind']:>14} {r['us']:>9.1f} us {r['TFLOP/s']:>7.1f} TFLOP/s rel_l2 {r['rel_l2']:.1e}")
    if args.json:
        atomic_files.write_atomically(args.json, json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
