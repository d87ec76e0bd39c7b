"""CUDA graphs of the decode forward pass at a ladder of batch sizes."""

from __future__ import annotations

import torch
from torch import nn

from nanoexp.kernels import pdl
from nanoexp.kernels.base import AttentionMetadata
from nanoexp.runner.inputs import ModelInputs

MAX_GRAPH_BATCH = 512  # larger decode batches run eagerly


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    top = min(max_num_seqs, MAX_GRAPH_BATCH)
    sizes = [bs for bs in (1, 2, 4, 8) if bs < top] + list(range(16, top, 16)) + [top]
    return sorted(set(sizes))


class DecodeGraphs:
    """Captures model(input_ids, positions, md) for decode batches; replays the smallest graph
    that fits, padding the extra rows (slot -1: nothing stored; context 0: nothing read)."""

    def __init__(self, model: nn.Module, hidden_size: int, max_num_seqs: int, max_blocks_per_seq: int,
                 dtype: torch.dtype, device: torch.device):
        self.model = model
        self.sizes = graph_batch_sizes(max_num_seqs)
        top = self.sizes[-1]
        self.input_ids = torch.zeros(top, dtype=torch.int64, device=device)
        self.positions = torch.zeros(top, dtype=torch.int64, device=device)
        self.md = AttentionMetadata(
            is_prefill=False,
            slot_mapping=torch.full((top,), -1, dtype=torch.int64, device=device),
            context_lens=torch.zeros(top, dtype=torch.int32, device=device),
            block_tables=torch.zeros(top, max_blocks_per_seq, dtype=torch.int32, device=device),
        )
        self.output = torch.zeros(top, hidden_size, dtype=dtype, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.pool = None

    @property
    def max_batch(self) -> int:
        return self.sizes[-1]

    def view(self, bs: int) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        md = AttentionMetadata(
            is_prefill=False, slot_mapping=self.md.slot_mapping[:bs], context_lens=self.md.context_lens[:bs],
            block_tables=self.md.block_tables[:bs],
        )
        return self.input_ids[:bs], self.positions[:bs], md

    @torch.inference_mode()
    def capture(self) -> None:
        with pdl.graph_launches():
            self._capture_all()

    def _capture_all(self) -> None:
        for bs in reversed(self.sizes):
            input_ids, positions, md = self.view(bs)
            self.output[:bs] = self.model(input_ids, positions, md)  # warm-up outside the graph
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, self.pool):
                self.output[:bs] = self.model(input_ids, positions, md)
            self.pool = self.pool or graph.pool()
            self.graphs[bs] = graph
            torch.cuda.synchronize()

    def replay(self, inputs: ModelInputs) -> torch.Tensor:
        n = inputs.input_ids.shape[0]
        bs = next(size for size in self.sizes if size >= n)
        self.input_ids[:n] = inputs.input_ids
        self.positions[:n] = inputs.positions
        self.md.slot_mapping[:n] = inputs.md.slot_mapping
        self.md.context_lens[:n] = inputs.md.context_lens
        if n < bs:  # each op costs the host microseconds; a full graph has no padding rows
            self.md.slot_mapping[n:bs] = -1
            self.md.context_lens[n:bs] = 0
        width = inputs.md.block_tables.shape[1]
        self.md.block_tables[:n, :width] = inputs.md.block_tables
        self.graphs[bs].replay()
        return self.output[:n]
