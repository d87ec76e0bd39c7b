"""Decode-step time of Qwen3-0.6B (dummy bf16 weights) against its bytes floor.

For each batch size B and context length C, every sequence holds C cached tokens; one decode step
reads all weights once plus B*C tokens of K and V. Times the captured CUDA graph (forward), the
LM head and the sampler separately, and the three back to back, with CUDA events, median of
repeats. The timed forwards cycle through ROTATIONS consecutive positions (contexts C .. C +
ROTATIONS - 1), so each step stores its new K/V at new slots, as decode does: replaying one step
rewrites the same slots, which stay in L2 and hide what the store costs (experiments/kernels/README.md,
key-major V pages).

    python experiments/nanovllm_bench/decode_step.py [--bandwidth 4.2e12] [--out table.md]
"""

from __future__ import annotations

import argparse
import itertools
import random
import sys
from pathlib import Path

import torch
import yaml

from nanoexp import LLM
from nanoexp.experiment.runtime import atomic_files
from nanoexp.runner.inputs import prepare_step
from nanoexp.runner.step_input import StepInput

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from timing import time_ms  # noqa: E402

BATCHES = [1, 16, 64, 128, 256]
ROTATIONS = 8  # a step's new K/V over 8 steps at 256 sequences: more than L2 holds
CONTEXTS = [128, 512, 1024, 2048, 4096]


def decode_steps(
    batch: int, context: int, block_size: int, num_blocks: int, rotations: int = 1
) -> list[StepInput]:
    """`rotations` consecutive decode steps of the same sequences (contexts context, context + 1, ...)."""
    per_seq = -(-(context + rotations - 1) // block_size)
    blocks = random.sample(range(num_blocks), batch * per_seq)
    tables = [blocks[i * per_seq : (i + 1) * per_seq] for i in range(batch)]
    tokens = [random.randrange(10000) for _ in range(batch)]
    return [
        StepInput(
            False,
            tokens,
            [1] * batch,
            [context + r] * batch,
            tables,
            list(range(batch)),
            temperatures=[0.6] * batch,
            top_k=[-1] * batch,
            top_p=[1.0] * batch,
            min_p=[0.0] * batch,
            seeds=[None] * batch,
        )
        for r in range(rotations)
    ]


def fill_random(cache: torch.Tensor) -> None:
    """Standard-normal values, one layer at a time (fp8 has no normal_, and a whole bf16 copy of
    the cache would not fit)."""
    for layer in cache:
        layer.copy_(torch.randn(layer.shape, dtype=torch.bfloat16, device=layer.device))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bandwidth", type=float, default=4.2e12, help="measured copy bandwidth, B/s")
    parser.add_argument("--block-size", type=int, default=256)
    parser.add_argument("--attention-backend", default="auto", help="auto, triton, flash_attn or torch")
    parser.add_argument("--gemm-backend", default="auto", help="auto, torch or triton")
    parser.add_argument("--kv-cache-dtype", default="auto", help="auto or fp8_e4m3")
    parser.add_argument("--pdl", default="auto", help="PDL: auto, on or off")
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)))
    parser.add_argument("--contexts", default=",".join(map(str, CONTEXTS)))
    parser.add_argument("--out", default=None)
    parser.add_argument("--profile", action="store_true", help="print the kernels of one step instead")
    args = parser.parse_args()
    arch = yaml.safe_load(open("conf/model/qwen3_0_6b.yaml"))["arch"]
    llm = LLM(
        "Qwen/Qwen3-0.6B",
        hf_config=arch,
        load_format="dummy",
        dtype="bfloat16",
        kv_block_size=args.block_size,
        max_model_len=4096 + 16,
        max_num_seqs=256,
        attention_backend=args.attention_backend,
        gemm_backend=args.gemm_backend,
        kv_cache_dtype=args.kv_cache_dtype,
        pdl=args.pdl,
    )
    runner = llm.engine.executor.runner
    fill_random(runner.kv_cache)  # never time on zeros
    weights = llm.stats()["weights_bytes"]
    # K and V of one token in every layer, at the cache's own element size (fp8: 1 byte)
    cache = runner.kv_cache
    per_token_kv = cache[0, 0, 0, 0].numel() * 2 * cache.shape[0] * cache.element_size()
    if args.profile:
        return profile(runner, arch, args.block_size)
    lines = [
        "| batch | context | forward ms | LM head ms | sampler ms | step ms | back to back ms | "
        "floor ms | step / floor | back to back / floor |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for batch in map(int, args.batches.split(",")):
        for context in map(int, args.contexts.split(",")):
            if batch * -(-(context + ROTATIONS - 1) // args.block_size) > runner.num_blocks:
                continue
            steps = decode_steps(batch, context, args.block_size, runner.num_blocks, ROTATIONS)
            rotation = itertools.cycle(steps)
            sampling = prepare_step(steps[0], args.block_size, arch["vocab_size"], runner.device)[1]
            hidden = replay(runner, next(rotation))
            logits = runner.model.compute_logits(hidden)
            fwd = time_ms(lambda rotation=rotation: replay(runner, next(rotation)))
            head = time_ms(lambda hidden=hidden: runner.model.compute_logits(hidden))
            samp = time_ms(lambda logits=logits, sampling=sampling: runner.sampler(logits, sampling))
            whole = time_ms(lambda rot=rotation, sampling=sampling: whole_step(runner, rot, sampling))
            floor = (weights + batch * context * per_token_kv) / args.bandwidth * 1e3
            total = fwd + head + samp
            lines.append(
                f"| {batch} | {context} | {fwd:.3f} | {head:.3f} | {samp:.3f} | {total:.3f} | "
                f"{whole:.3f} | {floor:.3f} | {total / floor:.2f} | {whole / floor:.2f} |"
            )
            print(lines[-1], flush=True)
    llm.close()
    table = "\n".join(lines)
    print(table)
    if args.out:
        atomic_files.write_atomically(args.out, table + "\n")


def replay(runner, step) -> torch.Tensor:
    """The step's inputs uploaded into its decode graph's buffers, and the graph replayed."""
    return runner.graphs.replay(
        runner.graphs.prepare(step, runner.block_size, runner.hf_config.vocab_size)[0]
    )


def whole_step(runner, rotation, sampling) -> torch.Tensor:
    """Forward, LM head and sampler enqueued back to back, as the engine's decode step runs them:
    the eager launches of the head and sampler overlap the graph instead of being timed alone."""
    return runner.sampler(runner.model.compute_logits(replay(runner, next(rotation))), sampling)


def profile(runner, arch: dict, block_size: int) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    for batch, context in ((1, 1024), (128, 1024)):
        (step,) = decode_steps(batch, context, block_size, runner.num_blocks)
        sampling = prepare_step(step, block_size, arch["vocab_size"], runner.device)[1]
        for _ in range(3):
            replay(runner, step)
        torch.cuda.synchronize()
        with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            hidden = replay(runner, step)
            logits = runner.model.compute_logits(hidden)
            runner.sampler(logits, sampling)
            torch.cuda.synchronize()
        print(f"--- batch {batch} context {context}")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=60))


if __name__ == "__main__":
    main()
