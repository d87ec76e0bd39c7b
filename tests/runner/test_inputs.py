"""Step inputs: positions, slots and sequence boundaries against a per-token reference."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from helpers import quick_first

from nanoexp.runner import inputs as runner_inputs
from nanoexp.runner.inputs import prepare_inputs, prepare_step
from nanoexp.runner.step_input import StepInput


def reference(step: StepInput, block_size: int) -> tuple[list[int], list[int], list[int]]:
    positions, slots, cu_q = [], [], [0]
    for n, ctx, table in zip(step.query_lens, step.context_lens, step.block_tables, strict=True):
        for pos in range(ctx - n, ctx):
            positions.append(pos)
            slots.append(table[pos // block_size] * block_size + pos % block_size if table else -1)
        cu_q.append(cu_q[-1] + n)
    return positions, slots, cu_q


def random_step(rng: random.Random, block_size: int) -> StepInput:
    num_seqs = rng.randint(1, 6)
    context = [rng.randint(1, 600) for _ in range(num_seqs)]
    query = [rng.randint(1, c) for c in context]
    no_cache = rng.random() < 0.1
    tables = [[] if no_cache else rng.sample(range(10**5), -(-c // block_size)) for c in context]
    sampled = sorted(rng.sample(range(num_seqs), rng.randint(0, num_seqs)))
    tokens = [rng.randrange(1000) for _ in range(sum(query))]
    return StepInput(rng.random() < 0.5, tokens, query, context, tables, sampled)


@pytest.mark.parametrize("python_tokens", [0, 10**6], ids=["numpy", "python"])
def test_prepared_inputs_match_the_per_token_reference(monkeypatch, python_tokens):
    """Whether a step is laid out by numpy or by a Python loop."""
    monkeypatch.setattr(runner_inputs, "PYTHON_TOKENS", python_tokens)
    rng = random.Random(0)
    for _ in range(200):
        block_size = rng.choice([1, 2, 16, 256])
        step = random_step(rng, block_size)
        got = prepare_inputs(step, block_size, torch.device("cpu"))
        positions, slots, cu_q = reference(step, block_size)
        assert got.positions.tolist() == positions
        assert got.md.slot_mapping.tolist() == slots
        if step.has_prefill:
            assert got.md.cu_seqlens_q.tolist() == cu_q
            cu_k = np.concatenate([[0], np.cumsum(step.context_lens)])
            assert got.md.cu_seqlens_k.tolist() == cu_k.tolist()
        else:  # decode reads neither
            assert got.md.cu_seqlens_q is None and got.md.cu_seqlens_k is None
        assert got.logits_indices.tolist() == [cu_q[i + 1] - 1 for i in step.sample_seq_indices]
        assert got.input_ids.tolist() == step.token_ids
        width = max(len(t) for t in step.block_tables)
        assert got.md.block_tables.tolist() == [t + [0] * (width - len(t)) for t in step.block_tables]
        assert got.md.has_cached_prefix == (step.has_prefill and step.query_lens != step.context_lens)


def test_a_lossy_cache_makes_every_prefill_read_the_cache():
    """With an fp8 cache a fresh prompt attends to its K/V as stored, as step graphs read them;
    decode steps are unchanged."""
    fresh = StepInput(
        True,
        [1, 2, 3],
        [3],
        [3],
        [[0]],
        [0],
        temperatures=[0.0],
        top_k=[-1],
        top_p=[1.0],
        min_p=[0.0],
        seeds=[None],
    )
    decode = StepInput(
        False,
        [4],
        [1],
        [4],
        [[0]],
        [0],
        temperatures=[0.0],
        top_k=[-1],
        top_p=[1.0],
        min_p=[0.0],
        seeds=[None],
    )
    cpu = torch.device("cpu")
    assert prepare_step(fresh, 16, 8, cpu)[0].md.has_cached_prefix is False
    assert prepare_step(fresh, 16, 8, cpu, lossy_cache=True)[0].md.has_cached_prefix is True
    assert prepare_step(decode, 16, 8, cpu, lossy_cache=True)[0].md.has_cached_prefix is False


def test_sampling_params_become_sampling_tensors():
    step = StepInput(
        False,
        [1, 2, 3],
        [1, 1, 1],
        [4, 5, 6],
        [[0], [1], [2]],
        [0, 2],
        temperatures=[0.0, 0.7],
        top_k=[-1, 5],
        top_p=[1.0, 0.9],
        min_p=[0.0, 0.1],
        seeds=[None, 42],
    )
    got = prepare_step(step, 16, vocab_size=100, device=torch.device("cpu"))[1]
    assert got.temperatures.tolist() == pytest.approx([0.0, 0.7])
    assert got.top_k.tolist() == [100, 5]  # off = the whole vocabulary
    assert got.top_p.tolist() == pytest.approx([1.0, 0.9]) and got.min_p.tolist() == pytest.approx([0.0, 0.1])
    assert got.seeds == [None, 42] and got.row_seeds[1].item() == 42
    assert not got.all_greedy and got.needs_filter


def test_greedy_unfiltered_columns_skip_seeds_and_filters():
    step = StepInput(
        False,
        [1, 2],
        [1, 1],
        [3, 3],
        [[0], [1]],
        [0, 1],
        temperatures=[0.0, 0.0],
        top_k=[-1, -1],
        top_p=[1.0, 1.0],
        min_p=[0.0, 0.0],
        seeds=[None, None],
    )
    got = prepare_step(step, 16, vocab_size=100, device=torch.device("cpu"))[1]
    assert got.all_greedy and not got.needs_filter and got.row_seeds is None
    assert got.top_k is None and got.top_p is None and got.min_p is None  # nothing reads them


@pytest.mark.parametrize(*quick_first("tokens", [1, 16, 64, 300], quick=3))
def test_blockless_warm_up_prefill_stores_nothing_and_fits_the_limits(checkpoints, tokens):
    from nanoexp import LLM

    path, _ = checkpoints["qwen3_gqa1"]
    with LLM(
        path,
        device="cpu",
        max_model_len=128,
        max_num_seqs=2,
        max_num_batched_tokens=300,
        kv_block_size=16,
    ) as llm:
        runner = llm.engine.executor.runner
        step = runner.blockless_prefill(tokens)
        inputs = prepare_inputs(step, runner.block_size, runner.device)
    lens = step.query_lens
    assert 0 < sum(lens) <= tokens and max(lens) <= 128 and len(lens) <= 2
    assert (inputs.md.slot_mapping == -1).all()


def test_counter_seeds_depend_only_on_base_serial_and_row():
    from nanoexp.runner.inputs import counter_seeds

    a = counter_seeds(7, 3, 5)
    assert a.tolist() == counter_seeds(7, 3, 5).tolist()  # what every rank computes
    assert a[:2].tolist() == counter_seeds(7, 3, 2).tolist()  # row i's seed does not depend on n
    seen = {int(s) for serial in range(50) for s in counter_seeds(7, serial, 64)}
    seen |= {int(s) for s in counter_seeds(8, 0, 64)}
    assert len(seen) == 50 * 64 + 64
    assert all(0 <= s < 2**62 for s in seen)


def test_upload_packs_columns_into_one_buffer_with_aligned_views():
    from nanoexp.runner.inputs import UPLOAD_ALIGN, upload

    tables = np.arange(6, dtype=np.int64).reshape(2, 3)
    got = upload(
        [([5, -1, 7], torch.int64), (tables, torch.int32), ([], torch.int64), ([0.5], torch.float32)],
        torch.device("cpu"),
    )
    assert got[0].tolist() == [5, -1, 7] and got[0].dtype == torch.int64
    assert got[1].tolist() == tables.tolist() and got[1].dtype == torch.int32 and got[1].shape == (2, 3)
    assert got[2].shape == (0,) and got[3].tolist() == [0.5]
    base = got[0].untyped_storage().data_ptr()
    assert all(t.untyped_storage().data_ptr() == base for t in got)  # one buffer, so one copy
    assert all((t.data_ptr() - base) % UPLOAD_ALIGN == 0 for t in got)


def test_substituting_every_row_is_one_gather_with_the_general_result():
    from nanoexp.runner.model_runner import substitute_tokens

    prev = torch.tensor([11, 12, 13, 14])
    rows = torch.tensor([2, 0, 3])
    ids = lambda: torch.tensor([-5, -5, -5])  # noqa: E731
    assert substitute_tokens(ids(), rows, prev, every_row=True).tolist() == [13, 11, 14]
    assert substitute_tokens(ids(), rows, prev).tolist() == [13, 11, 14]
    assert substitute_tokens(ids(), torch.tensor([2, -1, 0]), prev).tolist() == [13, -5, 11]
    in_place = ids()
    substitute_tokens(in_place[1:], torch.tensor([3, -1]), prev)  # a captured graph reads them there
    assert in_place.tolist() == [-5, 14, -5]


def sampled_step(rng: random.Random, block_size: int, has_prefill: bool, max_seqs: int) -> StepInput:
    """A step whose every sequence has cache blocks; a decode step's query lengths are 1; a prefill
    step leads with up to two decodes (a mixed step); some rows sample with filters or seeds."""
    num_seqs = rng.randint(1, max_seqs)
    decodes = min(rng.randint(0, 2), num_seqs - 1) if has_prefill else 0
    context = [rng.randint(1, 200) for _ in range(num_seqs)]
    query = [1 if i < decodes or not has_prefill else rng.randint(1, c) for i, c in enumerate(context)]
    tables = [rng.sample(range(500), -(-c // block_size)) for c in context]
    sampled = sorted(rng.sample(range(num_seqs), rng.randint(0, num_seqs)))
    filtered, seeded = rng.random() < 0.5, rng.random() < 0.5
    return StepInput(
        has_prefill,
        [rng.randrange(1000) for _ in range(sum(query))],
        query,
        context,
        tables,
        sampled,
        temperatures=[0.7 if seeded else 0.0 for _ in sampled],
        top_k=[5 if filtered else -1 for _ in sampled],
        top_p=[0.9 if filtered else 1.0 for _ in sampled],
        min_p=[0.0 for _ in sampled],
        seeds=[rng.randrange(100) for _ in sampled],
        num_decodes=decodes,
        prev_sample_rows=[rng.choice([-1, 0]) for _ in range(sum(query))] if rng.random() < 0.5 else None,
    )


@pytest.mark.parametrize("python_tokens", [0, 64, 10**6], ids=["numpy", "both", "python"])
def test_graph_inputs_equal_the_eager_upload_and_pad_the_graph(monkeypatch, python_tokens):
    """A graph's static buffers, written through a pinned mirror ring whose buffers held other
    sizes' layouts, hold what the eager upload gives, and padding that stores and reads nothing;
    whether a step is laid out by numpy or by a Python loop; tiles of each graph's own height."""
    from nanoexp.kernels import prefill_tiles as prefill_tiles_module
    from nanoexp.kernels.prefill_tiles import prefill_tiles
    from nanoexp.runner.cuda_graphs import DecodeGraphs, StepGraphs

    monkeypatch.setattr(runner_inputs, "PYTHON_TOKENS", python_tokens)
    monkeypatch.setattr(prefill_tiles_module, "LARGE_GRID_TILES", 10)  # from 320 tokens: both tile heights

    cpu, block_size, vocab = torch.device("cpu"), 16, 1000
    decode = DecodeGraphs(None, 8, max_num_seqs=20, max_blocks_per_seq=13, dtype=torch.float32, device=cpu)
    steps = StepGraphs(
        None,
        8,
        head_dim=64,
        num_heads=4,
        num_kv_heads=2,
        max_num_seqs=6,
        max_num_batched_tokens=700,
        max_blocks_per_seq=13,
        dtype=torch.float32,
        device=cpu,
    )
    rng = random.Random(1)
    for _ in range(60):
        has_prefill = rng.random() < 0.5
        graphs = steps if has_prefill else decode
        step = sampled_step(rng, block_size, has_prefill, 6 if has_prefill else 20)
        if has_prefill and step.num_tokens > steps.max_tokens:
            continue
        got, sampling = graphs.prepare(step, block_size, vocab)
        want, want_sampling = prepare_step(step, block_size, vocab, cpu)
        n, seqs, md = step.num_tokens, len(step.query_lens), got.md
        size = steps.size_for(n) if has_prefill else next(s for s in decode.sizes if s >= n)
        slots = md.slot_mapping
        assert got.input_ids.tolist() == step.token_ids and got.positions.tolist() == want.positions.tolist()
        assert slots[:n].tolist() == want.md.slot_mapping.tolist() and (slots[n:size] == -1).all()
        context = md.context_lens[: steps.seq_slots(size) if has_prefill else size]
        assert context[:seqs].tolist() == step.context_lens and (context[seqs:] == 0).all()
        for row, blocks in enumerate(step.block_tables):
            assert md.block_tables[row, : len(blocks)].tolist() == blocks
        assert got.logits_indices.tolist() == want.logits_indices.tolist() and got.all_rows == want.all_rows
        if step.prev_sample_rows is None:
            assert got.prev_sample_rows is None
        else:
            assert got.prev_sample_rows.tolist() == step.prev_sample_rows
        if has_prefill:
            block_m = steps.tile_block_m(size)
            tiles = prefill_tiles(step.query_lens, step.context_lens, step.num_decodes, block_m)
            table = md.prefill_tiles[: steps.tile_slots(size)]
            assert table[: len(tiles)].tolist() == tiles.tolist() and (table[len(tiles) :] == -1).all()
            assert got.graph_key == (size, step.num_decodes > 0)
            decode_lens = steps.arenas[size].tensors["decode_context_lens"][: steps.seq_slots(size)]
            assert decode_lens.tolist()[: step.num_decodes] == step.context_lens[: step.num_decodes]
            assert (decode_lens[step.num_decodes :] == 0).all()
        assert (sampling is None) == (want_sampling is None)
        if sampling is not None:
            for field in ("temperatures", "top_k", "top_p", "min_p", "row_seeds"):
                mine, theirs = getattr(sampling, field), getattr(want_sampling, field)
                assert (mine is None) == (theirs is None)
                if mine is not None and field != "row_seeds":
                    assert mine.tolist() == theirs.tolist()
            flags = (sampling.all_greedy, sampling.needs_filter)
            assert flags == (want_sampling.all_greedy, want_sampling.needs_filter)
