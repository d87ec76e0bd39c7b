"""The decode GEMM kernels compiled offline for sm_90 (no GPU needed): registers, spills, and what
their SASS holds, for the variants that had not run on a GPU when they were written.

    python experiments/kernels/gemm_sass.py [--out table.md]

GEMV (`triton_gemv._gemv_kernel`): norm + gate/up + SwiGLU at 1-4 rows, rows one by one or
together (`joint`), and Qwen3-8B's shapes with their default configs. Tensor-core kernel
(`triton_gemm._skinny_gemm_kernel`): row tiles of 64-128 with the norm in the K loop, against the
16-row tile with the norm pass that `auto` runs. Run it without TRITON_INTERPRET.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter

from nanoexp.kernels import triton_gemm, triton_gemv
from nanoexp.kernels.offline_sass import _cuobjdump, compile_offline, registers, sass

BF16 = ("x_ptr", "w_ptr", "bias_ptr", "y_ptr", "residual_ptr", "norm_w_ptr", "sum_ptr")
TYPES = dict.fromkeys(BF16, "*bf16") | {"part_ptr": "*fp32", "ticket_ptr": "*i32", "eps": "fp32"}
ALIGNED = ("stride_xm", "stride_wn", "stride_ym", "K", "N")
COUNTED = ("LDG", "FFMA", "SHFL", "BAR", "HGMMA", "HMMA", "LDGSTS", "STL", "LDL")


def describe(kernel) -> str:
    cubin = kernel.asm["cubin"]
    code = sass(cubin)
    ops = Counter(line.split()[1] if line.startswith("@") else line.split()[0] for _, line in code)
    counted = ", ".join(f"{op} {n}" for op, n in sorted(ops.items()) if op.startswith(COUNTED))
    stack = re.search(r"STACK:(\d+)", _cuobjdump(cubin, "-res-usage")).group(1)
    return f"{registers(cubin)} | {stack} | {len(code)} | {counted}"


def gemv_row(rows: int, n: int, k: int, gated: bool, joint: bool) -> str:
    config = triton_gemv.default_gemv_config(n, k, 132)
    constants = dict(HAS_BIAS=False, GATED=gated, NORM=True, HAS_RESIDUAL=True, ROWS=rows,
                     BLOCK_N=config.block_n, K_TILE=config.k_tile, SPLIT_K=-(-k // config.k_tile),
                     JOINT=joint, PDL=1)
    kernel = compile_offline(triton_gemv._gemv_kernel, TYPES, constants, aligned=ALIGNED,
                             num_warps=config.num_warps)
    name = f"GEMV {n}x{k}{' gated' if gated else ''}, {rows} rows{' joint' if joint else ''}"
    return f"| {name} | {config.block_n}/{config.k_tile}/w{config.num_warps} | {describe(kernel)} |"


def gemm_row(block_m: int, block_n: int, block_k: int, split: int, warps: int, gated: bool) -> str:
    in_loop = block_m > triton_gemm.NORM_PREPASS_MAX_ROWS
    constants = dict(HAS_BIAS=False, GATED=gated, NORM=True, HAS_RESIDUAL=True, BLOCK_M=block_m,
                     BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split, NORM_IN_LOOP=in_loop, PDL=1)
    kernel = compile_offline(triton_gemm._skinny_gemm_kernel, TYPES, constants, aligned=ALIGNED,
                             num_warps=warps)
    name = f"tensor-core{' gated' if gated else ''}, norm {'in the K loop' if in_loop else 'pass'}"
    return f"| {name} | m{block_m}/{block_n}/{block_k}/{split}/w{warps} | {describe(kernel)} |"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    lines = ["| kernel | config | registers | stack bytes | instructions | counted opcodes |",
             "|---|---|---:|---:|---:|---|"]
    for rows, joint in ((1, False), (2, False), (2, True), (4, False), (4, True)):
        lines.append(gemv_row(rows, 3072, 1024, True, joint))
    for n, k, gated in ((12288, 4096, True), (4096, 4096, False), (4096, 12288, False)):
        lines.append(gemv_row(1, n, k, gated, False))
    for config in ((16, 32, 256, 1, 4, True), (64, 64, 64, 1, 4, True), (128, 64, 64, 1, 8, True),
                   (64, 128, 64, 1, 4, False)):
        lines.append(gemm_row(*config))
    table = "\n".join(lines)
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
