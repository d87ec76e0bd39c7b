"""Our engine against transformers: prefill logits and greedy tokens on every cache path."""

from __future__ import annotations

import gc
import time
import weakref

import pytest
import torch
from checkpoints import SHAPES, random_prompts
from helpers import prefill_logits, quick_first, staggered_run

from nanoexp import LLM, SamplingParams
from nanoexp.config import KnobError
from nanoexp.runner.step_input import StepInput

LENGTHS = [1, 2, 15, 16, 17, 63, 129, 300]
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def assert_matches_reference(name, llm, prompts, reference_outputs, max_tokens=12):
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    outs = llm.generate(prompts, params, use_tqdm=False)
    for prompt, out in zip(prompts, outs, strict=True):
        assert out["token_ids"] == reference_outputs(name, prompt, max_tokens), f"prompt length {len(prompt)}"
    return outs


@pytest.mark.parametrize(*quick_first("name", list(SHAPES)))
def test_prefill_logits_match_transformers(name, checkpoints):
    path, hf_model = checkpoints[name]
    prompt = random_prompts([40])[0]
    with torch.no_grad():
        ref = hf_model(torch.tensor([prompt])).logits[0]
    with LLM(path, num_kv_blocks=16, kv_block_size=16) as llm:
        ours = prefill_logits(llm, StepInput(True, prompt, [40], [40], [[0, 1, 2]], []))
    rel = (ours - ref).norm() / ref.norm()
    assert rel < 1e-4, rel


def test_max_model_len_beyond_the_models_positions_is_an_error(checkpoints):
    with pytest.raises(KnobError, match=r"^max_model_len=1025 is invalid: must be <= 1024"):  # as typed
        LLM(checkpoints["qwen3_gqa1"][0], max_model_len=1025)


def test_max_model_len_defaults_to_the_models_positions(checkpoints):
    with LLM(checkpoints["qwen3_gqa1"][0], num_kv_blocks=8) as llm:
        assert llm.engine.max_model_len == 1024


@pytest.mark.parametrize(*quick_first("name", list(SHAPES)))
def test_greedy_batch_matches_transformers(name, checkpoints, reference_outputs):
    prompts = random_prompts(LENGTHS, seed=1)
    with LLM(checkpoints[name][0], kv_block_size=16, enable_prefix_caching=False) as llm:
        assert_matches_reference(name, llm, prompts, reference_outputs)


@pytest.mark.parametrize(*quick_first("block_size", [1, 16, 256], quick=1))
def test_any_block_size(block_size, checkpoints, reference_outputs):
    prompts = random_prompts([1, 17, 255, 257, 300], seed=2)
    with LLM(checkpoints["qwen3_gqa2_tied"][0], kv_block_size=block_size) as llm:
        llm.engine.executor.runner.kv_cache.fill_(float("nan"))  # any read of an unwritten slot shows
        assert_matches_reference("qwen3_gqa2_tied", llm, prompts, reference_outputs)


def test_prefix_cache_hits_and_matches(checkpoints, reference_outputs):
    shared = random_prompts([96], seed=3)[0]
    prompts = [shared + tail for tail in random_prompts([5, 20, 33, 1], seed=4)]
    name = "qwen3_gqa4"
    with LLM(checkpoints[name][0], kv_block_size=16, enable_prefix_caching=True) as llm:
        first = assert_matches_reference(name, llm, prompts[:1], reference_outputs)
        rest = assert_matches_reference(name, llm, prompts[1:], reference_outputs)
    assert first[0].num_cached_tokens == 0
    assert all(out.num_cached_tokens == 96 for out in rest)


def test_repeated_prompt_fully_cached_still_matches(checkpoints, reference_outputs):
    prompt = random_prompts([64], seed=5)[0]  # a multiple of the block size
    name = "qwen3_gqa1"
    with LLM(checkpoints[name][0], kv_block_size=16) as llm:
        assert_matches_reference(name, llm, [prompt], reference_outputs)
        again = assert_matches_reference(name, llm, [prompt, prompt], reference_outputs)
    assert again[0].num_cached_tokens == 48  # the last block is recomputed for its logits


def test_chunked_prefill_with_small_budget(checkpoints, reference_outputs):
    prompts = random_prompts([300, 7, 150, 64], seed=6)
    name = "qwen2_gqa2"
    with LLM(checkpoints[name][0], kv_block_size=16, max_num_batched_tokens=40) as llm:
        assert_matches_reference(name, llm, prompts, reference_outputs)


def test_preemption_under_tiny_kv_cache(checkpoints, reference_outputs):
    prompts = random_prompts([60, 70, 80, 50, 90, 40], seed=7)
    name = "qwen3_gqa2_tied"
    with LLM(checkpoints[name][0], kv_block_size=16, num_kv_blocks=14) as llm:
        outs = assert_matches_reference(name, llm, prompts, reference_outputs, max_tokens=24)
        assert llm.engine.block_manager.num_used == 0
    assert sum(out.num_preemptions for out in outs) > 0


def test_preemption_with_chunked_prefill_and_prefix_cache(checkpoints, reference_outputs):
    shared = random_prompts([48], seed=8)[0]
    prompts = [shared + tail for tail in random_prompts([30, 12, 40, 25, 5], seed=9)]
    name = "qwen3_gqa4"
    with LLM(checkpoints[name][0], kv_block_size=8, num_kv_blocks=22, max_num_batched_tokens=32) as llm:
        outs = assert_matches_reference(name, llm, prompts, reference_outputs, max_tokens=30)
        assert llm.engine.block_manager.num_used == 0
    assert sum(out.num_preemptions for out in outs) > 0


def test_eos_and_stop_tokens_end_generation(checkpoints, reference_outputs):
    name = "qwen3_gqa1"
    prompt = random_prompts([10], seed=10)[0]
    ref = reference_outputs(name, prompt, 12)
    with LLM(checkpoints[name][0], kv_block_size=16) as llm:
        stop = llm.generate(
            [prompt], SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[ref[3]]), use_tqdm=False
        )[0]
    assert stop.token_ids == ref[: ref.index(ref[3]) + 1]
    assert stop.finish_reason == "stop"


def test_outputs_carry_timings(checkpoints):
    with LLM(checkpoints["qwen3_gqa1"][0], kv_block_size=16) as llm:
        out = llm.generate([[1, 2, 3]], GREEDY, use_tqdm=False)[0]
    assert out.arrival_time <= out.first_scheduled_time <= out.first_token_time <= out.finish_time
    assert len(out.token_times) == len(out.token_ids) == 12
    assert out.tpot >= 0 and out.ttft > 0 and out["text"] == ""


@pytest.mark.parametrize(
    *quick_first(
        "kwargs",
        [dict(), dict(max_num_batched_tokens=40), dict(num_kv_blocks=14), dict(kv_block_size=1)],
        quick=2,
    ),
    ids=["plain", "chunked", "preemption", "block1"],
)
def test_overlapped_scheduling_matches_transformers(kwargs, checkpoints, reference_outputs):
    name = "qwen3_gqa2_tied"
    shared = random_prompts([40], seed=16)[0]
    prompts = random_prompts([60, 7, 80, 1, 50], seed=17) + [shared + [1], shared + [2, 3]]
    args = dict(kv_block_size=16, async_scheduling=True)
    args.update(kwargs)
    with LLM(checkpoints[name][0], **args) as llm:
        assert_matches_reference(name, llm, prompts, reference_outputs, max_tokens=20)
        assert llm.engine.block_manager.num_used == 0 and not llm.engine.has_unfinished()


def test_overlapped_scheduling_keeps_seeds_and_stop_tokens(checkpoints, reference_outputs):
    name = "qwen3_gqa1"
    prompts = random_prompts([5, 30, 12], seed=18)
    stop = reference_outputs(name, prompts[0], 12)[4]
    params = [
        SamplingParams(temperature=0.8, top_k=50, seed=7, max_tokens=16, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[stop]),
        SamplingParams(temperature=1.0, seed=3, max_tokens=9, ignore_eos=True),
    ]
    prompts[1] = prompts[0]
    results = {}
    for overlap in (False, True):
        with LLM(checkpoints[name][0], kv_block_size=16, async_scheduling=overlap) as llm:
            results[overlap] = [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert results[True] == results[False]
    assert results[True][1][-1] == stop and len(results[True][1]) < 12


def test_overlapped_step_times_add_up_to_at_most_the_wall_time(checkpoints):
    with LLM(checkpoints["qwen3_gqa1"][0], kv_block_size=16, async_scheduling=True) as llm:
        for prompt in random_prompts([20, 9, 33], seed=19):
            llm.engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
        start, step_times = time.perf_counter(), []
        while llm.engine.has_unfinished():
            step_times.append(llm.engine.step()[1].step_time_s)
        wall = time.perf_counter() - start
    assert len(step_times) >= 30 and sum(step_times) <= wall


def test_ignore_eos_generates_through_an_eos_that_greedy_picks(checkpoints, reference_outputs):
    name = "qwen3_gqa4"
    prompt = random_prompts([1, 2, 15], seed=20)[2]  # greedy picks EOS as its 11th token
    eos = checkpoints[name][1].config.eos_token_id
    with LLM(checkpoints[name][0], kv_block_size=16) as llm:
        through = llm.generate(
            [prompt], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True), use_tqdm=False
        )[0]
        stopped = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)[0]
    assert eos in through.token_ids[:-1] and len(through.token_ids) == 16
    assert through.token_ids == reference_outputs(name, prompt, 16)
    first_eos = through.token_ids.index(eos) + 1
    assert stopped.token_ids == through.token_ids[:first_eos] and stopped.finish_reason == "stop"


def test_reset_prefix_cache_makes_the_next_pass_cold(checkpoints):
    prompt = random_prompts([70], seed=5)[0]
    with LLM(checkpoints["qwen3_gqa1"][0], kv_block_size=16, num_kv_blocks=32) as llm:
        first = llm.generate([prompt], GREEDY, use_tqdm=False)[0]
        warm = llm.generate([prompt], GREEDY, use_tqdm=False)[0]
        llm.engine.reset_prefix_cache()
        cold = llm.generate([prompt], GREEDY, use_tqdm=False)[0]
        llm.engine.add_request(prompt, GREEDY)
        with pytest.raises(RuntimeError, match="idle engine"):
            llm.engine.reset_prefix_cache()
        llm.engine.abort_all()
    assert first.num_cached_tokens == 0 and warm.num_cached_tokens == 64 and cold.num_cached_tokens == 0
    assert first.token_ids == warm.token_ids == cold.token_ids


def collected(obj) -> bool:
    """Whether obj is in a generation the garbage collector walks (frozen objects are in none)."""
    return any(o is obj for generation in range(3) for o in gc.get_objects(generation))


def test_the_engines_start_up_objects_are_frozen_until_close(checkpoints):
    """A full collection walking a large cache's block state paused a step by ~40 ms on an H200
    host. Frozen, no collection walks what start-up built; close() gives it back."""
    with LLM(checkpoints["qwen3_gqa1"][0], num_kv_blocks=4096) as llm:
        manager = llm.engine.block_manager
        assert gc.get_freeze_count() > 0 and manager.num_blocks == 4096
        assert not collected(manager.ref_counts) and not collected(manager.free)
    assert gc.get_freeze_count() == 0 and collected(manager.ref_counts)


def test_an_engine_dropped_unclosed_still_lets_its_model_be_collected(checkpoints):
    llm = LLM(checkpoints["qwen3_gqa1"][0], num_kv_blocks=64)
    weight = weakref.ref(next(llm.engine.executor.runner.model.parameters()))
    del llm
    gc.collect()
    assert weight() is None and gc.get_freeze_count() == 0


def test_closing_one_engine_keeps_another_open_engines_objects_frozen(checkpoints):
    path = checkpoints["qwen3_gqa1"][0]
    with LLM(path, num_kv_blocks=64) as kept:
        first = LLM(path, num_kv_blocks=64)
        weight = weakref.ref(next(first.engine.executor.runner.model.parameters()))
        first.close()
        assert weight() is None  # the closed engine's model is gone, not frozen
        assert not collected(kept.engine.block_manager.ref_counts)
        del first
    assert gc.get_freeze_count() == 0


STAGGERED_PATHS = {
    "plain": dict(),
    "chunked": dict(max_num_batched_tokens=24),
    "preemption": dict(num_kv_blocks=14),
    "prefix": dict(enable_prefix_caching=True),
    "block1": dict(kv_block_size=1, max_num_batched_tokens=48),
    "sync": dict(async_scheduling=False, max_num_batched_tokens=40),
}


@pytest.mark.parametrize(*quick_first("batching", ["mixed", "prefill_first"]))
@pytest.mark.parametrize(*quick_first("path", list(STAGGERED_PATHS), quick=2))
def test_staggered_arrivals_match_transformers_under_both_batching_policies(
    path, batching, checkpoints, reference_outputs
):
    name = "qwen3_gqa2_tied"
    shared = random_prompts([40], seed=30)[0]
    prompts = random_prompts([60, 7, 80, 1, 50], seed=31) + [shared + [1], shared + [2, 3]]
    args = {"kv_block_size": 16, "batching": batching, **STAGGERED_PATHS[path]}
    with LLM(checkpoints[name][0], **args) as llm:
        outputs, seen = staggered_run(llm, prompts, max_tokens=16)
    for prompt, tokens in zip(prompts, outputs, strict=True):
        assert tokens == reference_outputs(name, prompt, 16), f"prompt length {len(prompt)}"
    assert ("mixed" in seen) == (batching == "mixed")
