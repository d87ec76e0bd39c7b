"""A row whose logits hold NaN or +inf (or only -inf) samples NON_FINITE on every sampling path (torch
greedy, temperature, filtered, seeded; the one-pass Triton kernel; TP shard winners), and the rows beside
it sample as before: the flag rides back with the sampled ids."""

from __future__ import annotations

import pytest
import torch

from nanoexp.layers.sampler import NON_FINITE, Sampler, SamplingTensors, pick_shard_winner

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
BAD = {"nan": float("nan"), "inf": float("inf")}
VOCAB = 300


def rows(temperatures, top_k=-1, seeds=None) -> SamplingTensors:
    n = len(temperatures)
    return SamplingTensors(
        temperatures=torch.tensor(temperatures, dtype=torch.float32),
        top_k=torch.full((n,), top_k if top_k > 0 else VOCAB),
        top_p=torch.ones(n),
        min_p=torch.zeros(n),
        seeds=seeds or [None] * n,
        all_greedy=all(t == 0 for t in temperatures),
        needs_filter=top_k > 0,
    )


def spoiled(kind: str, n: int = 3, row: int = 1) -> torch.Tensor:
    torch.manual_seed(0)
    logits = torch.randn(n, VOCAB)
    logits[0, 7] = 50.0  # row 0 has a clear winner whatever the path
    if kind == "all -inf":
        logits[row] = -float("inf")
    else:
        logits[row, 123] = BAD[kind]
    return logits


@pytest.mark.parametrize("kind", ["nan", "inf", "all -inf"])
@pytest.mark.parametrize(
    "params",
    [
        rows([0.0, 0.0, 0.0]),  # all greedy
        rows([0.0, 0.8, 1.0]),  # temperature, unseeded
        rows([0.0, 0.8, 1.0], top_k=5),  # filtered
        rows([0.0, 0.8, 1.0], seeds=[1, 2, 3]),  # seeded
        rows([0.0, 0.0, 1.0]),  # the bad row greedy inside a sampled batch
    ],
    ids=["greedy", "temperature", "top_k", "seeded", "mixed"],
)
def test_torch_paths_flag_the_bad_row_only(kind: str, params: SamplingTensors) -> None:
    tokens = Sampler()(spoiled(kind), params).tolist()
    assert tokens[1] == NON_FINITE
    assert tokens[0] == 7 and 0 <= tokens[2] < VOCAB


def test_a_single_minus_inf_logit_is_a_masked_token_not_an_error() -> None:
    logits = spoiled("inf")
    logits[1, 123] = -float("inf")
    assert NON_FINITE not in Sampler()(logits, rows([0.0, 0.8, 0.0])).tolist()


@pytest.mark.parametrize("kind", ["nan", "inf"])
def test_a_greedy_shard_with_nan_wins_the_ranks_comparison(kind: str) -> None:
    logits = spoiled(kind)
    sampler, params = Sampler(), rows([0.0, 0.0, 0.0])
    shards = [sampler.shard_winners(logits[:, lo:hi], params, lo) for lo, hi in ((0, 100), (100, VOCAB))]
    scores, tokens = torch.stack([s for s, _ in shards]), torch.stack([t for _, t in shards])
    assert pick_shard_winner(scores, tokens).tolist() == [7, NON_FINITE, int(logits[2].argmax())]


triton = pytest.importorskip("triton")


@pytest.mark.parametrize("kind", ["nan", "inf", "all -inf"])
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_the_one_pass_kernel_flags_the_bad_row_and_its_shard_score(kind: str, temperature: float) -> None:
    from nanoexp.kernels import triton_sampler

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    logits = spoiled(kind).to(device)
    temperatures = torch.tensor([0.0, temperature, 0.0], device=device)
    seeds = torch.tensor([1, 2, 3], device=device)
    assert triton_sampler.sample(logits, temperatures, seeds).tolist()[:2] == [7, NON_FINITE]
    # under TP: a shard that holds the bad value wins the comparison with +inf, so its flag does
    scores = [torch.empty(3, device=device) for _ in range(2)]
    tokens = [
        triton_sampler.sample(logits[:, lo:hi].contiguous(), temperatures, seeds, lo, values)
        for (lo, hi), values in zip(((0, 200), (200, VOCAB)), scores)
    ]
    assert pick_shard_winner(torch.stack(scores), torch.stack(tokens)).tolist()[:2] == [7, NON_FINITE]
