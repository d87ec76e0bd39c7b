"""The sampler keeps exactly the right support, follows the softmax, and reproduces seeds."""

from __future__ import annotations

import pytest
import torch

from nanoexp import LLM, SamplingParams
from nanoexp.layers.sampler import Sampler, SamplingTensors, filter_logits

LOGITS = torch.log(torch.tensor([[0.05, 0.30, 0.10, 0.40, 0.15]]))  # sorted: 3, 1, 4, 2, 0


def support(top_k=5, top_p=1.0, min_p=0.0) -> set[int]:
    out = filter_logits(LOGITS.clone(), torch.tensor([top_k]), torch.tensor([top_p]), torch.tensor([min_p]))
    return set(torch.nonzero(torch.isfinite(out[0])).flatten().tolist())


@pytest.mark.parametrize(("k", "expected"), [(1, {3}), (2, {3, 1}), (4, {3, 1, 4, 2}), (5, {0, 1, 2, 3, 4})])
def test_top_k_support(k, expected):
    assert support(top_k=k) == expected


@pytest.mark.parametrize(
    ("p", "expected"),
    [
        (0.1, {3}),
        (0.4, {3}),
        (0.41, {3, 1}),
        (0.7, {3, 1}),
        (0.71, {3, 1, 4}),
        (0.95, {3, 1, 4, 2}),
        (0.951, {0, 1, 2, 3, 4}),
    ],
)
def test_top_p_support(p, expected):
    assert support(top_p=p) == expected


@pytest.mark.parametrize(
    ("m", "expected"),
    [(0.1, {0, 1, 2, 3, 4}), (0.2, {1, 2, 3, 4}), (0.3, {1, 3, 4}), (0.5, {1, 3}), (0.8, {3})],
)
def test_min_p_support(m, expected):
    assert support(min_p=m) == expected


def test_top_p_applies_after_top_k():
    # top-2 renormalizes to 3: 4/7, 1: 3/7, so p=0.6 needs both
    assert support(top_k=2, top_p=0.6) == {3, 1}
    assert support(top_k=2, top_p=0.5) == {3}


def rows(n, temperature=1.0, top_k=-1, top_p=1.0, min_p=0.0, seeds=None) -> SamplingTensors:
    vocab = LOGITS.shape[1]
    return SamplingTensors(
        temperatures=torch.full((n,), temperature),
        top_k=torch.full((n,), top_k if top_k > 0 else vocab),
        top_p=torch.full((n,), top_p),
        min_p=torch.full((n,), min_p),
        seeds=seeds or [None] * n,
        all_greedy=temperature == 0,
        needs_filter=top_k > 0 or top_p < 1 or min_p > 0,
    )


def test_temperature_sampling_follows_softmax():
    torch.manual_seed(0)
    n, temperature = 40000, 0.7
    tokens = Sampler()(LOGITS.expand(n, -1), rows(n, temperature))
    freq = torch.bincount(tokens, minlength=5).float() / n
    expected = torch.softmax(LOGITS[0] / temperature, dim=-1)
    assert torch.allclose(freq, expected, atol=0.01), (freq, expected)


def test_filtered_sampling_stays_in_support_and_renormalizes():
    torch.manual_seed(1)
    n = 20000
    tokens = Sampler()(LOGITS.expand(n, -1), rows(n, top_p=0.71))
    freq = torch.bincount(tokens, minlength=5).float() / n
    assert freq[0] == 0 and freq[2] == 0
    assert torch.allclose(freq[[3, 1, 4]], torch.tensor([0.40, 0.30, 0.15]) / 0.85, atol=0.015)


def test_greedy_rows_take_the_argmax_in_a_mixed_batch():
    st = rows(4, temperature=1.0)
    st.temperatures[1] = 0.0
    for _ in range(20):
        assert Sampler()(LOGITS.expand(4, -1), st)[1] == 3


def test_seeded_rows_reproduce_independently_of_the_batch():
    logits = torch.randn(1, 1000)
    a = Sampler()(logits.expand(3, -1), rows(3, seeds=[None, 7, None]))[1]
    b = Sampler()(logits.expand(1, -1), rows(1, seeds=[7]))[0]
    assert a == b


def test_engine_seeds_reproduce_and_differ(checkpoints):
    path = checkpoints["qwen3_gqa1"][0]
    prompts = [[5, 6, 7], [8, 9]]
    with LLM(path, kv_block_size=16) as llm:

        def run(seed):
            params = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=16, seed=seed, ignore_eos=True)
            return [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]

        first, second, other = run(123), run(123), run(124)
        alone = llm.generate(
            prompts[:1],
            SamplingParams(temperature=1.0, top_p=0.9, max_tokens=16, seed=123, ignore_eos=True),
            use_tqdm=False,
        )[0].token_ids
    assert first == second
    assert first != other
    assert alone == first[0]
