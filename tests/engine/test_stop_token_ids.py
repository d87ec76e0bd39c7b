"""A stop token id outside the vocabulary could never be sampled, so never stop its request: it is
rejected as an out-of-vocabulary prompt id is, naming the request."""

from __future__ import annotations

import pytest

from nanoexp import LLM, SamplingParams


def test_a_stop_token_outside_the_vocabulary_is_rejected_like_a_prompt_id(checkpoints) -> None:
    with LLM(checkpoints["qwen3_gqa1"][0], kv_block_size=16) as llm:
        vocab = llm.engine.vocab_size
        with pytest.raises(ValueError, match=rf"prompt 1: token id {vocab} is outside the vocabulary"):
            llm.generate([[1, 2], [3, vocab]], use_tqdm=False)
        bad = SamplingParams(max_tokens=2, stop_token_ids=[5, vocab + 7])
        message = rf"prompt 0: SamplingParams.stop_token_ids holds {vocab + 7}, outside the vocabulary"
        with pytest.raises(ValueError, match=message):
            llm.generate([[1, 2]], bad, use_tqdm=False)
        with pytest.raises(ValueError, match=r"request \d+: SamplingParams.stop_token_ids holds"):
            llm.engine.add_request([1, 2], bad)
        assert not llm.engine.has_unfinished()  # nothing was queued
        ok = SamplingParams(max_tokens=2, stop_token_ids=[vocab - 1])
        assert llm.generate([[1, 2]], ok, use_tqdm=False)[0].token_ids
