"""Scheduler output -> the runner's plain-data StepInput, sampling settings as columns."""

from __future__ import annotations

from nanoexp.engine.scheduler import ScheduledBatch
from nanoexp.engine.sequence import PLACEHOLDER
from nanoexp.runner.step_input import StepInput


def step_input_from(batch: ScheduledBatch, prev_rows: dict[int, int] | None = None) -> StepInput:
    """The step's plain-data description. A placeholder input token (a sample not read yet) is taken on
    the device from row prev_rows[seq_id] of the previous step's samples."""
    num_decodes = batch.num_decodes if batch.is_prefill else 0
    step = StepInput(batch.is_prefill, [], [], [], [], [], num_decodes=num_decodes)
    from_prev: list[int] = []
    for i, (seq, n) in enumerate(zip(batch.seqs, batch.num_new_tokens)):
        start, end = seq.num_computed_tokens, seq.num_computed_tokens + n
        tokens = seq.token_ids[start:end]
        from_prev += [-1] * (n - 1)
        from_prev.append(prev_rows[seq.seq_id] if tokens[-1] == PLACEHOLDER else -1)
        step.token_ids.extend(tokens[:-1] + [max(tokens[-1], 0)])
        step.query_lens.append(n)
        step.context_lens.append(end)
        step.block_tables.append(seq.block_table)
        if end == len(seq):
            params = seq.params
            step.sample_seq_indices.append(i)
            step.temperatures.append(params.temperature)
            step.top_k.append(params.top_k)
            step.top_p.append(params.top_p)
            step.min_p.append(params.min_p)
            # the seed mixed with the output position: each position draws differently yet reproducibly
            seed = params.seed
            step.seeds.append(None if seed is None else (seed * 1_000_003 + seq.num_output_tokens) % 2**63)
    step.prev_sample_rows = from_prev if any(r >= 0 for r in from_prev) else None
    return step
