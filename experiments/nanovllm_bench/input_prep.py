"""Host time to turn one step's plain-data description into tensors (CPU, no model).

    python experiments/nanovllm_bench/input_prep.py

A prefill step of 30 prompts of 100..1024 tokens (~18k tokens) and a decode step of 256 sequences
with contexts of 100..2000 tokens, block size 256; mean of 50 calls after 3 warm-ups.
"""

from __future__ import annotations

import random
import time

import torch

from nanoexp.runner.inputs import prepare_inputs
from nanoexp.runner.step_input import StepInput

BLOCK = 256


def make_step(prefill: bool, rng: random.Random) -> StepInput:
    if prefill:
        context = [rng.randint(100, 1024) for _ in range(30)]
        query = context
    else:
        context = [rng.randint(100, 2000) for _ in range(256)]
        query = [1] * len(context)
    tables = [rng.sample(range(5000), -(-c // BLOCK)) for c in context]
    return StepInput(prefill, [1] * sum(query), query, context, tables, list(range(len(query))))


def main() -> None:
    rng = random.Random(0)
    for prefill in (True, False):
        step = make_step(prefill, rng)
        for _ in range(3):
            prepare_inputs(step, BLOCK, torch.device("cpu"))
        start, calls = time.perf_counter(), 50
        for _ in range(calls):
            prepare_inputs(step, BLOCK, torch.device("cpu"))
        ms = (time.perf_counter() - start) / calls * 1e3
        print(f"{'prefill' if prefill else 'decode'}: {step.num_tokens} tokens, {ms:.2f} ms")


if __name__ == "__main__":
    main()
