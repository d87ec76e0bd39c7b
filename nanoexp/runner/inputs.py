"""StepInput (plain lists) -> device tensors for one forward pass."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np
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
    prev_sample_rows: torch.Tensor | None = None  # step.prev_sample_rows on the device
    all_rows: bool = False  # every row's logits are needed (logits_indices is 0..n-1)
    graph_key: Hashable | None = None  # the captured graph whose static buffers hold these inputs


Fresh = Callable[[int], np.ndarray] | None  # draws n seeds for unseeded rows; None: torch's host generator
NUMPY_DTYPES = {torch.int64: np.int64, torch.int32: np.int32, torch.float32: np.float32}
# Packed arrays start this many bytes apart at least, so every view is as aligned as a tensor of
# its own would be for what reads it (Triton specializes kernels on 16-byte aligned pointers).
UPLOAD_ALIGN = 64


def aligned(offset: int) -> int:
    """`offset` rounded up to UPLOAD_ALIGN bytes."""
    return -(-offset // UPLOAD_ALIGN) * UPLOAD_ALIGN


def upload(columns: list[tuple[Any, torch.dtype]], device: torch.device) -> list[torch.Tensor]:
    """Each (list or array, dtype) column as a tensor on `device`, all packed into one host buffer (pinned on
    CUDA), copied once and returned as views: a step's dozen small inputs cost one copy's fixed cost, each
    view one slice viewed once per dtype (a tensor op costs the host microseconds a batch-1 decode lacks)."""
    arrays = [np.ascontiguousarray(data, dtype=NUMPY_DTYPES[dtype]) for data, dtype in columns]
    offsets, end = [], 0
    for array in arrays:
        offsets.append(end)
        end = aligned(end + array.nbytes)
    staging = torch.empty(max(end, UPLOAD_ALIGN), dtype=torch.uint8, pin_memory=device.type == "cuda")
    flat = staging.numpy()
    for array, start in zip(arrays, offsets):
        flat[start : start + array.nbytes] = array.reshape(-1).view(np.uint8)
    packed = staging if device.type == "cpu" else staging.to(device, non_blocking=True)
    typed = {dtype: packed.view(dtype) for dtype in {dtype for _, dtype in columns}}
    views = []
    for array, start, (_, dtype) in zip(arrays, offsets, columns):
        size = array.dtype.itemsize
        view = typed[dtype][start // size : (start + array.nbytes) // size]
        views.append(view if array.ndim == 1 else view.view(array.shape))
    return views


def prepare_inputs(step: StepInput, block_size: int, device: torch.device) -> ModelInputs:
    """prepare_step's ModelInputs, for a forward pass that samples nothing (a step without sampling
    parameters, as blockless_prefill builds)."""
    return prepare_step(step, block_size, 0, device)[0]


def prepare_step(
    step: StepInput,
    block_size: int,
    vocab_size: int,
    device: torch.device,
    fresh: Fresh = None,
    lossy_cache: bool = False,
) -> tuple[ModelInputs, SamplingTensors | None]:
    """The step's model inputs and (when it samples) SamplingTensors on the device, through one upload
    (an eager step; a captured one writes them into its graph's buffers, runner/graph_inputs.py)."""
    tables = np.zeros((len(step.block_tables), max(map(len, step.block_tables), default=0)), dtype=np.int32)
    for row, blocks in zip(tables, step.block_tables):
        row[: len(blocks)] = blocks
    positions, slots, last_rows = token_layout(step, block_size, tables)
    columns = [
        (step.token_ids, torch.int64),
        (positions, torch.int64),
        (last_rows, torch.int64),
        (slots, torch.int64),
        (step.context_lens, torch.int32),
        (tables, torch.int32),
    ]
    d, prefill = step.num_decodes, step.has_prefill
    # A prefill reads K/V from the cache where some sequence has a cached prefix, or always with a lossy
    # (fp8) cache: it attends to K/V as stored, as step graphs and decodes do, not unquantized.
    reads_cache = prefill and (lossy_cache or step.query_lens[d:] != step.context_lens[d:])
    if prefill:  # prefill sequences' boundaries, after a mixed step's decodes (AttentionMetadata)
        columns += [
            (np.cumsum([0, *step.query_lens[d:]]), torch.int32),
            (np.cumsum([0, *step.context_lens[d:]]), torch.int32),
        ]
    if step.prev_sample_rows is not None:
        columns.append((step.prev_sample_rows, torch.int64))
    arrays = sampling_arrays(step, vocab_size, fresh) if step.sample_seq_indices else {}
    tensors = upload(columns + [(values, SAMPLING_FIELDS[name]) for name, values in arrays.items()], device)
    input_ids, positions_t, logits_indices, slots_t, context_t, tables_t = tensors[:6]
    md = AttentionMetadata(
        has_prefill=prefill,
        slot_mapping=slots_t,
        context_lens=context_t,
        block_tables=tables_t,
        cu_seqlens_q=tensors[6] if prefill else None,
        cu_seqlens_k=tensors[7] if prefill else None,
        max_seqlen_q=max(step.query_lens[d:]) if prefill else 1,
        max_seqlen_k=max(step.context_lens[d:]),
        has_cached_prefix=reads_cache,
        num_decodes=d,
        max_decode_seqlen_k=max(step.context_lens[:d], default=0),
    )
    prev_rows = None if step.prev_sample_rows is None else tensors[len(columns) - 1]
    inputs = ModelInputs(input_ids, positions_t, md, logits_indices, prev_rows, samples_every_row(step))
    return inputs, (sampling_tensors(step, dict(zip(arrays, tensors[len(columns) :]))) if arrays else None)


# Up to this many tokens a Python loop lays a step out faster than numpy's ~20 array operations
# (~0.3 us a token against ~60 us in all on a 2-core VM): small prefills and decode batches.
PYTHON_TOKENS = 64


def token_layout(step: StepInput, block_size: int, tables: np.ndarray) -> tuple[Any, Any, Any]:
    """Each token's position and cache slot (-1: its sequence has no blocks, nothing stored) and each
    sampled sequence's last row; `tables`: the block tables, zero-padded to one width."""
    if step.num_tokens <= PYTHON_TOKENS:
        return token_layout_in_python(step, block_size)
    query_lens = np.asarray(step.query_lens, dtype=np.int64)
    cu_q = np.concatenate([[0], np.cumsum(query_lens)])
    seq_of_token = np.repeat(np.arange(len(query_lens)), query_lens)
    first = np.asarray(step.context_lens, dtype=np.int64) - query_lens
    positions = np.arange(cu_q[-1]) - cu_q[seq_of_token] + first[seq_of_token]
    last_rows = cu_q[np.asarray(step.sample_seq_indices, dtype=np.int64) + 1] - 1
    if tables.shape[1] == 0:
        return positions, np.full(len(positions), -1, dtype=np.int64), last_rows
    block_index = np.minimum(positions // block_size, tables.shape[1] - 1)
    slots = tables[seq_of_token, block_index].astype(np.int64) * block_size + positions % block_size
    has_blocks = np.fromiter((len(t) > 0 for t in step.block_tables), dtype=bool, count=len(tables))
    return positions, np.where(has_blocks[seq_of_token], slots, -1), last_rows


def token_layout_in_python(step: StepInput, block_size: int) -> tuple[list[int], list[int], list[int]]:
    """token_layout for a small step, as lists."""
    positions: list[int] = []
    slots: list[int] = []
    last_rows: list[int] = []
    for q, context, blocks in zip(step.query_lens, step.context_lens, step.block_tables):
        span = range(context - q, context)
        positions += span
        if blocks:
            slots += [blocks[p // block_size] * block_size + p % block_size for p in span]
        else:
            slots += [-1] * q
        last_rows.append(len(positions) - 1)
    return positions, slots, [last_rows[i] for i in step.sample_seq_indices]


def samples_every_row(step: StepInput) -> bool:
    """Row i samples for every row i (a decode step): the logits of every row are needed."""
    samples, num_rows = step.sample_seq_indices, step.num_tokens
    # the length test first keeps a long prefill from building the range
    return len(samples) == num_rows and samples == list(range(num_rows))


def counter_seeds(base: int, serial: int, n: int) -> np.ndarray:
    """n seeds in [0, 2^62) that depend only on (base, serial, row): every tensor-parallel rank
    computes the same ones without sharing a generator's state (splitmix64 of a counter)."""
    x = np.full(n, (base * 0x9E3779B97F4A7C15 + (serial << 24)) % 2**64, dtype=np.uint64)
    x += np.arange(n, dtype=np.uint64)
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return (x >> np.uint64(2)).astype(np.int64)


SAMPLING_FIELDS = {
    "temperatures": torch.float32,
    "top_k": torch.int64,
    "top_p": torch.float32,
    "min_p": torch.float32,
    "row_seeds": torch.int64,
}


def sampling_arrays(step: StepInput, vocab_size: int, fresh: Fresh = None) -> dict[str, Any]:
    """The step's sampling parameters by SAMPLING_FIELDS name: the filters only where some row uses one,
    the seeds only where some row samples at random (sampling_tensors reads needs_filter and all_greedy
    from which are present)."""
    top_k, top_p, min_p = step.top_k, step.top_p, step.min_p
    arrays: dict[str, Any] = {"temperatures": step.temperatures}
    if any(k > 0 for k in top_k) or any(p < 1 for p in top_p) or any(p > 0 for p in min_p):
        arrays["top_k"] = [k if k > 0 else vocab_size for k in top_k]
        arrays["top_p"], arrays["min_p"] = top_p, min_p
    if not all(t == 0 for t in step.temperatures):  # each row's seed, or fresh(n)'s, else torch's
        n = len(step.seeds)
        fresh_seeds = fresh(n) if fresh else torch.randint(0, 2**62, (n,), dtype=torch.int64).numpy()
        chosen = [fresh_seeds[i] if seed is None else seed for i, seed in enumerate(step.seeds)]
        arrays["row_seeds"] = np.array(chosen, dtype=np.int64)
    return arrays


def sampling_tensors(step: StepInput, tensors: dict[str, torch.Tensor]) -> SamplingTensors:
    """The uploaded sampling_arrays (by name) as SamplingTensors."""
    return SamplingTensors(
        temperatures=tensors["temperatures"],
        top_k=tensors.get("top_k"),
        top_p=tensors.get("top_p"),
        min_p=tensors.get("min_p"),
        seeds=list(step.seeds),
        all_greedy="row_seeds" not in tensors,
        needs_filter="top_k" in tensors,
        row_seeds=tensors.get("row_seeds"),
    )
