"""torch's own SDPA backends (cuDNN, FlashAttention-2, memory-efficient) on one causal prompt, GPU only: the
headroom reference for the prefill kernel (prefill_kernel_sweep.py times ours). Dense [1, heads, tokens, 128]
bf16 with the kv heads repeated to the query heads.

    python experiments/tools/sdpa_reference.py [--tokens 4096] [--heads 32x8,16x8]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

HEAD_DIM = 128
BACKENDS = (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION)


def time_backend(backend: SDPBackend, q, k, v) -> float:
    with sdpa_kernel(backend):
        run = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
        run()
        return do_bench(run, rep=100) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--heads", default="32x8,16x8", help="query heads x kv heads, comma-separated")
    args = parser.parse_args()
    for spec in args.heads.split(","):
        heads, kv_heads = (int(x) for x in spec.split("x"))
        kv_shape = (1, kv_heads, args.tokens, HEAD_DIM)
        q = torch.randn(1, heads, args.tokens, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(kv_shape, device="cuda", dtype=torch.bfloat16) for _ in "kv")
        k, v = (t.repeat_interleave(heads // kv_heads, dim=1) for t in (k, v))
        flops = 2 * args.tokens**2 * heads * HEAD_DIM  # causal QK^T and PV
        for backend in BACKENDS:
            try:
                us = time_backend(backend, q, k, v)
            except RuntimeError as exc:  # a backend that does not take this shape here
                print(f"{spec} {backend.name}: {str(exc)[:120]}", flush=True)
                continue
            print(f"{spec} {backend.name}: {us:.1f} us ({flops / us / 1e6:.0f} TFLOP/s)", flush=True)


if __name__ == "__main__":
    main()
