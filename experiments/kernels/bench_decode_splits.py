"""Split-K decode attention at small batches: time per call against the number of splits.

Qwen3-0.6B layer shapes (16 query heads, 8 KV heads, head_dim 128), bf16, block size 256; each
timing is one CUDA graph replaying 28 calls over 28 distinct caches (one per layer, as in a step).

    python experiments/kernels/bench_decode_splits.py
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from nanoexp.kernels.triton_attention import choose_num_splits, paged_decode

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from timing import time_graph_us  # noqa: E402

LAYERS, HEADS, KV_HEADS, DIM, BLOCK = 28, 16, 8, 128, 256
SPLITS = (1, 2, 4, 8, 16, 32)


def row_for(batch: int, context: int) -> str:
    blocks = batch * context // BLOCK
    caches = [
        torch.randn(2, blocks, BLOCK, KV_HEADS, DIM, device="cuda", dtype=torch.bfloat16)
        for _ in range(LAYERS)
    ]
    q = torch.randn(batch, HEADS, DIM, device="cuda", dtype=torch.bfloat16)
    tables = torch.arange(blocks, device="cuda", dtype=torch.int32).view(batch, -1)
    lens = torch.full((batch,), context, device="cuda", dtype=torch.int32)

    def call(cache, splits):
        return paged_decode(q, cache[0], cache[1], tables, lens, 0.088, context, splits)

    times = [time_graph_us([lambda c=c, s=s: call(c, s) for c in caches]) for s in SPLITS]
    floor = batch * context * KV_HEADS * DIM * 2 * 2 / 4.2e12 * 1e6
    default = choose_num_splits(batch, KV_HEADS, context, 132)
    cells = " | ".join(f"{t:.2f}" for t in times)
    return f"| {batch} | {context} | {default} | {cells} | {floor:.2f} |"


def main() -> None:
    help_format = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=help_format)
    parser.parse_args()  # no options: --help prints what the script measures
    heads = " | ".join(f"{s} splits us" for s in SPLITS)
    print(f"| batch | context | default splits | {heads} | floor us |")
    print("|---:|---:|---:|" + "---:|" * (len(SPLITS) + 1))
    for batch, context in ((1, 1024), (1, 4096), (4, 1024), (16, 1024), (64, 1024)):
        print(row_for(batch, context), flush=True)


if __name__ == "__main__":
    main()
