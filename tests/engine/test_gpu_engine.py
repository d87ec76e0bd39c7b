"""On a CUDA device: the engine's default GPU path (Triton kernels, CUDA graphs) against
transformers. float32 must match token for token; bfloat16 follows the tolerance policy below."""

from __future__ import annotations

import pytest
import torch
from checkpoints import random_prompts
from helpers import assert_follows_transformers, staggered_run

from nanoexp import LLM, SamplingParams
from nanoexp.kernels import prefill_tiles

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

LENGTHS = [1, 2, 15, 16, 17, 63, 129, 300, 257, 40]
PATHS = {
    "plain": dict(enable_prefix_caching=False),
    "prefix_cache": dict(enable_prefix_caching=True),
    "chunked": dict(max_num_batched_tokens=48),
    "preemption": dict(num_kv_blocks=40),
    "block1": dict(kv_block_size=1, num_kv_blocks=4000),
    "block256": dict(kv_block_size=256),
    "small_prefill_budget": dict(max_num_batched_tokens=100),
    "async": dict(async_scheduling=True, num_kv_blocks=60),
}


GRAPHS_QUICK = pytest.param(False, marks=pytest.mark.gpu_quick)  # graphs on, in the quick subset


def engine_outputs(path, prompts, max_tokens, **kwargs):
    args = dict(
        kv_block_size=16,
        attention_backend="triton",
        max_model_len=1024,
        max_num_seqs=16,
        num_kv_blocks=512,
        max_num_batched_tokens=2048,
    )
    args.update(kwargs)
    with LLM(path, device="cuda", **args) as llm:
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        return llm.generate(prompts, params, use_tqdm=False)


@pytest.mark.gpu_quick
@pytest.mark.parametrize("eager", [False, True], ids=["graphs", "eager"])
@pytest.mark.parametrize("path_name", list(PATHS))
def test_float32_greedy_matches_transformers(checkpoints, reference_outputs, path_name, eager):
    name = "qwen3_gqa4"
    shared = random_prompts([32], seed=11)[0]
    prompts = random_prompts(LENGTHS, seed=12) + [shared + [7], shared + [8, 9]]
    outs = engine_outputs(
        checkpoints[name][0], prompts, 16, dtype="float32", enforce_eager=eager, **PATHS[path_name]
    )
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.token_ids == reference_outputs(name, prompt, 16), f"prompt length {len(prompt)}"
    if path_name == "preemption":
        assert sum(o.num_preemptions for o in outs) > 0


@pytest.mark.parametrize("eager", [GRAPHS_QUICK, True], ids=["graphs", "eager"])
def test_bfloat16_greedy_follows_transformers_within_policy(checkpoints, eager):
    """bf16 policy: where our greedy tokens first differ from transformers (float32, teacher-forced
    on our tokens), our token must be among transformers' top 3 there, and at least half of the
    prompts must match exactly (random tiny models have near-tied logits, so bf16 flips some)."""
    name = "qwen3_gqa4"
    path, hf_model = checkpoints[name]
    prompts = random_prompts(LENGTHS, seed=13)
    outs = engine_outputs(path, prompts, 16, dtype="bfloat16", enforce_eager=eager)
    assert_follows_transformers(hf_model, prompts, outs)


@pytest.mark.parametrize("eager", [GRAPHS_QUICK, True], ids=["graphs", "eager"])
@pytest.mark.parametrize("name", ["qwen3_gqa4", "qwen3_gqa2_tied"])
def test_float32_greedy_matches_transformers_in_a_large_step(
    checkpoints, reference_outputs, name, eager, monkeypatch
):
    """A first step of 2,200 prompt tokens runs the prefill kernel's large tiles (from 64 tiles here:
    the test models have 2 kv heads and a 1,024-token limit; Qwen3-0.6B takes them from 512)."""
    monkeypatch.setattr(prefill_tiles, "LARGE_GRID_TILES", 64)
    head_dim, heads, kv_heads = {"qwen3_gqa4": (16, 8, 2), "qwen3_gqa2_tied": (32, 4, 2)}[name]
    assert prefill_tiles.prefill_config(head_dim, heads, kv_heads, 2200)[2] == 8  # the large tiles' warps
    prompts = random_prompts([700, 600, 500, 400], seed=16)
    outs = engine_outputs(
        checkpoints[name][0], prompts, 8, dtype="float32", enforce_eager=eager, max_num_batched_tokens=4096
    )
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.token_ids == reference_outputs(name, prompt, 8), f"prompt length {len(prompt)}"


def test_graph_ladder_covers_any_max_num_seqs(checkpoints, reference_outputs):
    name = "qwen3_gqa1"
    prompts = random_prompts([3] * 12, seed=15)
    outs = engine_outputs(checkpoints[name][0], prompts, 8, dtype="float32", max_num_seqs=12)
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.token_ids == reference_outputs(name, prompt, 8)


def test_startup_reports_its_parts(checkpoints):
    with LLM(
        checkpoints["qwen3_gqa1"][0],
        device="cuda",
        kv_block_size=16,
        max_num_seqs=16,
        max_num_batched_tokens=2048,
        gpu_memory_utilization=0.3,
    ) as llm:
        stats = llm.stats()
    assert stats["cuda_graphs"] and stats["graph_capture_s"] > 0 and stats["warmup_s"] > 0
    assert stats["num_kv_blocks"] > 0 and stats["peak_memory_bytes"] > 0


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_seeded_sampling_through_the_kernel_reproduces_and_ignores_the_batch(checkpoints, async_scheduling):
    prompts = random_prompts([5, 40, 9], seed=16)
    with LLM(
        checkpoints["qwen3_gqa1"][0],
        device="cuda",
        kv_block_size=16,
        max_num_seqs=16,
        max_num_batched_tokens=2048,
        num_kv_blocks=256,
        async_scheduling=async_scheduling,
    ) as llm:
        assert llm.stats()["sampler_kernel"]

        def run(seed, batch):
            params = SamplingParams(temperature=0.8, max_tokens=24, seed=seed, ignore_eos=True)
            return [o.token_ids for o in llm.generate(batch, params, use_tqdm=False)]

        first, again, other = run(5, prompts), run(5, prompts), run(6, prompts)
        alone = run(5, prompts[1:2])[0]
        unseeded = llm.generate(
            prompts, SamplingParams(temperature=0.8, max_tokens=24, ignore_eos=True), use_tqdm=False
        )
    assert first == again and first != other and alone == first[1]
    assert all(len(o.token_ids) == 24 for o in unseeded)


def test_read_back_reuses_a_few_pinned_buffers(checkpoints, reference_outputs):
    """Each launched step's ids come back through pinned buffers and events taken from a pool and
    returned when read: a whole generation needs as many as are in flight at once, not one per step."""
    prompts = random_prompts([17, 3, 40], seed=22)
    with LLM(
        checkpoints["qwen3_gqa1"][0],
        device="cuda",
        attention_backend="triton",
        kv_block_size=16,
        max_num_seqs=16,
        num_kv_blocks=256,
        async_scheduling=True,
    ) as llm:
        greedy = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
        outs = llm.generate(prompts, greedy, use_tqdm=False)
        pool = llm.engine.executor.runner.readback
        assert 1 <= len(pool.free) <= 3
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.token_ids == reference_outputs("qwen3_gqa1", prompt, 20)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
@pytest.mark.parametrize("all_reduce", ["nccl", "symm_mem"])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_tp2_with_graphs_matches_transformers_in_float32(
    checkpoints, reference_outputs, async_scheduling, all_reduce
):
    name = "qwen3_gqa4"
    prompts = random_prompts(LENGTHS, seed=20)
    outs = engine_outputs(
        checkpoints[name][0],
        prompts,
        16,
        dtype="float32",
        tensor_parallel_size=2,
        async_scheduling=async_scheduling,
        num_kv_blocks=40,
        all_reduce=all_reduce,
    )
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.token_ids == reference_outputs(name, prompt, 16), f"prompt length {len(prompt)}"
    assert sum(o.num_preemptions for o in outs) > 0


@pytest.mark.parametrize("eager", [GRAPHS_QUICK, True], ids=["graphs", "eager"])
@pytest.mark.parametrize("batching", ["mixed", "prefill_first"])
@pytest.mark.parametrize(
    "kwargs",
    [dict(), dict(max_num_batched_tokens=40), dict(num_kv_blocks=40)],
    ids=["plain", "chunked", "preemption"],
)
def test_staggered_arrivals_in_float32_match_transformers(
    checkpoints, reference_outputs, batching, eager, kwargs
):
    """Requests arrive while others decode, so mixed steps (in step graphs unless eager) occur."""
    name = "qwen3_gqa4"
    prompts = random_prompts(LENGTHS, seed=14)
    args = dict(
        kv_block_size=16,
        attention_backend="triton",
        max_model_len=1024,
        max_num_seqs=16,
        num_kv_blocks=512,
        max_num_batched_tokens=2048,
        dtype="float32",
        device="cuda",
        enforce_eager=eager,
        batching=batching,
    )
    args.update(kwargs)
    with LLM(checkpoints[name][0], **args) as llm:
        outputs, seen = staggered_run(llm, prompts, max_tokens=16)
        if not eager:
            assert llm.engine.executor.runner.step_graphs is not None
    for prompt, tokens in zip(prompts, outputs, strict=True):
        assert tokens == reference_outputs(name, prompt, 16), f"prompt length {len(prompt)}"
    assert ("mixed" in seen) == (batching == "mixed")
