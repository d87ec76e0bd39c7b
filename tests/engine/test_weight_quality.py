"""Scoring one model's next-token distributions against another's on the same tokens: A/A is exact,
fp8 weights against their bf16 source show their (known, nonzero) cost."""

from __future__ import annotations

import numpy as np
import pytest
from fp8_checkpoints import build_fp8_checkpoint

from nanoexp.engine.llm import LLM
from nanoexp.engine.weight_quality import compare

BASE = dict(device="cpu", dtype="float32", kv_block_size=4, max_num_batched_tokens=64)
PROMPTS = [[5, 17, 42, 8, 99, 23], [61, 7, 13], [77, 31, 2, 9, 11, 40, 41, 42, 1]]


@pytest.fixture(scope="module")
def bf16_checkpoint(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("wq")
    build_fp8_checkpoint(root / "fp8", layers=1, bf16_path=root / "bf16")
    return str(root / "bf16")


def test_a_model_against_itself_scores_exactly(bf16_checkpoint):
    with LLM(bf16_checkpoint, **BASE) as llm:
        continuations, decoded = llm.greedy_log_probs(PROMPTS, 6)
        prefilled = llm.prefill_log_probs(PROMPTS, continuations)
        assert llm.engine.block_manager.num_used == 0
    assert decoded.shape == prefilled.shape == (3, 6, 160)
    assert [c[0] for c in continuations] == list(decoded[:, 0].argmax(-1))
    scores = compare(prefilled, decoded)
    assert scores["greedy_agreement"] == 1.0 and scores["kl_max"] < 1e-6
    assert scores["num_positions"] == 18 and scores["num_requests"] == 3


def test_fp8_weights_against_bf16_show_their_cost(bf16_checkpoint):
    with LLM(bf16_checkpoint, quantization="fp8", **BASE) as fp8:
        continuations, decoded = fp8.greedy_log_probs(PROMPTS, 6)
    with LLM(bf16_checkpoint, **BASE) as bf16:
        reference = bf16.prefill_log_probs(PROMPTS, continuations)
    scores = compare(reference, decoded)
    assert 1e-6 < scores["kl_mean"] < 0.5 and scores["greedy_agreement"] > 0.5
    assert np.isfinite(decoded).all()


def test_bad_continuations_are_one_line_errors(bf16_checkpoint):
    with LLM(bf16_checkpoint, **BASE) as llm:
        with pytest.raises(ValueError, match="one non-empty continuation per prompt, all of one length"):
            llm.prefill_log_probs(PROMPTS[:2], [[1, 2], [3]])
        with pytest.raises(ValueError, match="prompt 1: token id 999 is outside the vocabulary"):
            llm.prefill_log_probs(PROMPTS[:2], [[1], [999]])
