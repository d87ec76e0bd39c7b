"""Compile a Triton kernel for a GPU that is not here, and read its SASS.

Used to check from a CPU-only machine what a kernel compiles to on a given architecture (spills,
shared-memory round trips, the instructions its loops execute: experiments/tools/decode_sass.py).
"""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

INSTRUCTION = re.compile(r"\s+/\*([0-9a-f]{4})\*/\s+(.*?);")


def compile_offline(
    kernel,
    types: dict[str, str],
    constants: dict,
    aligned: tuple[str, ...] | None = None,
    arch: int = 90,
    num_warps: int = 4,
    num_stages: int = 3,
):
    """`kernel` compiled for sm_`arch`. `types` gives the Triton type of pointers and floats by
    parameter name (others are i32). Pointers and the integers named in `aligned` (default: every
    stride) get the 16-divisibility a real launch with aligned tensors gets."""
    params = inspect.signature(kernel.fn).parameters
    signature = {name: types.get(name, "i32") for name in params if name not in constants}
    signature |= dict.fromkeys(constants, "constexpr")
    names = [name for name in params if name in signature]
    integers = aligned if aligned is not None else tuple(n for n in names if n.startswith("stride"))
    divisible = [n for n in names if n.endswith("_ptr") or n in integers]
    source = ASTSource(
        fn=kernel,
        signature={name: signature[name] for name in names},
        constexprs={(names.index(k),): v for k, v in constants.items()},
        attrs={(names.index(n),): [["tt.divisibility", 16]] for n in divisible},
    )
    options = {"num_warps": num_warps, "num_stages": num_stages}
    return triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)


def sass(cubin: bytes) -> list[tuple[int, str]]:
    """(address, instruction) of a compiled kernel, from the cuobjdump that ships with Triton."""
    text = _cuobjdump(cubin, "-sass")
    return [(int(m.group(1), 16), m.group(2)) for m in map(INSTRUCTION.match, text.splitlines()) if m]


def opcode(instruction: str) -> str:
    words = instruction.split()
    return words[1] if words[0].startswith("@") else words[0]  # skip a predicate


def main_loop(code: list[tuple[int, str]]) -> list[str]:
    """The instructions of the first loop (the first backward branch and what it jumps over)."""
    for address, text in code:
        target = re.search(r"BRA.*?0x([0-9a-f]+)", text)
        if target and int(target.group(1), 16) < address:
            start = int(target.group(1), 16)
            return [t for a, t in code if start <= a <= address]
    return []


def registers(cubin: bytes) -> int:
    """Registers per thread of a compiled kernel (cuobjdump's resource usage)."""
    return int(re.search(r"REG:(\d+)", _cuobjdump(cubin, "-res-usage")).group(1))


def _cuobjdump(cubin: bytes, flag: str) -> str:
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([cuobjdump, flag, f.name], capture_output=True, text=True, check=True).stdout
