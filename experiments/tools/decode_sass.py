"""The split-K decode kernel compiled offline for sm_90 (no GPU needed), and what its SASS does.

    python experiments/tools/decode_sass.py [--configs 128,4,3 64,4,3] [--dtypes fp8 bf16]

Compiles `_decode_split_kernel` at Qwen3-0.6B's layer shape (GQA 2, head_dim 128, block size 256,
one split) with the divisibility hints a real launch gets (pointers and strides divisible by 16),
disassembles it with the cuobjdump that ships with Triton, and prints, per config: the kernel's
instruction count, its main loop's (the one backward branch) and the loop's most frequent opcodes.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from nanoexp.kernels import triton_attention

sys.path.insert(0, str(Path(__file__).resolve().parent))
from offline_sass import compile_offline, main_loop, opcode, registers, sass  # noqa: E402

DIVISIBLE = (
    "stride_qb",
    "stride_qh",
    "stride_cb",
    "stride_cp",
    "stride_ch",
    "stride_ob",
    "stride_oh",
)


def compile_kernel(fp8: bool, block_n: int, warps: int, stages: int):
    cache = "*fp8e4nv" if fp8 else "*bf16"
    types = {
        "q_ptr": "*bf16",
        "k_cache_ptr": cache,
        "v_cache_ptr": cache,
        "block_tables_ptr": "*i32",
        "context_lens_ptr": "*i32",
        "out_ptr": "*bf16",
        "part_out_ptr": "*fp32",
        "part_lse_ptr": "*fp32",
        "k_scale_ptr": "*fp32",
        "v_scale_ptr": "*fp32",
        "qk_scale": "fp32",
    }
    constants = dict(
        GROUP=2,
        GROUP_PAD=16,
        HEAD_DIM=128,
        DIM_PAD=128,
        BLOCK_SIZE=256,
        BLOCK_N=block_n,
        SINGLE_SPLIT=True,
        KV_FP8=fp8,
        PDL=False,
    )
    kernel = triton_attention._decode_split_kernel
    return compile_offline(kernel, types, constants, DIVISIBLE, num_warps=warps, num_stages=stages)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--configs", nargs="+", default=["128,4,3", "128,4,2", "64,4,3"], help="keys per tile, warps, stages"
    )
    parser.add_argument("--dtypes", nargs="+", choices=["fp8", "bf16"], default=["fp8", "bf16"])
    args = parser.parse_args()
    for dtype in args.dtypes:
        for config in args.configs:
            block_n, warps, stages = map(int, config.split(","))
            kernel = compile_kernel(dtype == "fp8", block_n, warps, stages)
            code = sass(kernel.asm["cubin"])
            loop = Counter(opcode(t) for t in main_loop(code))
            moves = loop["IMAD.MOV.U32"] + loop["MOV"]
            spills = sum(1 for _, t in code if "STL" in t or "LDL" in t)
            regs = registers(kernel.asm["cubin"])
            print(
                f"{dtype} {block_n} keys {warps}w {stages}s: {regs} registers, {spills} spill "
                f"instructions, shared {kernel.metadata.shared} B, kernel "
                f"{len(code)} instructions, loop {sum(loop.values())} ({moves} moves), "
                f"top: {', '.join(f'{op} {n}' for op, n in loop.most_common(8))}"
            )


if __name__ == "__main__":
    main()
