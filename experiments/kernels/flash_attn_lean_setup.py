"""Build flash-attn 2's CUDA extension with only the kernels nanoexp calls.

Run from the unpacked flash-attn sdist directory (it replaces that package's setup.py):

    FA_HEAD_DIMS="128" FA_CUDA_ARCHS="90" MAX_JOBS=16 python flash_attn_lean_setup.py build_ext --inplace

What nanoexp calls (nanoexp/kernels/flash_attn_backend.py): flash_attn_varlen_func (prefill; with
a block_table when a cached prefix is attended) and flash_attn_with_kvcache with a block_table
(decode); forward only, fp16/bf16, causal and non-causal (flash-attn drops causal for one query).
The varlen path without a block table runs `run_mha_fwd_` (flash_fwd_hdim*.cu); a block table forces
the split-KV kernels (flash_fwd_split_hdim*.cu). Both are kept, for the chosen head dims only.

Two source edits make the smaller kernel list link: HEADDIM_SWITCH dispatches only to the built head
dims (others raise instead of referencing missing kernels), and run_mha_bwd is compiled empty under
FLASHATTENTION_DISABLE_BACKWARD (flash-attn's own flag already makes mha_bwd raise). The other
FLASHATTENTION_DISABLE_* flags are flash-attn's own; each makes the feature raise if asked for, and
together they cut the template instantiations per kernel file from 64-128 to 4-8.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

SRC = Path.cwd()
HEAD_DIMS = sorted(int(d) for d in os.environ.get("FA_HEAD_DIMS", "128").split())
ARCHS = os.environ.get("FA_CUDA_ARCHS", "90").split()
BUCKETS = (32, 64, 96, 128, 192, 256)  # flash-attn's head-dim kernels; a head dim runs in the next bucket up
DISABLED = ("BACKWARD", "DROPOUT", "ALIBI", "SOFTCAP", "LOCAL", "UNEVEN_K")


def kernel_sources() -> list[str]:
    files = []
    for d in HEAD_DIMS:
        for kind in ("fwd", "fwd_split"):
            for dtype in ("fp16", "bf16"):
                for causal in ("", "_causal"):
                    files.append(f"csrc/flash_attn/src/flash_{kind}_hdim{d}_{dtype}{causal}_sm80.cu")
    missing = [f for f in files if not (SRC / f).exists()]
    if missing:
        raise SystemExit(f"not a flash-attn 2 source tree, or no kernels for FA_HEAD_DIMS: {missing}")
    return ["csrc/flash_attn/flash_api.cpp", *files]


def headdim_switch() -> str:
    """HEADDIM_SWITCH over the built buckets only; any other head dim raises."""
    lines = ["#define HEADDIM_SWITCH(HEADDIM, ...)", "  [&] {"]
    for d in HEAD_DIMS:
        if d not in BUCKETS:
            raise SystemExit(f"FA_HEAD_DIMS has {d}; flash-attn builds head dims {BUCKETS}")
        lower = max([b for b in BUCKETS if b < d], default=0)
        lines += [
            f"    if (HEADDIM > {lower} && HEADDIM <= {d}) {{",
            f"      constexpr static int kHeadDim = {d};",
            "      return __VA_ARGS__();",
            "    }",
        ]
    built = ", ".join(str(d) for d in HEAD_DIMS)
    lines += [
        f'    throw std::invalid_argument("this flash-attn build has head dims {built} only");',
        "  }()",
    ]
    return " \\\n".join(lines) + "\n"


def replace_once(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    if new in text:
        return
    if text.count(old) != 1:
        raise SystemExit(f"{path}: expected one occurrence of {old[:60]!r}; is this flash-attn 2.8.x?")
    path.write_text(text.replace(old, new))


def patch_sources() -> None:
    switch_h = SRC / "csrc/flash_attn/src/static_switch.h"
    text = switch_h.read_text()
    start = text.index("#define HEADDIM_SWITCH")
    end = text.index("}()", start) + len("}()\n")
    text = text[:start] + headdim_switch() + text[end:]
    if "#include <stdexcept>" not in text:
        text = text.replace("#pragma once", "#pragma once\n#include <stdexcept>", 1)
    switch_h.write_text(text)
    api = SRC / "csrc/flash_attn/flash_api.cpp"
    replace_once(
        api,
        "void run_mha_bwd(Flash_bwd_params &params, cudaStream_t stream) {\n    FP16_SWITCH(",
        "void run_mha_bwd(Flash_bwd_params &params, cudaStream_t stream) {\n"
        "#ifdef FLASHATTENTION_DISABLE_BACKWARD\n    return;\n#endif\n    FP16_SWITCH(",
    )


def nvcc_flags() -> list[str]:
    flags = [
        "-O3",
        "-std=c++17",
        "-U__CUDA_NO_HALF_OPERATORS__",
        "-U__CUDA_NO_HALF_CONVERSIONS__",
        "-U__CUDA_NO_HALF2_OPERATORS__",
        "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
        "--expt-relaxed-constexpr",
        "--expt-extended-lambda",
        "--use_fast_math",
        "--threads",
        os.environ.get("NVCC_THREADS", "1"),
    ]
    for arch in ARCHS:
        flags += ["-gencode", f"arch=compute_{arch},code=sm_{arch}"]
    return flags + defines()


def defines() -> list[str]:
    return [f"-DFLASHATTENTION_DISABLE_{name}" for name in DISABLED]


def main() -> None:
    if {"-h", "--help"} & set(sys.argv[1:]):  # before anything reads or patches the sources
        print(__doc__)
        return
    if not (SRC / "csrc/cutlass/include/cutlass/cutlass.h").exists():
        raise SystemExit("csrc/cutlass is missing: run from the unpacked flash-attn sdist (it ships cutlass)")
    patch_sources()
    setup(
        name="flash_attn",
        packages=[],  # the Python package is copied as is; no discovery over the sdist's flat layout
        py_modules=[],
        ext_modules=[
            CUDAExtension(
                name="flash_attn_2_cuda",
                sources=kernel_sources(),
                extra_compile_args={"cxx": ["-O3", "-std=c++17", *defines()], "nvcc": nvcc_flags()},
                include_dirs=[
                    SRC / "csrc/flash_attn",
                    SRC / "csrc/flash_attn/src",
                    SRC / "csrc/cutlass/include",
                ],
            )
        ],
        cmdclass={"build_ext": BuildExtension},
    )


if __name__ == "__main__":
    main()
