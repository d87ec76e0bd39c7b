"""The PDL prologue every decode-step Triton kernel starts with (kernels/pdl.py has the rule)."""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def wait_then_release(PDL: tl.constexpr):
    """Under PDL: wait for the previous kernel, then let the next one launch. A no-op otherwise."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
