"""The PDL prologue every decode-step Triton kernel starts with (kernels/pdl.py has the rule)."""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def wait_for_previous(PDL: tl.constexpr):
    """Under PDL: wait until the previous kernel has finished and its writes are visible; with
    PDL == 2 (`engine.pdl=prefetch`) then let the next kernel launch at once."""
    if PDL:
        gdc_wait()
    if PDL == 2:
        gdc_launch_dependents()


@triton.jit
def prefetch_l2(ptrs, nbytes, mask):
    """Ask for each [ptrs, ptrs + nbytes) where mask holds to be brought into L2, without waiting
    (a bulk prefetch, Hopper and newer). Ranges whose address or size is not a multiple of 16
    bytes, which the instruction does not take, are skipped."""
    mask = mask & (ptrs.to(tl.int64) % 16 == 0) & (nbytes % 16 == 0) & (nbytes > 0)
    return tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.b32 p, $3, 0; "
        "@p cp.async.bulk.prefetch.L2.global [$1], $2; mov.b32 $0, 0; }",
        "=r,l,r,r",
        [ptrs.to(tl.int64), nbytes, mask.to(tl.int32)],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )
