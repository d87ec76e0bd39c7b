"""Comparing two engines' next-token distributions on the same sequences, e.g. fp8 weights against the
bf16 model they were quantized from: one engine continues each prompt greedily (decode steps reading its
paged cache, as the KV-cache probe does) and records its log-probs; the other scores the same prompt +
continuation in one plain prefill; `compare` scores them as the KV-cache probe does."""

from __future__ import annotations

import math

import numpy as np
import torch

from nanoexp.config import SamplingParams
from nanoexp.engine import kv_quality


def greedy_log_probs(
    engine, prompt_token_ids: list[list[int]], num_tokens: int
) -> tuple[list[list[int]], np.ndarray]:
    """Each prompt's greedy continuation of `num_tokens` and the log-probs that chose it, float32
    [requests, num_tokens, vocab]; on an idle engine, every block returned."""
    results = kv_quality.run_groups(engine, prompt_token_ids, num_tokens, "greedy_log_probs", decode_group)
    continuations = [c for group, _ in results for c in group]
    return continuations, np.concatenate([log_probs for _, log_probs in results])


def prefill_log_probs(
    engine, prompt_token_ids: list[list[int]], continuations: list[list[int]]
) -> np.ndarray:
    """Log-probs [requests, positions, vocab] predicting each continuation token, from one plain prefill
    of prompt + continuation per group of requests (no KV cache is read or written)."""
    engine.check_open()
    if engine.has_unfinished():
        raise RuntimeError("prefill_log_probs needs an idle engine: requests are still running")
    lengths = {len(c) for c in continuations}
    if len(continuations) != len(prompt_token_ids) or len(lengths) != 1 or 0 in lengths:
        raise ValueError("prefill_log_probs: one non-empty continuation per prompt, all of one length")
    num_tokens, budget = lengths.pop(), engine.config.scheduler.max_num_batched_tokens
    prompts = []
    for i, (p, c) in enumerate(zip(prompt_token_ids, continuations, strict=True)):
        label = f"prefill_log_probs prompt {i}"
        whole = engine.check_request(label, [*p, *c], SamplingParams(max_tokens=1))
        if len(whole) > budget:
            raise ValueError(
                f"{label}: prompt + continuation ({len(whole)} tokens) exceeds "
                f"max_num_batched_tokens={budget}"
            )
        prompts.append(whole[: len(whole) - num_tokens])
    sizes = [len(p) for p in prompts]
    groups = kv_quality.probe_groups(
        sizes, num_tokens, budget, engine.config.scheduler.max_num_seqs, 1, math.inf
    )
    out = []
    for group in groups:
        args = ([prompts[i] for i in group], [continuations[i] for i in group])
        out.append(engine.executor.call(prefill_group, *args))
    return np.concatenate(out)


def compare(reference: np.ndarray, other: np.ndarray) -> dict:
    """kv_quality.scores of `other` against `reference` (both [requests, positions, vocab] log-probs)."""
    ref, oth = torch.from_numpy(reference), torch.from_numpy(other)
    kl = kv_quality.kl_divergence(ref, oth).numpy()
    agree = (ref.argmax(-1) == oth.argmax(-1)).numpy()
    return kv_quality.scores(kl, agree)


# ---------------------------------------------------------------- on every rank


@torch.inference_mode()
def decode_group(runner, prompts, num_tokens: int, block_tables) -> tuple[list[list[int]], np.ndarray] | None:
    continuations, decoded = kv_quality.greedy_decode(runner, prompts, num_tokens, block_tables)
    if runner.rank != 0:
        return None
    return continuations, torch.stack(decoded, 1).cpu().numpy()


@torch.inference_mode()
def prefill_group(runner, prompts, continuations) -> np.ndarray | None:
    log_probs = kv_quality.reference_log_probs(runner, prompts, continuations)
    return None if log_probs is None else log_probs.cpu().numpy()
