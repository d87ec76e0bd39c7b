"""Test-only views into the engine, computed through its public pieces."""

from __future__ import annotations

import torch

from nanoexp.runner.inputs import prepare_inputs
from nanoexp.runner.step_input import StepInput


@torch.inference_mode()
def runner_prefill_logits(runner, step: StepInput) -> torch.Tensor | None:
    """Logits of every new token of a prefill step on one rank (None on ranks other than 0)."""
    inputs = prepare_inputs(step, runner.block_size, runner.device)
    hidden = runner.model(inputs.input_ids, inputs.positions, inputs.md)
    return runner.model.compute_logits(hidden)


def prefill_logits(llm, step: StepInput) -> torch.Tensor:
    """The step's logits from rank 0, with every rank taking part (the LM head gathers)."""
    return llm.engine.executor.call(runner_prefill_logits, step)
