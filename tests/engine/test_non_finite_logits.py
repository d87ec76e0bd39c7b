"""NaN logits at run time end that request with finish_reason "error", naming the step and output token;
the other requests go on to the same tokens as without it, and no block leaks or stays in the prefix cache."""

from __future__ import annotations

import pytest
import torch

from nanoexp import LLM, SamplingParams
from nanoexp.engine.sequence import Sequence

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


def poison_embedding(llm: LLM, token: int) -> None:
    """Every step that feeds `token` gets NaN hidden states, so NaN logits in that row."""
    weight = llm.engine.executor.runner.model.model.embed_tokens.weight
    with torch.no_grad():
        weight[token] = float("nan")


@pytest.mark.parametrize("async_scheduling", [True, False])
@pytest.mark.parametrize("batching", ["prefill_first", "mixed"])
def test_nan_logits_end_one_request_and_the_others_go_on(checkpoints, async_scheduling, batching) -> None:
    path = checkpoints["qwen3_gqa1"][0]
    kwargs = dict(kv_block_size=16, async_scheduling=async_scheduling, batching=batching)
    prompts = [[5, 6, 7, 8] * 5, [9, 10, 11] * 6, [12, 13] * 9]
    with LLM(path, **kwargs) as llm:
        clean = [o.token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]
        mid = clean[1][2]  # the 3rd token request 1 generates: fed back at its 4th output token's step
        keep = [i for i in (0, 2) if mid not in clean[i] and mid not in prompts[i]]
        assert keep, "pick prompts whose outputs avoid the poisoned token"
        poison_embedding(llm, mid)
        outs = llm.generate(prompts, GREEDY, use_tqdm=False)
        assert outs[1].finish_reason == "error" and outs[1].token_ids == clean[1][:3]
        assert "non-finite logits" in outs[1].error and "output token 4" in outs[1].error
        assert "engine step" in outs[1].error
        for i in keep:
            assert outs[i].finish_reason == "length" and outs[i].token_ids == clean[i]
        manager = llm.engine.block_manager
        assert manager.num_used == 0 and not llm.engine.has_unfinished()


def test_a_prompt_that_yields_nan_fails_at_its_first_token_and_leaves_no_cached_blocks(checkpoints) -> None:
    path = checkpoints["qwen3_gqa1"][0]
    with LLM(path, kv_block_size=16, enable_prefix_caching=True) as llm:
        poison_embedding(llm, 300)
        bad = [300] + list(range(20, 60))  # two full blocks after the NaN
        outs = llm.generate([bad, list(range(100, 140))], GREEDY, use_tqdm=False)
        assert outs[0].finish_reason == "error" and outs[0].token_ids == []
        assert "output token 1" in outs[0].error and outs[0].first_token_time == outs[0].finish_time
        assert outs[1].finish_reason == "length" and len(outs[1].token_ids) == 8
        manager = llm.engine.block_manager
        assert manager.cached_prefix(Sequence(99, bad, GREEDY)) == []  # its blocks are not reused
