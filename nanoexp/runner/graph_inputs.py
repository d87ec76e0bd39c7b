"""A captured graph's inputs, written on the host straight into a pinned mirror of the graph's
static buffers and uploaded by one copy: no staging allocation, no device-side copies into the
graph's buffers (on an H200 host those cost ~0.3 ms in front of a lone prefill step's graph)."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable

import numpy as np
import torch
from torch import nn

from nanoexp.kernels.base import AttentionMetadata
from nanoexp.layers.sampler import SamplingTensors
from nanoexp.runner.inputs import (
    NUMPY_DTYPES,
    Fresh,
    ModelInputs,
    aligned,
    samples_every_row,
    sampling_arrays,
    sampling_tensors,
    token_layout,
)  # fmt: skip
from nanoexp.runner.step_input import StepInput

Fields = list[tuple[str, tuple[int, ...], torch.dtype]]
GraphStep = tuple[ModelInputs, SamplingTensors | None]


class InputArena:
    """Named tensors at aligned offsets of one device byte buffer, the static inputs of one graph. The last
    field (the block tables, the widest) ends the copy early: only the rows a step uses travel."""

    def __init__(self, fields: Fields, device: torch.device):
        self.layout: dict[str, tuple[int, tuple[int, ...], torch.dtype]] = {}
        end = 0
        for name, shape, dtype in fields:
            start = aligned(end)
            self.layout[name] = (start, shape, dtype)
            end = start + math.prod(shape) * dtype.itemsize
        self.nbytes = aligned(end)
        self.buffer = torch.zeros(self.nbytes, dtype=torch.uint8, device=device)
        self.tensors = {name: self.buffer[self.span(name)].view(dtype).view(shape)
                        for name, (_, shape, dtype) in self.layout.items()}  # fmt: skip
        self.last = fields[-1][0]
        self.prefixes: dict[tuple[str, int], torch.Tensor] = {}

    def rows(self, name: str, count: int) -> torch.Tensor:
        """The first `count` rows of a field, a view made once (slicing costs microseconds, a lookup not)."""
        view = self.prefixes.get((name, count))
        if view is None:
            view = self.prefixes[name, count] = self.tensors[name][:count]
        return view

    def span(self, name: str) -> slice:
        start, shape, dtype = self.layout[name]
        return slice(start, start + math.prod(shape) * dtype.itemsize)

    def host_views(self, host: np.ndarray) -> dict[str, np.ndarray]:
        return {name: host[self.span(name)].view(NUMPY_DTYPES[dtype]).reshape(shape)
                for name, (_, shape, dtype) in self.layout.items()}  # fmt: skip

    def copy_end(self, last_rows: int) -> int:
        """The bytes to copy when `last_rows` rows of the last field are used."""
        start, shape, dtype = self.layout[self.last]
        return start + last_rows * math.prod(shape[1:]) * dtype.itemsize


class PinnedMirrors:
    """A ring of host buffers (pinned on CUDA), each the source of one step's copy; a buffer is
    written again only once the device has read its last copy (an event per buffer; waiting on one
    never recorded returns at once)."""

    def __init__(self, nbytes: int, device: torch.device, count: int = 3):
        cuda = device.type == "cuda"
        self.buffers = [torch.zeros(nbytes, dtype=torch.uint8, pin_memory=cuda) for _ in range(count)]
        self.events = [torch.cuda.Event() if cuda else None for _ in range(count)]
        self.views: dict[tuple[int, int], dict[str, np.ndarray]] = {}
        self.copies: dict[tuple[int, int, int], tuple[torch.Tensor, torch.Tensor]] = {}  # (source, target)
        self.next = 0

    def acquire(self, arena: InputArena) -> tuple[int, dict[str, np.ndarray]]:
        """The next buffer, free to write, and its views in `arena`'s layout."""
        index, self.next = self.next, (self.next + 1) % len(self.buffers)
        if self.events[index] is not None:
            self.events[index].synchronize()
        key = (id(arena), index)
        if key not in self.views:
            self.views[key] = arena.host_views(self.buffers[index].numpy())
        return index, self.views[key]

    def upload(self, index: int, arena: InputArena, nbytes: int) -> None:
        """The first `nbytes` of buffer `index` into the arena (the two slices made once)."""
        key = (id(arena), index, nbytes)
        if key not in self.copies:
            self.copies[key] = (self.buffers[index][:nbytes], arena.buffer[:nbytes])
        source, target = self.copies[key]
        target.copy_(source, non_blocking=True)
        if self.events[index] is not None:
            self.events[index].record()


def token_fields(tokens: int, seqs: int, max_blocks: int, extra: Fields = ()) -> Fields:
    """The fields every graph step has, per token and per sequence, then `extra`, then the block tables."""
    int32, int64, float32 = torch.int32, torch.int64, torch.float32
    head = [
        ("input_ids", (tokens,), int64), ("positions", (tokens,), int64), ("slot_mapping", (tokens,), int64),
        ("prev_sample_rows", (tokens,), int64), ("context_lens", (seqs,), int32),
        ("logits_indices", (seqs,), int64), ("temperatures", (seqs,), float32), ("top_k", (seqs,), int64),
        ("top_p", (seqs,), float32), ("min_p", (seqs,), float32), ("row_seeds", (seqs,), int64),
    ]  # fmt: skip
    return head + list(extra) + [("block_tables", (seqs, max_blocks), int32)]


def write_tokens(host: dict[str, np.ndarray], step: StepInput, block_size: int, size: int, seqs: int) -> None:
    """The step's token and sequence fields into a mirror, padded to the graph's `size` tokens and `seqs`
    sequences (token 0 at position 0, slot -1: nothing stored; context 0: nothing read)."""
    n, num_seqs = step.num_tokens, len(step.query_lens)
    tables = host["block_tables"][:num_seqs]
    for row, blocks in zip(tables, step.block_tables):
        row[: len(blocks)] = blocks
    positions, slots, last_rows = token_layout(step, block_size, tables)
    host["logits_indices"][: len(last_rows)] = last_rows
    host["input_ids"][:n] = step.token_ids
    host["input_ids"][n:size] = 0  # the mirror may hold another layout's bytes: padding reads token 0
    host["positions"][:n] = positions
    host["positions"][n:size] = 0
    host["slot_mapping"][:n] = slots
    host["slot_mapping"][n:size] = -1
    host["context_lens"][:num_seqs] = step.context_lens
    host["context_lens"][num_seqs:seqs] = 0
    if step.prev_sample_rows is not None:
        host["prev_sample_rows"][:n] = step.prev_sample_rows


class GraphLadder:
    """The inputs and output of graphs captured at a ladder of padded token counts (runner/cuda_graphs.py); a
    step replays the smallest that fits. Each size reads its own InputArena, filled by one copy from a
    pinned mirror, of the fields a graph kind names (`fields(size, max_blocks)`); what the capture runs
    store: nothing (slot -1)."""

    def __init__(self, model: nn.Module, sizes: list[int], max_blocks_per_seq: int, hidden_size: int,
                 dtype: torch.dtype, device: torch.device):  # fmt: skip
        self.model, self.sizes, self.max_tokens = model, sizes, sizes[-1]
        self.arenas = {size: InputArena(self.fields(size, max_blocks_per_seq), device) for size in sizes}
        for arena in self.arenas.values():
            arena.tensors["slot_mapping"].fill_(-1)
        self.mirrors = PinnedMirrors(max(arena.nbytes for arena in self.arenas.values()), device)
        self.output = torch.zeros(sizes[-1], hidden_size, dtype=dtype, device=device)
        self.graphs: dict[Hashable, torch.cuda.CUDAGraph] = {}
        self.mds: dict[Hashable, AttentionMetadata] = {}  # what a replay reads, by graph key

    def size_for(self, num_tokens: int) -> int:
        return next(size for size in self.sizes if size >= num_tokens)

    def upload(self, step: StepInput, size: int, seqs: int, key: Hashable, block_size: int, vocab_size: int,
               fresh: Fresh, write_extra: Callable[[dict[str, np.ndarray]], None] | None = None,
               ) -> GraphStep:  # fmt: skip
        """The step's inputs written into a pinned mirror of its size's arena, padded to `size` tokens and
        `seqs` sequences (`write_extra(host)`: a graph kind's own fields), uploaded by one copy; the
        ModelInputs and SamplingTensors are views of the arena."""
        arena = self.arenas[size]
        index, host = self.mirrors.acquire(arena)
        write_tokens(host, step, block_size, size, seqs)
        arrays = sampling_arrays(step, vocab_size, fresh) if step.sample_seq_indices else {}
        for name, values in arrays.items():
            host[name][: len(values)] = values
        if write_extra is not None:
            write_extra(host)
        self.mirrors.upload(index, arena, arena.copy_end(len(step.query_lens)))
        n, samples = step.num_tokens, len(step.sample_seq_indices)
        prev_rows = None if step.prev_sample_rows is None else arena.rows("prev_sample_rows", n)
        inputs = ModelInputs(arena.rows("input_ids", n), arena.rows("positions", n), self.mds[key],
                             arena.rows("logits_indices", samples), prev_rows, samples_every_row(step),
                             graph_key=key)  # fmt: skip
        if not arrays:
            return inputs, None
        return inputs, sampling_tensors(step, {name: arena.rows(name, samples) for name in arrays})

    def replay(self, inputs: ModelInputs) -> torch.Tensor:
        self.graphs[inputs.graph_key].replay()
        return self.output[: inputs.input_ids.shape[0]]
