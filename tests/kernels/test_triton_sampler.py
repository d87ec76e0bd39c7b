"""The one-pass Triton sampler: exact argmax for greedy rows, the softmax distribution for the
rest, and seeds that do not depend on the batch. On CPU it runs in the Triton interpreter (small
row counts: each program is interpreted); the `gpu` test draws many rows at the real vocab size."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from nanoexp.kernels import triton_sampler  # noqa: E402  (conftest turned the CPU interpreter on)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")

PROBS = torch.tensor([0.05, 0.30, 0.10, 0.40, 0.15])


def sample(logits: torch.Tensor, temperatures, seeds) -> torch.Tensor:
    return triton_sampler.sample(
        logits.to(DEVICE),
        torch.as_tensor(temperatures, dtype=torch.float32, device=DEVICE),
        torch.as_tensor(seeds, dtype=torch.int64, device=DEVICE),
    ).cpu()


def fresh_seeds(n: int, generator_seed: int) -> torch.Tensor:
    return torch.randint(0, 2**62, (n,), generator=torch.Generator().manual_seed(generator_seed))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_greedy_rows_equal_torch_argmax_with_ties_across_slices(dtype):
    torch.manual_seed(0)
    logits = torch.randn(4, 5000).to(dtype)
    logits[1, [17, 2100, 4999]] = 9.0  # tie across three slices: the lowest index wins
    logits[2, [4000, 4001]] = 9.0
    tokens = sample(logits, [0.0] * 4, [1, 2, 3, 4])
    assert tokens.tolist() == logits.float().argmax(dim=-1).tolist()
    assert tokens[1] == 17 and tokens[2] == 4000


@pytest.mark.slow
def test_temperature_rows_follow_the_softmax():
    n, temperature = 1200, 0.5
    logits = torch.log(PROBS).expand(n, -1)
    tokens = sample(logits, [temperature] * n, fresh_seeds(n, 0))
    freq = torch.bincount(tokens, minlength=5).float() / n
    expected = torch.softmax(torch.log(PROBS) / temperature, dim=-1)
    assert torch.allclose(freq, expected, atol=0.045), (freq, expected)
    assert (freq - torch.softmax(torch.log(PROBS), dim=-1)).abs().max() > 0.1  # temperature mattered


def test_mixed_batch_keeps_greedy_rows_exact():
    torch.manual_seed(1)
    logits = torch.randn(6, 3000)
    temperatures = [0.0, 1.0, 0.0, 2.0, 1.0, 0.0]
    tokens = sample(logits, temperatures, [5, 6, 7, 8, 9, 10])
    greedy = logits.argmax(dim=-1)
    for row, t in enumerate(temperatures):
        if t == 0:
            assert tokens[row] == greedy[row]


def test_seeded_rows_do_not_depend_on_the_batch():
    torch.manual_seed(2)
    row = torch.randn(1, 3000)
    others = torch.randn(3, 3000)
    alone = sample(row, [1.0], [1234])[0]
    batched = sample(torch.cat([others[:2], row, others[2:]]), [1.0, 0.0, 1.0, 0.7], [1, 2, 1234, 3])[2]
    assert alone == batched
    draws = {int(sample(row, [1.0], [seed])[0]) for seed in range(12)}
    assert len(draws) > 3  # flat-ish logits over 3000 tokens: different seeds, different draws


def test_empty_batch():
    assert sample(torch.zeros(0, 10), [], []).shape == (0,)


@pytest.mark.gpu
def test_real_vocab_distribution_on_gpu():
    n, vocab, temperature = 200_000, 151_936, 0.6
    logits = torch.full((vocab,), -30.0)
    logits[[3, 70_000, 151_935]] = torch.log(torch.tensor([0.2, 0.5, 0.3]))
    tokens = sample(logits.to(torch.bfloat16).expand(n, -1), [temperature] * n, fresh_seeds(n, 3))
    picked = torch.stack([(tokens == i).float().mean() for i in (3, 70_000, 151_935)])
    expected = torch.softmax(torch.log(torch.tensor([0.2, 0.5, 0.3])) / temperature, dim=-1)
    assert torch.allclose(picked, expected, atol=0.005), (picked, expected)


@pytest.mark.slow  # sharded sampling in the quick loop: tests/layers/test_sampler_non_finite.py
@pytest.mark.parametrize("cuts", [[2500], [1000, 3001, 4200]])
def test_shard_winners_pick_what_the_whole_vocabulary_scan_draws(cuts):
    """Each tensor-parallel rank scans its vocabulary shard; the best of the shards' winners is the
    whole-vocabulary draw (same noise per token id), ties to the lowest id, greedy rows included."""
    from nanoexp.layers.sampler import pick_shard_winner

    torch.manual_seed(3)
    logits = torch.randn(6, 5000)
    logits[0, [900, 4100]] = 9.0  # a greedy tie across shards
    temperatures = torch.tensor([0.0, 0.0, 0.7, 1.0, 1.3, 0.5])
    seeds = torch.tensor([1, 2, 3, 4, 5, 6])
    want = sample(logits, temperatures, seeds)
    bounds = [0, *cuts, logits.shape[1]]
    scores = [torch.empty(len(logits), device=DEVICE) for _ in bounds[1:]]
    tokens = [  # each shard's winner: its token id, and its score into `values`
        triton_sampler.sample(
            logits[:, lo:hi].to(DEVICE), temperatures.to(DEVICE), seeds.to(DEVICE), lo, values
        )
        for lo, hi, values in zip(bounds, bounds[1:], scores, strict=False)
    ]
    got = pick_shard_winner(torch.stack(scores), torch.stack(tokens)).cpu()
    assert got.tolist() == want.tolist()
    assert got[0] == 900


def test_token_4g_plus_j_takes_philox_output_j_of_counter_g():
    """The noise-to-token mapping seeded draws depend on: one Philox call per four token ids."""
    import triton
    import triton.language as tl

    @triton.jit
    def uniforms_and_reference(out_ptr, ref_ptr, seed):
        tl.store(out_ptr + tl.arange(0, 16), triton_sampler._uniforms(seed, 5, 16))
        r0, r1, r2, r3 = tl.randint4x(seed, 5 + tl.arange(0, 4))
        groups = tl.arange(0, 4) * 4
        tl.store(ref_ptr + groups, tl.random.uint_to_uniform_float(r0))
        tl.store(ref_ptr + groups + 1, tl.random.uint_to_uniform_float(r1))
        tl.store(ref_ptr + groups + 2, tl.random.uint_to_uniform_float(r2))
        tl.store(ref_ptr + groups + 3, tl.random.uint_to_uniform_float(r3))

    out, ref = torch.zeros(16, device=DEVICE), torch.ones(16, device=DEVICE)
    uniforms_and_reference[(1,)](out, ref, 1234)
    assert torch.equal(out, ref)
