"""Host time to turn one step's plain-data description into tensors (CPU, no model).

    python experiments/nanovllm_bench/input_prep.py [--base REV] [--rounds 3]

A prefill step of 30 prompts of 100..1024 tokens (~18k tokens) and a decode step of 256 sequences
with contexts of 100..2000 tokens, block size 256; mean of 50 calls after 3 warm-ups.

With --base, decode steps of 1, 8, 64 and 256 sequences (temperature 0.6, unseeded, no filters, as
the benchmark's) are prepared the way the runner does: that commit's inputs.py (its prepare_inputs
and prepare_sampling, loaded from git) against this tree's prepare_step, alternated in one process
for --rounds rounds, mean of 2,000 calls each.
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from nanoexp.runner import inputs
from nanoexp.runner.inputs import prepare_inputs
from nanoexp.runner.step_input import StepInput

BLOCK = 256
VOCAB = 151_936
CPU = torch.device("cpu")


def make_step(prefill: bool, rng: random.Random) -> StepInput:
    if prefill:
        context = [rng.randint(100, 1024) for _ in range(30)]
        query = context
    else:
        context = [rng.randint(100, 2000) for _ in range(256)]
        query = [1] * len(context)
    tables = [rng.sample(range(5000), -(-c // BLOCK)) for c in context]
    return StepInput(prefill, [1] * sum(query), query, context, tables, list(range(len(query))))


def sampled_decode_step(batch: int, rng: random.Random) -> StepInput:
    context = [rng.randint(100, 2000) for _ in range(batch)]
    tables = [rng.sample(range(5000), -(-c // BLOCK)) for c in context]
    rows = list(range(batch))
    return StepInput(False, [1] * batch, [1] * batch, context, tables, rows, temperatures=[0.6] * batch,
                     top_k=[-1] * batch, top_p=[1.0] * batch, min_p=[0.0] * batch, seeds=[None] * batch,
                     prev_sample_rows=rows)  # fmt: skip


def mean_us(call, calls: int = 2000) -> float:
    for _ in range(100):
        call()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - start) / calls * 1e6


def base_module(rev: str):
    """`rev`'s nanoexp/runner/inputs.py as a module of its own."""
    show = ["git", "show", f"{rev}:nanoexp/runner/inputs.py"]
    source = subprocess.run(show, capture_output=True, text=True, check=True).stdout
    path = Path(tempfile.mkdtemp()) / "base_inputs.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("base_inputs", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["base_inputs"] = module
    spec.loader.exec_module(module)
    return module


def compare(rev: str, rounds: int) -> None:
    base = base_module(rev)
    rng = random.Random(0)
    print(f"| decode sequences | round | {rev}: prepare_inputs + _sampling us | this tree: prepare_step us |")
    print("|---:|---:|---:|---:|")
    for batch in (1, 8, 64, 256):
        step = sampled_decode_step(batch, rng)

        def before(s=step):
            return base.prepare_inputs(s, BLOCK, CPU), base.prepare_sampling(s, VOCAB, CPU)

        for i in range(rounds):
            old = mean_us(before)
            new = mean_us(lambda s=step: inputs.prepare_step(s, BLOCK, VOCAB, CPU))
            print(f"| {batch} | {i + 1} | {old:.0f} | {new:.0f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", default=None, help="a commit to compare the decode preparation with")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.base:
        return compare(args.base, args.rounds)
    rng = random.Random(0)
    for prefill in (True, False):
        step = make_step(prefill, rng)
        for _ in range(3):
            prepare_inputs(step, BLOCK, CPU)
        start, calls = time.perf_counter(), 50
        for _ in range(calls):
            prepare_inputs(step, BLOCK, CPU)
        ms = (time.perf_counter() - start) / calls * 1e3
        print(f"{'prefill' if prefill else 'decode'}: {step.num_tokens} tokens, {ms:.2f} ms")


if __name__ == "__main__":
    main()
