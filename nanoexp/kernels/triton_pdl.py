"""The PDL prologue every decode-step Triton kernel starts with (kernels/pdl.py has the rule)."""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def wait_then_release(PDL: tl.constexpr):
    """PDL 0: a no-op; 1: wait for the previous kernel (the next one launches as this one exits);
    2: wait, then let the next kernel launch at once."""
    if PDL >= 1:
        gdc_wait()
    if PDL == 2:
        gdc_launch_dependents()
