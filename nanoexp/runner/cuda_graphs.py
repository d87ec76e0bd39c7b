"""CUDA graphs of the forward pass: decode steps at a ladder of batch sizes, and steps with prefill
tokens (mixed or prefill-only) at a ladder of token counts."""

from __future__ import annotations

import functools

import torch
from torch import nn

from nanoexp.kernels import pdl
from nanoexp.kernels.base import AttentionMetadata
from nanoexp.kernels.prefill_tiles import prefill_block_m
from nanoexp.runner.inputs import ModelInputs

MAX_GRAPH_BATCH = 512  # larger decode batches run eagerly
MAX_STEP_GRAPH_TOKENS = 4096  # steps with prefill tokens up to this many run in step graphs


def capture_ladder(
    model: nn.Module, sizes: list[int], view, output: torch.Tensor, pool=None
) -> dict[int, torch.cuda.CUDAGraph]:
    """model(*view(size)) into output[:size] captured at each size, largest first, in one memory
    pool (`pool`, or a new one); each is run once outside its graph first (compiles, warms up)."""
    graphs = {}
    for size in reversed(sizes):
        input_ids, positions, md = view(size)
        output[:size] = model(input_ids, positions, md)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool):
            output[:size] = model(input_ids, positions, md)
        pool = pool or graph.pool()
        graphs[size] = graph
        torch.cuda.synchronize()
    return graphs


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    top = min(max_num_seqs, MAX_GRAPH_BATCH)
    sizes = [bs for bs in (1, 2, 4, 8) if bs < top] + list(range(16, top, 16)) + [top]
    return sorted(set(sizes))


class DecodeGraphs:
    """Captures model(input_ids, positions, md) for decode batches; replays the smallest graph
    that fits, padding the extra rows (slot -1: nothing stored; context 0: nothing read)."""

    def __init__(
        self,
        model: nn.Module,
        hidden_size: int,
        max_num_seqs: int,
        max_blocks_per_seq: int,
        dtype: torch.dtype,
        device: torch.device,
    ):
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

    @property
    def max_batch(self) -> int:
        return self.sizes[-1]

    def view(self, bs: int) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        md = AttentionMetadata(
            is_prefill=False,
            slot_mapping=self.md.slot_mapping[:bs],
            context_lens=self.md.context_lens[:bs],
            block_tables=self.md.block_tables[:bs],
        )
        return self.input_ids[:bs], self.positions[:bs], md

    @torch.inference_mode()
    def capture(self) -> None:
        with pdl.graph_launches():
            self.graphs = capture_ladder(self.model, self.sizes, self.view, self.output)

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


def step_graph_sizes(max_num_batched_tokens: int) -> list[int]:
    top = min(max_num_batched_tokens, MAX_STEP_GRAPH_TOKENS)
    return sorted({size for size in (16, 32, 64, 128, 256, 512, 1024, 2048, 4096) if size < top} | {top})


class StepGraphs:
    """Captures model(input_ids, positions, md) for steps with prefill tokens, keyed by padded
    token count and whether the step carries decodes. Attention runs the prefill kernel over a
    fixed-size tile table (AttentionMetadata.prefill_tiles) and, in the graphs of steps with
    decodes (`mixed` batching only), first the decode kernel over a fixed number of leading decode
    slots, so a graph serves any mix of decodes and prefill chunks up to its size; steps without
    decodes skip the empty decode slots (~6 us a layer on an H200). Padding tokens store nothing
    (slot -1), padding sequences read nothing (context 0), padding tiles run nothing."""

    def __init__(self, model: nn.Module, hidden_size: int, head_dim: int, max_num_seqs: int,
                 max_num_batched_tokens: int, max_blocks_per_seq: int, dtype: torch.dtype,
                 device: torch.device, mixed: bool = True):  # fmt: skip
        self.model, self.head_dim, self.max_num_seqs = model, head_dim, max_num_seqs
        self.with_decodes = (False, True) if mixed else (False,)
        self.sizes = step_graph_sizes(max_num_batched_tokens)
        top, seqs = self.sizes[-1], self.seq_slots(self.sizes[-1])
        int32 = {"dtype": torch.int32, "device": device}
        self.input_ids = torch.zeros(top, dtype=torch.int64, device=device)
        self.positions = torch.zeros(top, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((top,), -1, dtype=torch.int64, device=device)
        self.context_lens = torch.zeros(seqs, **int32)
        self.decode_context_lens = torch.zeros(seqs, **int32)
        self.block_tables = torch.zeros(seqs, max_blocks_per_seq, **int32)
        self.cu_seqlens_q = torch.zeros(seqs + 1, **int32)  # unread by the tiled kernel
        self.tiles = torch.full((max(self.tile_slots(size) for size in self.sizes), 4), -1, **int32)
        self.output = torch.zeros(top, hidden_size, dtype=dtype, device=device)
        self.graphs: dict[tuple[int, bool], torch.cuda.CUDAGraph] = {}

    @property
    def max_tokens(self) -> int:
        return self.sizes[-1]

    def seq_slots(self, tokens: int) -> int:
        return min(tokens, self.max_num_seqs)

    def tile_slots(self, tokens: int) -> int:
        """Tiles of at most `tokens` rows in at most seq_slots sequences: one partial tile each."""
        return -(-tokens // self.tile_block_m) + self.seq_slots(tokens)

    def size_for(self, num_tokens: int) -> int:
        return next(size for size in self.sizes if size >= num_tokens)

    @property
    def tile_block_m(self) -> int:
        """The tile height of every step graph's tile table."""
        return prefill_block_m(self.head_dim)

    def view(self, size: int, with_decodes: bool) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        seqs = self.seq_slots(size)
        decode_slots = seqs if with_decodes else 0
        md = AttentionMetadata(
            is_prefill=True, slot_mapping=self.slot_mapping[:size], context_lens=self.context_lens[:seqs],
            block_tables=self.block_tables[:seqs], cu_seqlens_q=self.cu_seqlens_q[: seqs + 1],
            max_seqlen_q=size, has_cached_prefix=True, num_decodes=decode_slots,
            prefill_tiles=self.tiles[: self.tile_slots(size)],
            decode_context_lens=self.decode_context_lens[:decode_slots],
        )  # fmt: skip
        return self.input_ids[:size], self.positions[:size], md

    @torch.inference_mode()
    def capture(self) -> None:
        pool = None
        with pdl.graph_launches():  # as the decode graphs: their Triton kernels' variants are shared
            for with_decodes in self.with_decodes:
                view = functools.partial(self.view, with_decodes=with_decodes)
                graphs = capture_ladder(self.model, self.sizes, view, self.output, pool)
                pool = pool or graphs[self.sizes[-1]].pool()
                self.graphs.update({(size, with_decodes): graph for size, graph in graphs.items()})

    def replay(self, inputs: ModelInputs) -> torch.Tensor:
        n, md = inputs.input_ids.shape[0], inputs.md
        size = self.size_for(n)
        seqs, decodes, tiles = md.context_lens.shape[0], md.num_decodes, inputs.prefill_tiles.shape[0]
        self.input_ids[:n] = inputs.input_ids
        self.positions[:n] = inputs.positions
        self.slot_mapping[:n] = md.slot_mapping
        self.slot_mapping[n:size] = -1
        self.context_lens[:seqs] = md.context_lens
        self.context_lens[seqs : self.seq_slots(size)] = 0
        if decodes:
            self.decode_context_lens[:decodes] = md.context_lens[:decodes]
            self.decode_context_lens[decodes : self.seq_slots(size)] = 0
        self.block_tables[:seqs, : md.block_tables.shape[1]] = md.block_tables
        self.tiles[:tiles] = inputs.prefill_tiles
        self.tiles[tiles : self.tile_slots(size)] = -1
        self.graphs[size, decodes > 0].replay()
        return self.output[:n]
