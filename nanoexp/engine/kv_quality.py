"""The KV-cache quality probe: what the cache's storage costs in accuracy. Each prompt is continued
greedily for `num_tokens` decode steps that read the paged cache; each position's next-token distribution
is scored against one plain prefill of prompt + continuation over fresh K/V in the model dtype. `measure`
packs the prompts into groups that fit one step and the cache; `probe_group` runs them on every rank."""

from __future__ import annotations

import numpy as np
import torch

from nanoexp.config import SamplingParams
from nanoexp.engine.sequence import Sequence
from nanoexp.runner.inputs import prepare_inputs
from nanoexp.runner.step_input import StepInput, blockless_prefill

# Reference log-probs a group holds at once: rows x vocab float32 (512 x 152k ~ 0.3 GB), twice
MAX_REFERENCE_ROWS = 512


def measure(engine, prompt_token_ids: list[list[int]], num_tokens: int) -> dict:
    """LLM.kv_cache_quality: greedy_agreement, kl_mean, kl_p99, kl_max, num_positions, num_requests.
    The prefix cache is emptied before and after; every block is returned."""
    results = run_groups(engine, prompt_token_ids, num_tokens, "kv_cache_quality", probe_group)
    return scores(np.concatenate([kl for kl, _ in results]), np.concatenate([agree for _, agree in results]))


def scores(kl: np.ndarray, agree: np.ndarray) -> dict:
    """Over every position [requests, positions]: argmax agreement with the reference and KL(reference ||
    probed) in nats."""
    return {
        "greedy_agreement": float(agree.mean()),
        "kl_mean": float(kl.mean()),
        "kl_p99": float(np.percentile(kl, 99)),
        "kl_max": float(kl.max()),
        "num_positions": int(kl.size),
        "num_requests": int(kl.shape[0]),
    }


def run_groups(engine, prompt_token_ids: list[list[int]], num_tokens: int, name: str, on_ranks) -> list:
    """`on_ranks(runner, prompts, num_tokens, block_tables)` for each group of the checked prompts, on an
    idle engine whose prefix cache is emptied before and after; rank 0's results in order."""
    engine.check_open()
    if engine.has_unfinished():
        raise RuntimeError(f"{name} needs an idle engine: requests are still running")
    if type(num_tokens) is not int or num_tokens < 1:
        raise ValueError(f"{name}: num_tokens={num_tokens!r} is invalid: must be an int >= 1")
    if not prompt_token_ids:
        raise ValueError(f"{name}: no prompts given")
    scheduler, manager = engine.config.scheduler, engine.block_manager
    budget, prompts = scheduler.max_num_batched_tokens, []
    for i, tokens in enumerate(prompt_token_ids):
        label = f"{name} prompt {i}"
        prompt = engine.check_request(label, tokens, SamplingParams(max_tokens=num_tokens))
        if len(prompt) + num_tokens > budget:  # its reference is one prefill of the whole sequence
            raise ValueError(
                f"{label}: prompt ({len(prompt)} tokens) + num_tokens ({num_tokens}) exceeds "
                f"max_num_batched_tokens={budget}: the reference is one prefill of both"
            )
        prompts.append(prompt)
    groups = probe_groups(
        [len(p) for p in prompts],
        num_tokens,
        budget,
        scheduler.max_num_seqs,
        manager.block_size,
        manager.num_blocks,
    )
    manager.reset_prefix_cache()
    try:
        return [run_group(engine, [prompts[i] for i in group], num_tokens, on_ranks) for group in groups]
    finally:
        manager.reset_prefix_cache()


def probe_groups(
    lengths: list[int], num_tokens: int, budget: int, max_num_seqs: int, block_size: int, num_blocks: float
) -> list[list[int]]:
    """Request indices in order, packed so each group's prefill of prompt + continuation fits `budget`
    tokens, `max_num_seqs` sequences, MAX_REFERENCE_ROWS reference rows and the cache's blocks (each
    request fits alone, checked)."""
    max_seqs = max(1, min(max_num_seqs, MAX_REFERENCE_ROWS // num_tokens))
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


def run_group(engine, prompts: list[list[int]], num_tokens: int, on_ranks=None):
    """Probes requests that fit one step (`on_ranks`, default probe_group), on blocks taken from the
    block manager."""
    manager = engine.block_manager
    seqs = [Sequence(-1 - i, p, SamplingParams()) for i, p in enumerate(prompts)]
    try:
        for seq in seqs:  # room for all: the engine is idle and probe_groups fit the group to the cache
            manager.grow(seq, len(seq) + num_tokens - 1)
        tables = [seq.block_table for seq in seqs]
        return engine.executor.call(on_ranks or probe_group, prompts, num_tokens, tables)
    finally:
        for seq in seqs:
            manager.free_seq(seq)


# ---------------------------------------------------------------- on every rank


@torch.inference_mode()
def probe_group(
    runner, prompts: list[list[int]], num_tokens: int, block_tables: list[list[int]]
) -> tuple[np.ndarray, np.ndarray] | None:
    """Greedy decode steps reading the cache (blocks for prompt + num_tokens - 1 tokens each), then one
    plain prefill of prompt + continuation as the reference. Rank 0's [requests, positions] KL(reference ||
    decode) and argmax agreement, None elsewhere."""
    continuations, decoded = greedy_decode(runner, prompts, num_tokens, block_tables)
    reference = reference_log_probs(runner, prompts, continuations)
    if runner.rank != 0:
        return None
    assert reference is not None  # rank 0 has the logits, every step's
    kl = [kl_divergence(reference[:, t], d) for t, d in enumerate(decoded)]
    agree = [reference[:, t].argmax(-1) == d.argmax(-1) for t, d in enumerate(decoded)]
    return torch.stack(kl, 1).cpu().numpy(), torch.stack(agree, 1).cpu().numpy()


def greedy_decode(runner, prompts, num_tokens: int, block_tables) -> tuple[list[list[int]], list]:
    """Each prompt's greedy continuation, one decode step reading the cache per token, and those steps'
    log-probs ([requests, vocab] per step on rank 0, None elsewhere)."""
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
        assert greedy is not None  # rank 0 decoded; the others received its tokens
        for c, token in zip(continuations, greedy.tolist()):
            c.append(token)
    return continuations, decoded


def log_probs_of(runner, step: StepInput, rows: list[int] | None = None) -> torch.Tensor | None:
    """The step's float32 log-probs at `rows` (default: each sequence's last token); None off rank 0."""
    inputs = prepare_inputs(step, runner.block_size, runner.device)
    if rows is not None:
        inputs.logits_indices = torch.tensor(rows, dtype=torch.int64, device=runner.device)
    logits = runner.forward_logits(step, inputs)
    return None if logits is None else logits.float().log_softmax(-1)


def reference_log_probs(runner, prompts, continuations) -> torch.Tensor | None:
    """[requests, positions, vocab] log-probs of ONE plain prefill predicting each continuation token."""
    rows: list[int] = []
    start = 0
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
    step = StepInput(
        True, [t for i in ready for t in prompts[i][:-1]], lens, lens, [block_tables[i] for i in ready], []
    )
    runner.forward_logits(step, prepare_inputs(step, runner.block_size, runner.device))


def kl_divergence(reference: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """KL(reference || other) per row from log-probs in float64, floored at 0 (rounding can go negative)."""
    reference, other = reference.double(), other.double()
    return (reference.exp() * (reference - other)).sum(-1).clamp_min(0.0)
