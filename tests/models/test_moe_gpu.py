"""Qwen3-MoE on a CUDA device (the fused Triton experts, CUDA graphs on and off) against transformers:
float32 token for token, bfloat16 within the tie tolerance (tests/helpers.py)."""

from __future__ import annotations

import pytest
import torch
from checkpoints import random_prompts
from helpers import assert_follows_transformers, staggered_run
from moe_checkpoints import MOE_SHAPES

from nanoexp import LLM, SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

LENGTHS = [1, 2, 15, 16, 17, 63, 129, 300]
PATHS = {
    "prefix_cache": dict(enable_prefix_caching=True),
    "chunked": dict(max_num_batched_tokens=48),
    "preemption": dict(num_kv_blocks=40),
    "block1": dict(kv_block_size=1, num_kv_blocks=4000),
    "block256": dict(kv_block_size=256),
    "prefill_first": dict(batching="prefill_first"),
}
ENGINE = dict(
    device="cuda",
    kv_block_size=16,
    max_model_len=1024,
    max_num_seqs=16,
    num_kv_blocks=512,
    max_num_batched_tokens=512,  # fewer step graphs to capture
)


def prompts_with_shared_prefix() -> list[list[int]]:
    shared = random_prompts([32], seed=11)[0]
    return random_prompts(LENGTHS, seed=12) + [shared + [7], shared + [8, 9]]


def generate(path: str, prompts, max_tokens: int, **kwargs):
    with LLM(path, **(ENGINE | kwargs)) as llm:
        assert llm.stats()["moe_kernel"] == "triton: grouping in one kernel (self-checked)"
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        return llm.generate(prompts, params, use_tqdm=False)


GRAPHS_QUICK = pytest.param(False, marks=pytest.mark.gpu_quick, id="graphs")  # graphs on: in the quick subset
QUICK_PATHS = ("prefix_cache", "chunked", "preemption", "prefill_first")


@pytest.mark.parametrize("eager", [GRAPHS_QUICK, pytest.param(True, id="eager")])
@pytest.mark.parametrize("name", list(MOE_SHAPES))
def test_float32_greedy_matches_transformers(moe_checkpoints, name, eager):
    prompts = prompts_with_shared_prefix()
    outs = generate(moe_checkpoints[name][0], prompts, 12, dtype="float32", enforce_eager=eager)
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.token_ids == moe_checkpoints.reference(name, prompt, 12), f"prompt length {len(prompt)}"


@pytest.mark.parametrize(
    "path_name,eager",
    [
        pytest.param(p, eager, marks=[pytest.mark.gpu_quick] if p in QUICK_PATHS and not eager else [])
        for p in PATHS
        for eager in (False, True)
    ],
)
def test_float32_every_engine_path(moe_checkpoints, path_name, eager):
    name = "moe_e8_top2"
    prompts = prompts_with_shared_prefix()
    kwargs = dict(dtype="float32", enforce_eager=eager) | PATHS[path_name]
    outs = generate(moe_checkpoints[name][0], prompts, 12, **kwargs)
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.token_ids == moe_checkpoints.reference(name, prompt, 12), f"prompt length {len(prompt)}"


@pytest.mark.parametrize("batching", [pytest.param("mixed", marks=pytest.mark.gpu_quick), "prefill_first"])
def test_float32_staggered_arrivals(moe_checkpoints, batching):
    name = "moe_e16_top4_unnormed"
    prompts = prompts_with_shared_prefix()
    with LLM(moe_checkpoints[name][0], **(ENGINE | dict(dtype="float32", batching=batching))) as llm:
        outputs, seen = staggered_run(llm, prompts, max_tokens=8)
    for prompt, tokens in zip(prompts, outputs, strict=True):
        assert tokens == moe_checkpoints.reference(name, prompt, 8), f"prompt length {len(prompt)}"
    assert (seen["mixed"] > 0) == (batching == "mixed")


@pytest.mark.parametrize("eager", [GRAPHS_QUICK, pytest.param(True, id="eager")])
@pytest.mark.parametrize("name", list(MOE_SHAPES))
def test_bfloat16_follows_transformers(moe_checkpoints, name, eager):
    prompts = random_prompts(LENGTHS, seed=13)
    outs = generate(moe_checkpoints[name][0], prompts, 12, dtype="bfloat16", enforce_eager=eager)
    assert_follows_transformers(moe_checkpoints[name][1], prompts, outs)


@pytest.mark.gpu_quick
def test_expert_load_counts_only_real_tokens_under_graphs(moe_checkpoints):
    """A 3-sequence decode runs in the 4-row graph: the padding row is routed but not counted."""
    name = "moe_e8_top2"
    with LLM(moe_checkpoints[name][0], **(ENGINE | dict(dtype="float32"))) as llm:
        engine = llm.engine
        for prompt in random_prompts([5, 9, 13], seed=14):
            engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
        steps = []
        while engine.has_unfinished():
            steps.append(engine.step()[1])
    for stats in steps:
        top_k = MOE_SHAPES[name]["num_experts_per_tok"]
        assert (stats.expert_load.sum(axis=1) == stats.num_tokens * top_k).all(), stats
