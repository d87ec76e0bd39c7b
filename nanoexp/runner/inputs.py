"""StepInput (plain lists) -> device tensors for one forward pass."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nanoexp.kernels.base import AttentionMetadata
from nanoexp.layers.sampler import SamplingTensors
from nanoexp.runner.step_input import StepInput


@dataclass
class ModelInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    md: AttentionMetadata
    logits_indices: torch.Tensor  # rows of the hidden states whose logits are needed


def to_device(data: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    tensor = torch.tensor(data, dtype=dtype)
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor


def pad_tables(tables: list[list[int]], width: int | None = None) -> list[list[int]]:
    width = width or max((len(t) for t in tables), default=0)
    return [t + [0] * (width - len(t)) for t in tables]


def prepare_inputs(step: StepInput, block_size: int, device: torch.device) -> ModelInputs:
    positions, slots = [], []
    for n, ctx, table in zip(step.query_lens, step.context_lens, step.block_tables):
        positions.extend(range(ctx - n, ctx))
        if not table:  # no cache blocks (memory-profiling run): store nothing
            slots.extend([-1] * n)
            continue
        for pos in range(ctx - n, ctx):
            slots.append(table[pos // block_size] * block_size + pos % block_size)
    cu_q, cu_k = [0], [0]
    for n, ctx in zip(step.query_lens, step.context_lens):
        cu_q.append(cu_q[-1] + n)
        cu_k.append(cu_k[-1] + ctx)
    md = AttentionMetadata(
        is_prefill=step.is_prefill,
        slot_mapping=to_device(slots, torch.int64, device),
        context_lens=to_device(step.context_lens, torch.int32, device),
        block_tables=to_device(pad_tables(step.block_tables), torch.int32, device),
        cu_seqlens_q=to_device(cu_q, torch.int32, device),
        cu_seqlens_k=to_device(cu_k, torch.int32, device),
        max_seqlen_q=max(step.query_lens),
        max_seqlen_k=max(step.context_lens),
        has_cached_prefix=step.is_prefill and step.query_lens != step.context_lens,
    )
    last_rows = [cu_q[i + 1] - 1 for i in step.sample_seq_indices]
    return ModelInputs(
        input_ids=to_device(step.token_ids, torch.int64, device),
        positions=to_device(positions, torch.int64, device),
        md=md,
        logits_indices=to_device(last_rows, torch.int64, device),
    )


def prepare_sampling(step: StepInput, vocab_size: int, device: torch.device) -> SamplingTensors:
    rows = step.sampling
    return SamplingTensors(
        temperatures=to_device([r.temperature for r in rows], torch.float32, device),
        top_k=to_device([r.top_k if r.top_k > 0 else vocab_size for r in rows], torch.int64, device),
        top_p=to_device([r.top_p for r in rows], torch.float32, device),
        min_p=to_device([r.min_p for r in rows], torch.float32, device),
        seeds=[r.seed for r in rows],
        all_greedy=all(r.temperature == 0 for r in rows),
        needs_filter=any(r.top_k > 0 or r.top_p < 1 or r.min_p > 0 for r in rows),
    )
