"""What the one-row fp8 GEMV's K loop executes on sm_90, compiled offline (no GPU needed): registers, loop
instructions and the most frequent opcodes, for a few tiles, with its input quantized by its producer
(down_proj) or quantized in the kernel (o_proj). Per weight of a tile this gives the instruction count that
bounds the kernel's streaming rate: an SM issues 128 thread-instructions a clock, and 3 TB/s of e4m3 weights
on an H100's 132 SMs at 1.98 GHz is 11.5 weights a clock per SM.

    python experiments/fp8/gemv_sass.py"""

from __future__ import annotations

import collections
import inspect
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from offline_sass import compile_offline, main_loop, opcode, registers, sass  # noqa: E402

from nanoexp.kernels.triton_fp8 import _fp8_gemv_kernel  # noqa: E402

TYPES = {
    "xs_ptr": "*fp32",
    "w_ptr": "*fp8e4nv",
    "ws_ptr": "*fp32",
    "y_ptr": "*bf16",
    "part_ptr": "*fp32",
    "ticket_ptr": "*i32",
    "eps": "fp32",
    "fp8_max": "fp32",
}
TILES = [(4, 4, 4), (8, 4, 4)]  # block_n, kb_tile (128-blocks of K per iteration), num_warps


def main() -> None:
    params = inspect.signature(_fp8_gemv_kernel.fn).parameters
    variants = [False, True] if "HALF_PRODUCTS" in params else [False]
    print("| input | products | tile | registers | loop instructions | per weight | most frequent |")
    print("|---|---|---|---:|---:|---:|---|")
    for quantize in (False, True):
        types = TYPES | {"x_ptr": "*bf16" if quantize else "*fp8e4nv"}
        for half in variants:
            for block_n, kb_tile, warps in TILES:
                constants = dict(QUANTIZE=quantize, ROWS=1, BLOCK_N=block_n, KB_TILE=kb_tile, SPLIT_K=1)
                constants |= dict(IEEE=False, DEFER_SUM=True, PDL=True)
                if half:
                    constants["HALF_PRODUCTS"] = True
                kernel = compile_offline(_fp8_gemv_kernel, types, constants, num_warps=warps)
                loop = main_loop(sass(kernel.asm["cubin"]))
                weights_per_thread = block_n * kb_tile * 128 / (warps * 32)
                common = ", ".join(
                    f"{op} {n}" for op, n in collections.Counter(map(opcode, loop)).most_common(6)
                )
                cells = ["quantized in the kernel" if quantize else "quantized by its producer"]
                cells += ["fp16" if half else "fp32", f"{block_n} x {kb_tile}, {warps} warps"]
                cells += [
                    registers(kernel.asm["cubin"]),
                    len(loop),
                    f"{len(loop) / weights_per_thread:.1f}",
                    common,
                ]
                print("| " + " | ".join(map(str, cells)) + " |")


if __name__ == "__main__":
    main()
