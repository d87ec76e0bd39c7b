"""The PDL prologue every decode-step Triton kernel starts with (kernels/pdl.py has the rule), and the
L2 prefetch of the next GEMM's weights the skinny GEMMs start with."""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait


@triton.jit
def wait_for_previous(PDL: tl.constexpr):
    """Under PDL: wait until the previous kernel has finished and its writes are visible."""
    if PDL:
        gdc_wait()


_BULK_PREFETCH = tl.constexpr("{ .reg .pred p; setp.ne.b32 p, $2, 0; "
                              "@p cp.async.bulk.prefetch.L2.global [$1], 16384; mov.u32 $0, 0; }")
L2_REQUEST_BYTES = tl.constexpr(16384)
PREFETCH_LANES = tl.constexpr(128)  # requests a program can make: 2 MiB


@triton.jit
def prefetch_to_l2(ptr, n_bytes, program, programs):
    """Asks L2 for this program's share of [ptr, ptr + n_bytes) in 16 KiB bulk prefetches (sm_90: no
    registers, nothing to wait for), so that the kernel after this one finds its weights there."""
    requests = n_bytes // L2_REQUEST_BYTES
    per_program = tl.cdiv(requests, programs)
    lane = tl.arange(0, PREFETCH_LANES)
    request = program * per_program + lane
    live = (lane < per_program) & (request < requests)
    address = ptr.to(tl.pointer_type(tl.int8), bitcast=True) + request.to(tl.int64) * L2_REQUEST_BYTES
    tl.inline_asm_elementwise(_BULK_PREFETCH, "=r,l,r", [address, live.to(tl.int32)], dtype=tl.int32,
                              is_pure=False, pack=1)  # fmt: skip
