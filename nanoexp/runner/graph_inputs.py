"""A captured graph's inputs, written on the host straight into a pinned mirror of the graph's
static buffers and uploaded by one copy: no staging allocation, no device-side copies into the
graph's buffers (on an H200 host those cost ~0.3 ms in front of a lone prefill step's graph)."""

from __future__ import annotations

import math

import numpy as np
import torch

from nanoexp.runner.inputs import NUMPY_DTYPES, aligned, token_layout
from nanoexp.runner.step_input import StepInput

Fields = list[tuple[str, tuple[int, ...], torch.dtype]]


class InputArena:
    """Named tensors at aligned offsets of one device byte buffer, the static inputs of one graph. The last
    field (the block tables, the widest) ends the copy early: only the rows a step uses travel."""

    def __init__(self, fields: Fields, device: torch.device):
        self.layout: dict[str, tuple[slice, tuple[int, ...], torch.dtype]] = {}  # (bytes, shape, dtype)
        end = 0
        for name, shape, dtype in fields:
            start = aligned(end)
            end = start + math.prod(shape) * dtype.itemsize
            self.layout[name] = (slice(start, end), shape, dtype)
        self.nbytes = aligned(end)
        self.buffer = torch.zeros(self.nbytes, dtype=torch.uint8, device=device)
        self.tensors = {
            name: self.buffer[span].view(dtype).view(shape)
            for name, (span, shape, dtype) in self.layout.items()
        }
        self.last = fields[-1][0]
        self.prefixes: dict[tuple[str, int], torch.Tensor] = {}

    def rows(self, name: str, count: int) -> torch.Tensor:
        """The first `count` rows of a field, a view made once (slicing costs microseconds, a lookup not)."""
        view = self.prefixes.get((name, count))
        if view is None:
            view = self.prefixes[name, count] = self.tensors[name][:count]
        return view

    def host_views(self, host: np.ndarray) -> dict[str, np.ndarray]:
        return {
            name: host[span].view(NUMPY_DTYPES[dtype]).reshape(shape)
            for name, (span, shape, dtype) in self.layout.items()
        }

    def copy_end(self, last_rows: int) -> int:
        """The bytes to copy when `last_rows` rows of the last field are used."""
        span, shape, dtype = self.layout[self.last]
        return span.start + last_rows * math.prod(shape[1:]) * dtype.itemsize


class PinnedMirrors:
    """A ring of host buffers (pinned on CUDA), each the source of one step's copy; a buffer is
    written again only once the device has read its last copy (an event per buffer; waiting on one
    never recorded returns at once)."""

    def __init__(self, arenas: list[InputArena], device: torch.device, count: int = 3):
        cuda, nbytes = device.type == "cuda", max(arena.nbytes for arena in arenas)
        self.buffers = [torch.zeros(nbytes, dtype=torch.uint8, pin_memory=cuda) for _ in range(count)]
        self.events = [torch.cuda.Event() if cuda else None for _ in range(count)]
        self.views = {
            (id(arena), index): arena.host_views(buffer.numpy())  # each buffer in each layout
            for arena in arenas
            for index, buffer in enumerate(self.buffers)
        }
        self.copies: dict[tuple[int, int, int], tuple[torch.Tensor, torch.Tensor]] = {}  # (source, target)
        self.next = 0

    def acquire(self, arena: InputArena) -> tuple[int, dict[str, np.ndarray]]:
        """The next buffer, free to write, and its views in `arena`'s layout."""
        index, self.next = self.next, (self.next + 1) % len(self.buffers)
        event = self.events[index]
        if event is not None:
            event.synchronize()
        return index, self.views[id(arena), index]

    def upload(self, index: int, arena: InputArena, nbytes: int) -> None:
        """The first `nbytes` of buffer `index` into the arena (the two slices made once)."""
        key = (id(arena), index, nbytes)
        if key not in self.copies:
            self.copies[key] = (self.buffers[index][:nbytes], arena.buffer[:nbytes])
        source, target = self.copies[key]
        target.copy_(source, non_blocking=True)
        event = self.events[index]
        if event is not None:
            event.record()


def token_fields(tokens: int, seqs: int, max_blocks: int, extra: Fields | tuple[()] = ()) -> Fields:
    """The fields every graph step has, per token and per sequence, then `extra`, then the block tables."""
    int32, int64, float32 = torch.int32, torch.int64, torch.float32
    head = [
        ("input_ids", (tokens,), int64),
        ("positions", (tokens,), int64),
        ("slot_mapping", (tokens,), int64),
        ("prev_sample_rows", (tokens,), int64),
        ("context_lens", (seqs,), int32),
        ("logits_indices", (seqs,), int64),
        ("temperatures", (seqs,), float32),
        ("top_k", (seqs,), int64),
        ("top_p", (seqs,), float32),
        ("min_p", (seqs,), float32),
        ("row_seeds", (seqs,), int64),
    ]
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
