"""Split-K decode attention per KV-cache dtype and kernel config (key tile, warps, pipeline
stages), against each dtype's bytes floor.

Qwen3-0.6B layer shapes (16 query heads, 8 KV heads, head_dim 128), block size 256, the default
split count; each timing is one CUDA graph replaying 28 calls over 28 distinct caches (one per
layer, as in a step). fp8 caches hold e4m3 values with scale 1 (the kernel reads the scales from
the device either way). A tile a dtype cannot compile (shared memory) prints "-".

    python experiments/kernels/bench_decode_tiles.py [--dtypes bf16 fp8_e4m3] [--out table.md]
    python experiments/kernels/bench_decode_tiles.py --splits 1 2 4 8   # the default tile per split count
    python experiments/kernels/bench_decode_tiles.py --kernel cuda_cores --dtypes fp8_e4m3 [--heads 32]
        # the CUDA-core kernel (kernels/triton_decode_fma.py) per (keys per tile, warps), first
        # column the tensor-core default, last the largest difference between the two outputs
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from triton.runtime.errors import OutOfResources

from nanoexp.kernels.triton_attention import paged_decode

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from timing import stream_table, time_graph_us  # noqa: E402

LAYERS, HEADS, KV_HEADS, DIM, BLOCK = 28, 16, 8, 128, 256
# (keys per tile, warps, stages); the first is the bf16 default
CONFIGS = (
    (64, 4, 2),
    (32, 4, 2),
    (128, 4, 2),
    (64, 4, 3),
    (128, 4, 3),
    (128, 8, 2),
    (128, 8, 3),
    (256, 8, 2),
)
SHAPES = ((64, 1024), (64, 2048), (256, 1024), (128, 4096))  # 28 bf16 caches of 128 x 4096: 60 GB
# (keys per tile, warps) of the CUDA-core kernel; the first column is the tensor-core default
CUDA_CORE_CONFIGS = ((64, 4), (128, 4), (256, 4), (128, 8))
DTYPES = {"bf16": torch.bfloat16, "fp8_e4m3": torch.float8_e4m3fn}


def time_tile(q, caches, tables, lens, max_len: int, config: tuple, scale: torch.Tensor) -> str:
    """config: (keys per tile, warps, stages, splits[, cuda cores]); None keeps paged_decode's own
    choice; without the fifth entry (or with a falsy one) the tensor-core kernel runs."""
    block_n, warps, stages, splits, *rest = config
    cuda_cores = bool(rest[0]) if rest else False

    def call(cache):
        return paged_decode(
            q,
            cache[0],
            cache[1],
            tables,
            lens,
            0.088,
            max_len,
            block_n=block_n,
            k_scale=scale,
            v_scale=scale,
            num_warps=warps,
            num_stages=stages,
            num_splits=splits,
            cuda_cores=cuda_cores,
        )

    try:
        return f"{time_graph_us([lambda c=c: call(c) for c in caches]):.1f}"
    except OutOfResources:
        return "-"


def max_difference(q, cache, tables, lens, context: int, configs: list[tuple], scale) -> float:
    """Largest |CUDA-core - tensor-core| output element over the CUDA-core configs."""
    base = paged_decode(
        q, cache[0], cache[1], tables, lens, 0.088, context, k_scale=scale, v_scale=scale, cuda_cores=False
    )
    worst = 0.0
    for block_n, warps, *_ in configs[1:]:
        got = paged_decode(
            q,
            cache[0],
            cache[1],
            tables,
            lens,
            0.088,
            context,
            k_scale=scale,
            v_scale=scale,
            num_warps=warps,
            block_n=block_n,
            cuda_cores=True,
        )
        worst = max(worst, (got.float() - base.float()).abs().max().item())
    return worst


def layer_cache(blocks: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    k = torch.randn(blocks, BLOCK, KV_HEADS, DIM, device="cuda").to(dtype)
    return k, torch.randn(blocks, BLOCK, KV_HEADS, DIM, device="cuda").to(dtype)


def row_for(
    name: str,
    batch: int,
    context: int,
    configs: list[tuple],
    heads: int = HEADS,
    max_len: int | None = None,
) -> str:
    """One table row: every config on one set of 28 layer caches (128 x 4,096 bf16 is 60 GB)."""
    dtype = DTYPES[name]
    blocks = batch * context // BLOCK
    q = torch.randn(batch, heads, DIM, device="cuda", dtype=torch.bfloat16)
    tables = torch.arange(blocks, device="cuda", dtype=torch.int32).view(batch, -1)
    lens = torch.full((batch,), context, device="cuda", dtype=torch.int32)
    scale = torch.ones(1, device="cuda")
    caches = [layer_cache(blocks, dtype) for _ in range(LAYERS)]
    cells = [time_tile(q, caches, tables, lens, max_len or context, c, scale) for c in configs]
    if len(configs[0]) == 5:
        cells.append(f"{max_difference(q, caches[0], tables, lens, context, configs, scale):.1e}")
    del caches
    torch.cuda.empty_cache()
    floor = batch * context * KV_HEADS * DIM * 2 * dtype.itemsize / 4.2e12 * 1e6
    return f"| {name} | {batch} | {context} | {' | '.join(cells)} | {floor:.1f} |"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    parser.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=list(DTYPES))
    parser.add_argument(
        "--splits",
        nargs="+",
        type=int,
        default=None,
        help="time the default tile at these split counts instead of the tile configs",
    )
    parser.add_argument(
        "--shapes", nargs="+", default=[f"{b}x{c}" for b, c in SHAPES], help="batch x context, e.g. 16x2048"
    )
    parser.add_argument("--heads", type=int, default=HEADS, help=f"query heads ({KV_HEADS} kv heads)")
    parser.add_argument("--kernel", choices=["tensor_cores", "cuda_cores"], default="tensor_cores")
    parser.add_argument(
        "--max-len",
        type=int,
        default=None,
        help="the length splits are chosen for (the engine: its block tables' capacity)",
    )
    args = parser.parse_args()
    if args.kernel == "cuda_cores":
        configs = [(None, None, None, None, False)]
        configs += [(n, w, None, None, True) for n, w in CUDA_CORE_CONFIGS]
        heads = " | ".join(["tensor cores us", *(f"{n}k {w}w us" for n, w in CUDA_CORE_CONFIGS), "max diff"])
    elif args.splits:
        configs = [(None, None, None, n) for n in args.splits]
        heads = " | ".join(f"{n} splits us" for n in args.splits)
    else:
        configs = [(*c, None) for c in CONFIGS]
        heads = " | ".join(f"{n}k {w}w {st}s us" for n, w, st in CONFIGS)
    rule = "|---|---:|---:|" + "---:|" * (len(configs) + 1 + (args.kernel == "cuda_cores"))
    header = [f"| cache | batch | context | {heads} | floor us |", rule]
    rows = (
        row_for(name, batch, context, configs, args.heads, args.max_len)
        for name in args.dtypes
        for batch, context in (map(int, shape.split("x")) for shape in args.shapes)
    )
    stream_table(header, rows, args.out)


if __name__ == "__main__":
    main()
