"""CUDA graphs of the forward pass: decode steps at a ladder of batch sizes, and steps with prefill
tokens (mixed or prefill-only) at a ladder of token counts."""

from __future__ import annotations

import functools

import numpy as np
import torch
from torch import nn

from nanoexp.kernels import pdl
from nanoexp.kernels.base import AttentionMetadata
from nanoexp.kernels.prefill_tiles import prefill_block_m, prefill_tiles
from nanoexp.runner.graph_inputs import Fields, GraphLadder, GraphStep, token_fields
from nanoexp.runner.inputs import Fresh
from nanoexp.runner.step_input import StepInput

MAX_GRAPH_BATCH = 512  # larger decode batches run eagerly
MAX_STEP_GRAPH_TOKENS = 4096  # steps with prefill tokens up to this many run in step graphs


def capture_ladder(
    model: nn.Module, sizes: list[int], view, output: torch.Tensor, pool=None
) -> dict[int, torch.cuda.CUDAGraph]:
    """model(*view(size)) into output[:size] captured at each size, largest first, in one memory pool;
    each is run once outside its graph first (compiles, warms up)."""
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


class DecodeGraphs(GraphLadder):
    """Decode graphs at a ladder of batch sizes; padding rows have slot -1 and context 0 (nothing stored
    or read)."""

    def __init__(self, model: nn.Module, hidden_size: int, max_num_seqs: int, max_blocks_per_seq: int,
                 dtype: torch.dtype, device: torch.device):  # fmt: skip
        top = min(max_num_seqs, MAX_GRAPH_BATCH)
        sizes = sorted({bs for bs in (1, 2, 4, 8) if bs < top} | set(range(16, top, 16)) | {top})
        super().__init__(model, sizes, max_blocks_per_seq, hidden_size, dtype, device)
        self.mds = {bs: self.view(bs)[2] for bs in self.sizes}

    def fields(self, bs: int, max_blocks: int) -> Fields:
        return token_fields(bs, bs, max_blocks)

    def view(self, bs: int) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        t = self.arenas[bs].tensors
        md = AttentionMetadata(
            is_prefill=False, slot_mapping=t["slot_mapping"], context_lens=t["context_lens"],
            block_tables=t["block_tables"],
        )  # fmt: skip
        return t["input_ids"], t["positions"], md

    @torch.inference_mode()
    def capture(self) -> None:
        with pdl.graph_launches():
            self.graphs = capture_ladder(self.model, self.sizes, self.view, self.output)

    def prepare(self, step: StepInput, block_size: int, vocab_size: int, fresh: Fresh = None) -> GraphStep:
        bs = self.size_for(step.num_tokens)
        return self.upload(step, bs, bs, bs, block_size, vocab_size, fresh)


class StepGraphs(GraphLadder):
    """Graphs of steps with prefill tokens, keyed by padded token count and whether the step has decodes.
    Attention runs the prefill kernel over a fixed-size tile table (AttentionMetadata.prefill_tiles) and,
    with decodes (`mixed` batching only), first the decode kernel over fixed leading decode slots, so a
    graph serves any mix up to its size; steps without decodes skip the empty slots (~6 us a layer on an
    H200). Padding stores nothing (slot -1), reads nothing (context 0), runs no tiles."""

    def __init__(self, model: nn.Module, hidden_size: int, head_dim: int, max_num_seqs: int,
                 max_num_batched_tokens: int, max_blocks_per_seq: int, dtype: torch.dtype,
                 device: torch.device, mixed: bool = True):  # fmt: skip
        self.max_num_seqs = max_num_seqs
        self.tile_block_m = prefill_block_m(head_dim)  # the tile height of every step graph's tile table
        self.with_decodes = (False, True) if mixed else (False,)
        top = min(max_num_batched_tokens, MAX_STEP_GRAPH_TOKENS)
        sizes = sorted({size for size in (16, 32, 64, 128, 256, 512, 1024, 2048, 4096) if size < top} | {top})
        super().__init__(model, sizes, max_blocks_per_seq, hidden_size, dtype, device)
        for arena in self.arenas.values():  # what the capture runs read: no tiles
            arena.tensors["tiles"].fill_(-1)
        self.mds = {(size, d): self.view(size, d)[2] for size in self.sizes for d in self.with_decodes}

    def fields(self, size: int, max_blocks: int) -> Fields:
        seqs, int32 = self.seq_slots(size), torch.int32
        own = [("decode_context_lens", (seqs,), int32), ("cu_seqlens_q", (seqs + 1,), int32),
               ("tiles", (self.tile_slots(size), 4), int32)]  # fmt: skip
        return token_fields(size, seqs, max_blocks, own)

    def seq_slots(self, tokens: int) -> int:
        return min(tokens, self.max_num_seqs)

    def tile_slots(self, tokens: int) -> int:
        """Tiles of at most `tokens` rows in at most seq_slots sequences: one partial tile each."""
        return -(-tokens // self.tile_block_m) + self.seq_slots(tokens)

    def view(self, size: int, with_decodes: bool) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        t, seqs = self.arenas[size].tensors, self.seq_slots(size)
        decode_slots = seqs if with_decodes else 0
        md = AttentionMetadata(
            is_prefill=True, slot_mapping=t["slot_mapping"], context_lens=t["context_lens"],
            block_tables=t["block_tables"], cu_seqlens_q=t["cu_seqlens_q"], max_seqlen_q=size,
            has_cached_prefix=True, num_decodes=decode_slots, prefill_tiles=t["tiles"],
            decode_context_lens=t["decode_context_lens"][:decode_slots],
        )  # fmt: skip
        return t["input_ids"], t["positions"], md

    @torch.inference_mode()
    def capture(self) -> None:
        pool = None
        with pdl.graph_launches():  # as the decode graphs: their Triton kernels' variants are shared
            for with_decodes in self.with_decodes:
                view = functools.partial(self.view, with_decodes=with_decodes)
                graphs = capture_ladder(self.model, self.sizes, view, self.output, pool)
                pool = pool or graphs[self.sizes[-1]].pool()
                self.graphs.update({(size, with_decodes): graph for size, graph in graphs.items()})

    def prepare(self, step: StepInput, block_size: int, vocab_size: int, fresh: Fresh = None) -> GraphStep:
        size, decodes = self.size_for(step.num_tokens), step.num_decodes
        seqs = self.seq_slots(size)

        def write_attention(host: dict[str, np.ndarray]) -> None:
            host["decode_context_lens"][:decodes] = step.context_lens[:decodes]
            host["decode_context_lens"][decodes:seqs] = 0
            tiles = prefill_tiles(step.query_lens, step.context_lens, decodes, self.tile_block_m)
            host["tiles"][: len(tiles)] = tiles
            host["tiles"][len(tiles) : self.tile_slots(size)] = -1

        key = (size, decodes > 0)
        return self.upload(step, size, seqs, key, block_size, vocab_size, fresh, write_attention)
