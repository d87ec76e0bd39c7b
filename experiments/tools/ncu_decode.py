"""One eager split-K decode call per cache dtype at Qwen3-0.6B layer shapes, for a profiler.

    ncu --clock-control none --set full -k regex:_decode_split_kernel \\
        python experiments/tools/ncu_decode.py --batch 256 --context 1024

Each dtype's call runs twice (the first compiles); profile the last launch of each.
"""

from __future__ import annotations

import argparse

import torch

from nanoexp.kernels.triton_attention import paged_decode

HEADS, KV_HEADS, DIM, BLOCK = 16, 8, 128, 256


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--dtypes", nargs="+", default=["bf16", "fp8_e4m3"])
    args = parser.parse_args()
    blocks = args.batch * args.context // BLOCK
    q = torch.randn(args.batch, HEADS, DIM, device="cuda", dtype=torch.bfloat16)
    tables = torch.arange(blocks, device="cuda", dtype=torch.int32).view(args.batch, -1)
    lens = torch.full((args.batch,), args.context, device="cuda", dtype=torch.int32)
    scale = torch.ones(1, device="cuda")
    for name in args.dtypes:
        dtype = torch.bfloat16 if name == "bf16" else torch.float8_e4m3fn
        cache = torch.randn(2, blocks, BLOCK, KV_HEADS, DIM, device="cuda").to(dtype)
        fp8 = dtype == torch.float8_e4m3fn
        for _ in range(2):
            paged_decode(
                q,
                cache[0],
                cache[1],
                tables,
                lens,
                0.088,
                args.context,
                k_scale=scale if fp8 else None,
                v_scale=scale if fp8 else None,
            )
        torch.cuda.synchronize()
        print(name, "done", flush=True)


if __name__ == "__main__":
    main()
