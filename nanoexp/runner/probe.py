"""The KV-cache quality probe on one rank: next-token distributions read through the paged cache
(decode, one token per step) against one plain prefill over the fresh K/V in the model dtype
(what an `auto` cache holds, exactly), at the same positions of the same token sequences.

Every rank runs the same forward passes (tensor parallelism needs all of them); rank 0 holds the
full logits, reduces them on the device and returns per-position numbers, the others None.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nanoexp.runner.inputs import prepare_inputs
from nanoexp.runner.step_input import StepInput, blockless_prefill


@dataclass
class ProbeResult:
    """Per request, per continuation position: KL(reference || decode) and whether the argmax agrees."""

    continuations: list[list[int]]  # the decode path's greedy continuation, scored by both paths
    kl: list[list[float]]
    agree: list[list[bool]]


@torch.inference_mode()
def probe_kv_cache(
    runner, prompts: list[list[int]], num_tokens: int, block_tables: list[list[int]]
) -> ProbeResult | None:
    """Probes one group of requests whose blocks (room for prompt + num_tokens - 1 tokens each)
    the engine allocated; every pass fits one step's token budget.

    The decode path generates each continuation greedily, one step at a time, reading the cache;
    then one plain prefill of prompt + continuation gives the reference at the same positions. So
    a position counts as agreeing when the reference would have picked the same next token."""
    fill_cache(runner, prompts, block_tables)
    continuations: list[list[int]] = [[] for _ in prompts]
    decoded = []
    for t in range(num_tokens):
        log_probs = decode_log_probs(runner, prompts, continuations, block_tables, t)
        for c, token in zip(continuations, greedy_tokens(runner, log_probs, len(prompts))):
            c.append(token)
        decoded.append(log_probs)
    reference = reference_log_probs(runner, prompts, continuations)
    if runner.rank != 0:
        return None
    kl = [kl_divergence(reference[:, t], d) for t, d in enumerate(decoded)]
    agree = [reference[:, t].argmax(-1) == d.argmax(-1) for t, d in enumerate(decoded)]
    return ProbeResult(continuations, torch.stack(kl, 1).tolist(), torch.stack(agree, 1).tolist())


def greedy_tokens(runner, log_probs: torch.Tensor | None, count: int) -> list[int]:
    """Rank 0's argmax per row, shared so every rank feeds the same next inputs."""
    tokens = log_probs.argmax(-1) if log_probs is not None else None
    if runner.config.parallel.tensor_parallel_size > 1:
        tokens = runner.share_sampled(tokens, count)
    return tokens.tolist()


def logits_of(runner, step: StepInput, rows: list[int] | None = None) -> torch.Tensor | None:
    """The step's logits (float32) at `rows` of its packed tokens (default: each sequence's last
    token), through the runner's own forward path; None on ranks other than 0."""
    inputs = prepare_inputs(step, runner.block_size, runner.device)
    if rows is not None:
        inputs.logits_indices = torch.tensor(rows, dtype=torch.int64, device=runner.device)
    logits = runner.forward_logits(step, inputs)
    return None if logits is None else logits.float()


def reference_log_probs(runner, prompts, continuations) -> torch.Tensor | None:
    """[requests, positions, vocab] log-probs of ONE plain prefill of prompt + continuation, at the
    positions that predict each continuation token."""
    rows, start = [], 0
    for p, c in zip(prompts, continuations):
        rows += range(start + len(p) - 1, start + len(p) - 1 + len(c))
        start += len(p) + len(c)
    logits = logits_of(runner, blockless_prefill([p + c for p, c in zip(prompts, continuations)]), rows)
    if logits is None:
        return None
    return logits.log_softmax(-1).view(len(prompts), len(continuations[0]), -1)


def fill_cache(runner, prompts, block_tables) -> None:
    """Prefills every prompt but its last token into the cache (a prompt of one token has nothing
    to store), so that every probed position is computed by a decode step."""
    ready = [i for i, p in enumerate(prompts) if len(p) > 1]
    if not ready:
        return
    lens = [len(prompts[i]) - 1 for i in ready]
    step = StepInput(True, [t for i in ready for t in prompts[i][:-1]], lens, lens,
                     [block_tables[i] for i in ready], [])
    runner.forward_logits(step, prepare_inputs(step, runner.block_size, runner.device))


def decode_log_probs(runner, prompts, continuations, block_tables, t: int) -> torch.Tensor | None:
    """[requests, vocab] log-probs of the decode step that feeds token t - 1 of the continuation
    (the prompt's last token for t = 0) and reads everything before it from the cache."""
    tokens = [p[-1] if t == 0 else c[t - 1] for p, c in zip(prompts, continuations)]
    context = [len(p) + t for p in prompts]
    step = StepInput(False, tokens, [1] * len(prompts), context, block_tables, list(range(len(prompts))))
    logits = logits_of(runner, step)
    return None if logits is None else logits.log_softmax(-1)


def kl_divergence(reference: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """KL(reference || other) per row, from log-probs, summed in float64 and floored at 0 (a KL is
    never negative; rounding of two near-equal distributions can make the sum slightly so)."""
    reference, other = reference.double(), other.double()
    return (reference.exp() * (reference - other)).sum(-1).clamp_min(0.0)

