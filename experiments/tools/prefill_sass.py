"""The prefill attention kernel compiled offline for sm_90 at Qwen3-8B's heads (32 query, 8 kv, head_dim 128)
and a 4,096-token step's tiles, its output in bf16 and quantized for an fp8 o_proj (QUANTIZED_OUT): registers
a thread, local-memory loads and stores (spills) and shared memory of each.

    python experiments/tools/prefill_sass.py"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from offline_sass import compile_offline, registers, sass  # noqa: E402

from nanoexp.kernels.prefill_tiles import prefill_config  # noqa: E402
from nanoexp.kernels.triton_attention import _prefill_kernel  # noqa: E402

POINTERS = {
    **dict.fromkeys(("q_ptr", "k_ptr", "v_ptr"), "*bf16"),
    **dict.fromkeys(("cu_seqlens_q_ptr", "context_lens_ptr", "block_tables_ptr", "tiles_ptr"), "*i32"),
    **dict.fromkeys(("k_scale_ptr", "v_scale_ptr", "out_scales_ptr"), "*fp32"),
    **dict.fromkeys(("qk_scale", "act_eps", "fp8_max"), "fp32"),
}


def main() -> None:
    block_m, block_n, warps, stages = prefill_config(128, 32, 8, 4096)
    print(f"tile: {block_m} queries x 4 heads, {block_n} keys, {warps} warps, {stages} stages")
    for quantized in (False, True):
        types = dict(POINTERS, out_ptr="*fp8e4nv" if quantized else "*bf16")
        constants = dict(
            GROUP=4, GROUP_PAD=4, HEAD_DIM=128, DIM_PAD=128, BLOCK_SIZE=1, BLOCK_M=block_m, BLOCK_N=block_n,
            PAGED=False, KV_FP8=False, TILED=False, QUANTIZED_OUT=quantized, IEEE=False,
        )  # fmt: skip
        kernel = compile_offline(_prefill_kernel, types, constants, num_warps=warps, num_stages=stages)
        cubin = kernel.asm["cubin"]
        spills = sum("LDL" in text or "STL" in text for _, text in sass(cubin))
        name = "quantized output" if quantized else "bf16 output"
        shared = kernel.metadata.shared
        print(f"{name}: {registers(cubin)} registers, {spills} local loads/stores, {shared} B shared")


if __name__ == "__main__":
    main()
