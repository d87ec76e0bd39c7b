"""Micro-benchmark of temperature sampling at Qwen3's vocabulary (CUDA only): the torch path
(compiled softmax + exponential race, as without the kernel) against the one-pass Triton kernel.
The floor is one read of the bf16 logits at copy bandwidth.

    python experiments/kernels/bench_sampler.py
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from timing import time_ms  # noqa: E402

from nanoexp.kernels import triton_sampler  # noqa: E402
from nanoexp.layers.compiled import use_compiled  # noqa: E402
from nanoexp.layers.sampler import sample_with_temperature  # noqa: E402

VOCAB = 151_936
HBM_BYTES_PER_S = 4.2e12


def main() -> None:
    help_format = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=help_format)
    parser.parse_args()  # no options: --help prints what the script measures
    print("| rows | torch path ms | kernel ms | floor ms | kernel / floor |")
    print("|---:|---:|---:|---:|---:|")
    for rows in (1, 16, 64, 128, 256):
        logits = torch.randn(rows, VOCAB, device="cuda", dtype=torch.bfloat16)
        temperatures = torch.full((rows,), 0.6, device="cuda")
        seeds = torch.randint(0, 2**62, (rows,), device="cuda")
        args = (logits, temperatures)
        with use_compiled(True):
            torch_ms = time_ms(lambda args=args: sample_with_temperature(*args))
        kernel_ms = time_ms(lambda args=(*args, seeds): triton_sampler.sample(*args))
        floor_ms = logits.numel() * logits.element_size() / HBM_BYTES_PER_S * 1e3
        print(f"| {rows} | {torch_ms:.3f} | {kernel_ms:.3f} | {floor_ms:.3f} | {kernel_ms / floor_ms:.1f} |")


if __name__ == "__main__":
    main()
