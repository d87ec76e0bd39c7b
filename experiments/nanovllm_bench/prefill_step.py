"""One 16k-token prefill step of Qwen3-0.6B (dummy bf16 weights): plain ops against the
torch.compile'd norms, RoPE and SwiGLU (layers/compiled.py), then the kernels of the compiled step,
by GPU time.

    python experiments/nanovllm_bench/prefill_step.py [--seqs 16] [--len 1024]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import yaml
from torch.profiler import ProfilerActivity, profile

from nanoexp import LLM
from nanoexp.kernels.triton_swiglu import silu_and_mul as swiglu_kernel
from nanoexp.layers.activation import silu_and_mul
from nanoexp.layers.compiled import use_compiled
from nanoexp.runner.inputs import prepare_inputs
from nanoexp.runner.step_input import StepInput

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from timing import time_ms  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seqs", type=int, default=16)
    parser.add_argument("--len", type=int, default=1024)
    args = parser.parse_args()
    arch = yaml.safe_load(open("conf/model/qwen3_0_6b.yaml"))["arch"]
    block = 256
    llm = LLM(
        "Qwen/Qwen3-0.6B",
        hf_config=arch,
        load_format="dummy",
        dtype="bfloat16",
        enforce_eager=True,
        kv_block_size=block,
        num_kv_blocks=args.seqs * args.len // block + 8,
    )
    runner = llm.engine.executor.runner
    per_seq = args.len // block
    tables = [list(range(i * per_seq, (i + 1) * per_seq)) for i in range(args.seqs)]
    lens = [args.len] * args.seqs
    step = StepInput(True, [i % 10000 for i in range(sum(lens))], lens, lens, tables, [])
    total = sum(lens)

    def forward():
        inputs = prepare_inputs(step, block, runner.device)
        return runner.model(inputs.input_ids, inputs.positions, inputs.md)

    with torch.inference_mode():
        inputs_ms = time_ms(lambda: prepare_inputs(step, block, runner.device), repeats=10)
        plain = time_ms(forward, repeats=10)
        with use_compiled(True):
            compiled_ms = time_ms(forward, repeats=10)
        floor = 2 * total * sum(p.numel() for p in runner.model.model.layers.parameters()) / 780e12 * 1e3
        print(
            f"prefill {args.seqs} x {args.len} = {total} tokens: inputs {inputs_ms:.2f} ms, "
            f"plain {plain:.2f} ms, compiled {compiled_ms:.2f} ms, GEMM floor {floor:.2f} ms"
        )
        print_swiglu(total, arch["intermediate_size"])
        with use_compiled(True), profile(activities=[ProfilerActivity.CUDA]) as prof:
            forward()
            torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=50))
    llm.close()


def print_swiglu(tokens: int, inter: int) -> None:
    """The step's SwiGLU alone: the torch.compile'd op against the Triton kernel, and the floor
    (read [gate | up], write the product, at 4.2 TB/s)."""
    x = torch.randn(tokens, 2 * inter, device="cuda", dtype=torch.bfloat16)
    with use_compiled(True):
        compiled = time_ms(lambda: silu_and_mul(x), repeats=20)
    kernel = time_ms(lambda: swiglu_kernel(x), repeats=20)
    floor = 3 * x.numel() // 2 * x.element_size() / 4.2e12 * 1e3
    print(
        f"SwiGLU [{tokens}, {2 * inter}]: compiled {compiled * 1e3:.0f} us, Triton kernel "
        f"{kernel * 1e3:.0f} us, floor {floor * 1e3:.0f} us"
    )


if __name__ == "__main__":
    main()
