"""The PDL prologue every decode-step Triton kernel starts with (kernels/pdl.py has the rule)."""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait


@triton.jit
def wait_for_previous(PDL: tl.constexpr):
    """Under PDL: wait until the previous kernel has finished and its writes are visible."""
    if PDL:
        gdc_wait()
