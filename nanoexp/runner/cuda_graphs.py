"""CUDA graphs of the forward pass: decode steps at a ladder of batch sizes, and steps with prefill
tokens (mixed or prefill-only) at a ladder of token counts."""

from __future__ import annotations

import bisect
import functools
from collections.abc import Callable, Hashable

import numpy as np
import torch
from torch import nn

from nanoexp.kernels import pdl
from nanoexp.kernels.base import AttentionMetadata
from nanoexp.kernels.prefill_tiles import prefill_block_m, prefill_tiles
from nanoexp.layers.sampler import SamplingTensors
from nanoexp.runner.graph_inputs import Fields, InputArena, PinnedMirrors, token_fields, write_tokens
from nanoexp.runner.inputs import Fresh, ModelInputs, samples_every_row, sampling_arrays, sampling_tensors
from nanoexp.runner.step_input import StepInput

GraphStep = tuple[ModelInputs, SamplingTensors | None]

MAX_GRAPH_BATCH = 512  # larger decode batches run eagerly
MAX_STEP_GRAPH_TOKENS = 4096  # steps with prefill tokens up to this many run in step graphs
STEP_SIZES_PER_OCTAVE = 4  # step graph sizes per doubling above 128 tokens


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


def step_graph_sizes() -> list[int]:
    """16 ... 128 tokens in steps of 16, then STEP_SIZES_PER_OCTAVE sizes per doubling up to
    MAX_STEP_GRAPH_TOKENS (160, 192, 224, 256, 320, ...); all multiples of 16. A step pads by at most
    25%: a 512-token prompt beside 40 decodes replays the 640-token graph, not the 1,024-token one."""
    sizes, octave = list(range(16, 129, 16)), 128
    while octave < MAX_STEP_GRAPH_TOKENS:
        sizes += [octave + octave * k // STEP_SIZES_PER_OCTAVE for k in range(1, STEP_SIZES_PER_OCTAVE + 1)]
        octave *= 2
    return sizes


class GraphLadder:
    """The inputs and output of graphs captured at a ladder of padded token counts, keyed by (size,
    variant); a step replays the smallest size that fits. Each size reads its own InputArena, filled by one
    copy from a pinned mirror, of the fields a graph kind names (`fields(size, max_blocks)`); what the
    capture runs store: nothing (slot -1)."""

    variants: tuple[bool | None, ...] = (None,)  # what else tells graphs apart (StepGraphs: with decodes)
    # each graph kind's: its arena's fields at a size, and the views of a size's arena a capture reads
    fields: Callable[[int, int], Fields]
    view: Callable[..., tuple[torch.Tensor, torch.Tensor, AttentionMetadata]]

    def __init__(
        self,
        model: nn.Module,
        sizes: list[int],
        max_blocks_per_seq: int,
        hidden_size: int,
        dtype: torch.dtype,
        device: torch.device,
    ):
        self.model, self.sizes, self.max_tokens = model, sizes, sizes[-1]
        self.arenas = {size: InputArena(self.fields(size, max_blocks_per_seq), device) for size in sizes}
        for arena in self.arenas.values():
            arena.tensors["slot_mapping"].fill_(-1)
        self.mirrors = PinnedMirrors(list(self.arenas.values()), device)
        self.output = torch.zeros(sizes[-1], hidden_size, dtype=dtype, device=device)
        self.graphs: dict[Hashable, torch.cuda.CUDAGraph] = {}
        self.mds: dict[Hashable, AttentionMetadata] = {
            (size, variant): self.view(size, variant)[2]  # what a replay reads, by graph key
            for size in sizes
            for variant in self.variants
        }

    def size_for(self, num_tokens: int) -> int:
        return self.sizes[bisect.bisect_left(self.sizes, num_tokens)]

    @torch.inference_mode()
    def capture(self) -> None:
        """Each variant's ladder in one memory pool, with PDL launches in every kind of graph (so they share
        their Triton kernels' compiled versions)."""
        pool = None
        with pdl.graph_launches():
            for variant in self.variants:
                view = functools.partial(self.view, variant=variant)
                graphs = capture_ladder(self.model, self.sizes, view, self.output, pool)
                pool = pool or graphs[self.sizes[-1]].pool()
                self.graphs.update({(size, variant): graph for size, graph in graphs.items()})

    def upload(
        self,
        step: StepInput,
        size: int,
        seqs: int,
        key: Hashable,
        block_size: int,
        vocab_size: int,
        fresh: Fresh,
        write_extra: Callable[[dict[str, np.ndarray]], None] | None = None,
    ) -> GraphStep:
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
        inputs = ModelInputs(
            arena.rows("input_ids", n),
            arena.rows("positions", n),
            self.mds[key],
            arena.rows("logits_indices", samples),
            prev_rows,
            samples_every_row(step),
            graph_key=key,
        )
        if not arrays:
            return inputs, None
        return inputs, sampling_tensors(step, {name: arena.rows(name, samples) for name in arrays})

    def replay(self, inputs: ModelInputs) -> torch.Tensor:
        self.graphs[inputs.graph_key].replay()
        return self.output[: inputs.input_ids.shape[0]]


class DecodeGraphs(GraphLadder):
    """Decode graphs at a ladder of batch sizes; padding rows have slot -1 and context 0 (nothing stored
    or read)."""

    def __init__(
        self,
        model: nn.Module,
        hidden_size: int,
        max_num_seqs: int,
        max_blocks_per_seq: int,
        dtype: torch.dtype,
        device: torch.device,
    ):
        top = min(max_num_seqs, MAX_GRAPH_BATCH)
        sizes = sorted({bs for bs in (1, 2, 4, 8) if bs < top} | set(range(16, top, 16)) | {top})
        super().__init__(model, sizes, max_blocks_per_seq, hidden_size, dtype, device)

    def fields(self, bs: int, max_blocks: int) -> Fields:
        return token_fields(bs, bs, max_blocks)

    def view(self, bs: int, variant: None = None) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        t = self.arenas[bs].tensors
        md = AttentionMetadata(
            has_prefill=False,
            slot_mapping=t["slot_mapping"],
            context_lens=t["context_lens"],
            block_tables=t["block_tables"],
        )
        return t["input_ids"], t["positions"], md

    def prepare(self, step: StepInput, block_size: int, vocab_size: int, fresh: Fresh = None) -> GraphStep:
        bs = self.size_for(step.num_tokens)
        return self.upload(step, bs, bs, (bs, None), block_size, vocab_size, fresh)


class StepGraphs(GraphLadder):
    """Graphs of steps with prefill tokens, keyed by padded token count and whether the step has decodes.
    Attention runs the prefill kernel over a fixed-size tile table (AttentionMetadata.prefill_tiles) and,
    with decodes (`mixed` batching only), first the decode kernel over fixed leading decode slots, so a
    graph serves any mix up to its size; steps without decodes skip the empty slots (~6 us a layer on an
    H200). Padding stores nothing (slot -1), reads nothing (context 0), runs no tiles."""

    def __init__(
        self,
        model: nn.Module,
        hidden_size: int,
        head_dim: int,
        num_heads: int,
        num_kv_heads: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_blocks_per_seq: int,
        dtype: torch.dtype,
        device: torch.device,
        mixed: bool = True,
    ):
        self.max_num_seqs = max_num_seqs
        self.variants = (False, True) if mixed else (False,)  # with decodes
        top = min(max_num_batched_tokens, MAX_STEP_GRAPH_TOKENS)
        sizes = sorted({size for size in step_graph_sizes() if size < top} | {top})
        # each size's tile height (this rank's heads), looked up per step rather than derived again
        self.tile_heights = {size: prefill_block_m(head_dim, num_heads, num_kv_heads, size) for size in sizes}
        super().__init__(model, sizes, max_blocks_per_seq, hidden_size, dtype, device)
        for arena in self.arenas.values():  # what the capture runs read: no tiles
            arena.tensors["tiles"].fill_(-1)

    def fields(self, size: int, max_blocks: int) -> Fields:
        seqs, int32 = self.seq_slots(size), torch.int32
        own = [
            ("decode_context_lens", (seqs,), int32),
            ("cu_seqlens_q", (seqs + 1,), int32),
            ("tiles", (self.tile_slots(size), 4), int32),
        ]
        return token_fields(size, seqs, max_blocks, own)

    def seq_slots(self, tokens: int) -> int:
        return min(tokens, self.max_num_seqs)

    def tile_block_m(self, size: int) -> int:
        """The queries of each tile in the graph of `size` tokens (the prefill kernel's, at that size)."""
        return self.tile_heights[size]

    def tile_slots(self, size: int) -> int:
        """Tiles the graph of `size` tokens holds: its rows in at most seq_slots sequences, one partial
        tile each."""
        return -(-size // self.tile_block_m(size)) + self.seq_slots(size)

    def view(self, size: int, variant: bool) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        t, seqs = self.arenas[size].tensors, self.seq_slots(size)
        decode_slots = seqs if variant else 0
        md = AttentionMetadata(
            has_prefill=True,
            slot_mapping=t["slot_mapping"],
            context_lens=t["context_lens"],
            block_tables=t["block_tables"],
            cu_seqlens_q=t["cu_seqlens_q"],
            max_seqlen_q=size,
            has_cached_prefix=True,
            num_decodes=decode_slots,
            prefill_tiles=t["tiles"],
            decode_context_lens=t["decode_context_lens"][:decode_slots],
        )
        return t["input_ids"], t["positions"], md

    def prepare(self, step: StepInput, block_size: int, vocab_size: int, fresh: Fresh = None) -> GraphStep:
        size, decodes = self.size_for(step.num_tokens), step.num_decodes
        seqs = self.seq_slots(size)

        def write_attention(host: dict[str, np.ndarray]) -> None:
            host["decode_context_lens"][:decodes] = step.context_lens[:decodes]
            host["decode_context_lens"][decodes:seqs] = 0
            tiles = prefill_tiles(step.query_lens, step.context_lens, decodes, self.tile_block_m(size))
            host["tiles"][: len(tiles)] = tiles
            host["tiles"][len(tiles) : self.tile_slots(size)] = -1

        key = (size, decodes > 0)
        return self.upload(step, size, seqs, key, block_size, vocab_size, fresh, write_attention)
