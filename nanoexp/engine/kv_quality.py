"""The KV-cache quality probe: what the cache's storage costs in accuracy. Each prompt is continued
greedily for `num_tokens` decode steps that read the paged cache; each position's next-token distribution
is scored against one plain prefill of prompt + continuation over fresh K/V in the model dtype. `measure`
packs the prompts into groups that fit one step and the cache; `probe_group` runs them on every rank."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from nanoexp.config import SamplingParams
from nanoexp.engine.sequence import Sequence
from nanoexp.runner.inputs import prepare_inputs
from nanoexp.runner.step_input import StepInput, blockless_prefill

# Reference log-probs a group holds at once: rows x vocab float32 (512 x 152k ~ 0.3 GB), twice
MAX_REFERENCE_ROWS = 512


@dataclass
class ProbeResult:
    """Per request, per continuation position: KL(reference || decode) and whether the argmax agrees."""

    kl: list[list[float]]
    agree: list[list[bool]]


def measure(engine, prompt_token_ids: list[list[int]], num_tokens: int) -> dict:
    """LLMEngine.kv_cache_quality: greedy_agreement, kl_mean, kl_p99, kl_max, num_positions, num_requests.
    The prefix cache is emptied before and after; every block is returned."""
    engine.check_open()
    if engine.has_unfinished():
        raise RuntimeError("kv_cache_quality needs an idle engine: requests are still running")
    if type(num_tokens) is not int or num_tokens < 1:
        raise ValueError(f"kv_cache_quality: num_tokens={num_tokens!r} is invalid: must be an int >= 1")
    prompts = [check_prompt(engine, i, p, num_tokens) for i, p in enumerate(prompt_token_ids)]
    if not prompts:
        raise ValueError("kv_cache_quality: no prompts given")
    scheduler, manager = engine.config.scheduler, engine.block_manager
    max_seqs = max_group_seqs(scheduler.max_num_seqs, num_tokens)
    lengths, budget = [len(p) for p in prompts], scheduler.max_num_batched_tokens
    groups = probe_groups(lengths, num_tokens, budget, max_seqs, manager.block_size, manager.num_blocks)
    manager.reset_prefix_cache()
    try:
        results = [run_group(engine, [prompts[i] for i in group], num_tokens) for group in groups]
    finally:
        manager.reset_prefix_cache()
    return summarize(results)


def check_prompt(engine, index: int, prompt, num_tokens: int) -> list[int]:
    name = f"kv_cache_quality prompt {index}"
    prompt = engine.check_request(name, prompt, SamplingParams(max_tokens=num_tokens))
    budget = engine.config.scheduler.max_num_batched_tokens
    if len(prompt) + num_tokens > budget:  # its reference is one prefill of the whole sequence
        raise ValueError(f"{name}: prompt ({len(prompt)} tokens) + num_tokens ({num_tokens}) exceeds "
                         f"max_num_batched_tokens={budget}: the reference is one prefill of both")
    return prompt


def max_group_seqs(max_num_seqs: int, num_tokens: int) -> int:
    return max(1, min(max_num_seqs, MAX_REFERENCE_ROWS // num_tokens))


def probe_groups(lengths: list[int], num_tokens: int, budget: int, max_seqs: int, block_size: int,
                 num_blocks: int) -> list[list[int]]:  # fmt: skip
    """Request indices in order, packed so each group's prefill of prompt + continuation fits
    `budget` tokens, `max_seqs` sequences and the cache's blocks (each request fits alone, checked)."""
    groups: list[list[int]] = []
    tokens = blocks = 0
    for i, n in enumerate(lengths):
        need = -(-(n + num_tokens - 1) // block_size)
        full = tokens + n + num_tokens > budget or blocks + need > num_blocks
        if not groups or full or len(groups[-1]) >= max_seqs:
            groups.append([])
            tokens = blocks = 0
        groups[-1].append(i)
        tokens, blocks = tokens + n + num_tokens, blocks + need
    return groups


def run_group(engine, prompts: list[list[int]], num_tokens: int) -> ProbeResult:
    """Probes requests that fit one step, on blocks taken from the block manager."""
    manager = engine.block_manager
    seqs = [Sequence(-1 - i, p, SamplingParams()) for i, p in enumerate(prompts)]
    try:
        for seq in seqs:
            if not manager.grow(seq, len(seq) + num_tokens - 1):
                raise RuntimeError("kv_cache_quality: the KV cache has no room for one step's requests")
        tables = [seq.block_table for seq in seqs]
        return engine.executor.call(probe_group, prompts, num_tokens, tables)
    finally:
        for seq in seqs:
            manager.free_seq(seq)


def summarize(results: list[ProbeResult]) -> dict:
    """Over every position: argmax agreement with the reference, and KL(reference || decode) in nats."""
    kl = np.array([x for r in results for row in r.kl for x in row], dtype=np.float64)
    agree = np.array([x for r in results for row in r.agree for x in row], dtype=bool)
    return {
        "greedy_agreement": float(agree.mean()),
        "kl_mean": float(kl.mean()),
        "kl_p99": float(np.percentile(kl, 99)),
        "kl_max": float(kl.max()),
        "num_positions": int(kl.size),
        "num_requests": sum(len(r.kl) for r in results),
    }


# ---------------------------------------------------------------- on every rank


@torch.inference_mode()
def probe_group(runner, prompts: list[list[int]], num_tokens: int,
                block_tables: list[list[int]]) -> ProbeResult | None:  # fmt: skip
    """Greedy decode steps reading the cache (blocks for prompt + num_tokens - 1 tokens each), then one
    plain prefill of prompt + continuation as the reference. Rank 0's result, None elsewhere."""
    fill_cache(runner, prompts, block_tables)
    n = len(prompts)
    continuations: list[list[int]] = [[] for _ in prompts]
    decoded = []
    for t in range(num_tokens):  # the decode step feeding continuation token t - 1 (or the prompt's last)
        inputs = [p[-1] if t == 0 else c[t - 1] for p, c in zip(prompts, continuations)]
        step = StepInput(False, inputs, [1] * n, [len(p) + t for p in prompts], block_tables, list(range(n)))
        decoded.append(log_probs_of(runner, step))
        greedy = decoded[-1].argmax(-1) if decoded[-1] is not None else None
        if runner.config.parallel.tensor_parallel_size > 1:  # rank 0's, so every rank feeds the same inputs
            greedy = runner.share_sampled(greedy, n)
        for c, token in zip(continuations, greedy.tolist()):
            c.append(token)
    reference = reference_log_probs(runner, prompts, continuations)
    if runner.rank != 0:
        return None
    kl = [kl_divergence(reference[:, t], d) for t, d in enumerate(decoded)]
    agree = [reference[:, t].argmax(-1) == d.argmax(-1) for t, d in enumerate(decoded)]
    return ProbeResult(torch.stack(kl, 1).tolist(), torch.stack(agree, 1).tolist())


def log_probs_of(runner, step: StepInput, rows: list[int] | None = None) -> torch.Tensor | None:
    """The step's float32 log-probs at `rows` (default: each sequence's last token); None off rank 0."""
    inputs = prepare_inputs(step, runner.block_size, runner.device)
    if rows is not None:
        inputs.logits_indices = torch.tensor(rows, dtype=torch.int64, device=runner.device)
    logits = runner.forward_logits(step, inputs)
    return None if logits is None else logits.float().log_softmax(-1)


def reference_log_probs(runner, prompts, continuations) -> torch.Tensor | None:
    """[requests, positions, vocab] log-probs of ONE plain prefill predicting each continuation token."""
    rows, start = [], 0
    for p, c in zip(prompts, continuations):
        rows += range(start + len(p) - 1, start + len(p) - 1 + len(c))
        start += len(p) + len(c)
    log_probs = log_probs_of(runner, blockless_prefill([p + c for p, c in zip(prompts, continuations)]), rows)
    return None if log_probs is None else log_probs.view(len(prompts), len(continuations[0]), -1)


def fill_cache(runner, prompts, block_tables) -> None:
    """Prefills all but each prompt's last token, so every probed position is computed by a decode step."""
    ready = [i for i, p in enumerate(prompts) if len(p) > 1]
    if not ready:
        return
    lens = [len(prompts[i]) - 1 for i in ready]
    step = StepInput(True, [t for i in ready for t in prompts[i][:-1]], lens, lens,
                     [block_tables[i] for i in ready], [])  # fmt: skip
    runner.forward_logits(step, prepare_inputs(step, runner.block_size, runner.device))


def kl_divergence(reference: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """KL(reference || other) per row from log-probs in float64, floored at 0 (rounding can go negative)."""
    reference, other = reference.double(), other.double()
    return (reference.exp() * (reference - other)).sum(-1).clamp_min(0.0)
