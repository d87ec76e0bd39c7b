"""The GPU's MoE path through the engine on CPU (the Triton interpreter), float32: decode steps of up to
DECODE_MAX_TOKENS tokens take the decode path (kernels/triton_moe_decode.py: no grouping, the top-k sum
fused), prefills the grouped GEMMs, and greedy tokens equal transformers' on shapes of top-2 and top-4
(unrenormalized) routing."""

from __future__ import annotations

import pytest
from checkpoints import random_prompts
from moe_checkpoints import moe_config, recording_decode_calls

from nanoexp import LLM, SamplingParams
from nanoexp.kernels.triton_moe_decode import DECODE_MAX_TOKENS


@pytest.fixture
def decode_calls(monkeypatch) -> list[int]:
    return recording_decode_calls(monkeypatch)


@pytest.mark.parametrize("name", ["moe_e8_top2", "moe_e16_top4_unnormed"])
def test_decode_steps_take_the_decode_path_and_match_transformers(moe_checkpoints, decode_calls, name):
    prompts = random_prompts([3, 17, 40], seed=8)
    with LLM(moe_checkpoints[name][0], device="cpu", dtype="float32", kv_block_size=16) as llm:
        assert llm.stats()["moe_kernel"] == "triton: grouping in one kernel (self-checked)"
        params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
        outs = llm.generate(prompts, params, use_tqdm=False)
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.token_ids == moe_checkpoints.reference(name, prompt, 5), f"prompt length {len(prompt)}"
    # 4 decode steps of the 3 sequences in each MoE layer (every layer of these shapes); the prefill grouped
    assert 3 <= DECODE_MAX_TOKENS
    assert decode_calls == [3] * 4 * moe_config(name).num_hidden_layers
