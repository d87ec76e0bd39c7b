"""Batched sampling on the device: greedy, temperature, top-k, top-p, min-p, per-request seeds."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from nanoexp.layers.compiled import compilable

NON_FINITE = -1  # the token id a row gets when its logits hold NaN or +inf (or are all -inf)


@dataclass
class SamplingTensors:
    """One row per sequence that samples this step."""

    temperatures: Tensor  # float32 [n]; 0 = greedy
    # the filters, None unless some row uses one (needs_filter)
    top_k: Tensor | None  # int64 [n]; vocab size when off
    top_p: Tensor | None  # float32 [n]
    min_p: Tensor | None  # float32 [n]
    seeds: list[int | None]  # per-row seed mixed with the row's output position, or None
    all_greedy: bool
    needs_filter: bool  # some row uses top-k, top-p or min-p
    row_seeds: Tensor | None = None  # int64 [n]: the seed, or a fresh random one (one-pass kernel)


class Sampler(nn.Module):
    """`one_pass=True` (CUDA with Triton) samples unfiltered rows with the one-pass Gumbel kernel;
    filtered rows, and every row on the CPU, take the torch path. Under TP a step that is all
    greedy or all one-pass is drawn from each rank's vocabulary shard (`shard_winners`) and the
    ranks' winners compared (`pick_shard_winner`): no rank gathers the full logits.

    A row whose logits hold NaN or +inf (or only -inf) samples NON_FINITE instead of a token: every path
    reads that off the reduction it already makes (the row's largest logit or winning score), so the
    flag comes back with the sampled ids, without a host sync of its own."""

    def __init__(self, one_pass: bool = False) -> None:
        super().__init__()
        self.one_pass = one_pass
        if one_pass:
            from nanoexp.kernels.triton_sampler import sample

            self.one_pass_sample = sample

    def draws_in_one_pass(self, st: SamplingTensors) -> bool:
        """Whether the one-pass kernel draws every row: it applies no filter and needs every row's seed."""
        return self.one_pass and not st.needs_filter and st.row_seeds is not None

    def can_shard(self, st: SamplingTensors) -> bool:
        return st.all_greedy or self.draws_in_one_pass(st)

    def shard_winners(self, logits, st: SamplingTensors, vocab_offset: int) -> tuple[Tensor, Tensor]:
        """Per row of this shard's logits: the winner's score (float32) and its token id."""
        if st.all_greedy:  # a NaN row's NaN score wins the ranks' comparison, so its flag does too
            values, index = logits.max(dim=-1)
            return values.float(), flag_non_finite(values, index + vocab_offset)
        assert st.row_seeds is not None  # can_shard(st) holds
        scores = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
        return scores, self.one_pass_sample(logits, st.temperatures, st.row_seeds, vocab_offset, scores)

    def forward(self, logits: Tensor, st: SamplingTensors) -> Tensor:
        if st.all_greedy:
            values, tokens = logits.max(dim=-1)  # the index as argmax's; the value says whether it is finite
            return flag_non_finite(values, tokens)
        if self.draws_in_one_pass(st):
            assert st.row_seeds is not None
            return self.one_pass_sample(logits, st.temperatures, st.row_seeds)
        values, greedy_tokens = logits.max(dim=-1)
        if not st.needs_filter and all(seed is None for seed in st.seeds):
            sampled = sample_with_temperature(logits, st.temperatures)
        else:
            logits = logits.float() / st.temperatures.clamp_min(1e-6).unsqueeze(1)
            if st.needs_filter:
                assert st.top_k is not None and st.top_p is not None and st.min_p is not None
                logits = filter_logits(logits, st.top_k, st.top_p, st.min_p)
            probs = torch.softmax(logits, dim=-1)
            sampled = (probs / exponential_noise(probs, st.seeds)).argmax(dim=-1)
        return flag_non_finite(values, torch.where(st.temperatures == 0, greedy_tokens, sampled))


def pick_shard_winner(scores: Tensor, tokens: Tensor) -> Tensor:
    """The token per row from every shard's winner ([shards, rows] each, shards in vocabulary
    order): the best score, ties to the first shard, i.e. the lowest token id, as argmax does."""
    best = scores.argmax(dim=0, keepdim=True)
    return tokens.gather(0, best).squeeze(0)


@compilable
def flag_non_finite(row_max: Tensor, tokens: Tensor) -> Tensor:
    """`tokens`, with NON_FINITE where the row's largest logit is NaN or inf (max propagates NaN);
    compiled, one small kernel."""
    return torch.where(row_max.isfinite(), tokens, NON_FINITE)


@compilable
def sample_with_temperature(logits: Tensor, temperatures: Tensor) -> Tensor:
    """One categorical draw per row from softmax(logits / temperature): argmax(probs / Exp(1))."""
    probs = torch.softmax(logits.float() / temperatures.clamp_min(1e-6).unsqueeze(1), dim=-1)
    noise = -torch.log1p(-torch.rand_like(probs))  # Exp(1)
    return (probs / noise.clamp_min(1e-20)).argmax(dim=-1)


def filter_logits(logits: Tensor, top_k: Tensor, top_p: Tensor, min_p: Tensor) -> Tensor:
    """Masks to -inf every token outside the top-k, then the top-p nucleus, then min-p."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    rank = torch.arange(logits.shape[-1], device=logits.device).unsqueeze(0)
    sorted_logits = sorted_logits.masked_fill(rank >= top_k.unsqueeze(1), float("-inf"))
    probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    outside = (mass_before >= top_p.unsqueeze(1)) & (rank > 0)
    outside |= probs < min_p.unsqueeze(1) * probs[:, :1]
    sorted_logits = sorted_logits.masked_fill(outside, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter_(1, order, sorted_logits)


def exponential_noise(probs: Tensor, seeds: list[int | None]) -> Tensor:
    """Exp(1) noise; argmax(probs / noise) is a sample from probs. Seeded rows draw from their own
    generator so their tokens do not depend on the rest of the batch."""
    noise = torch.empty_like(probs).exponential_()
    for row, seed in enumerate(seeds):
        if seed is not None:
            gen = torch.Generator(device=probs.device).manual_seed(seed)
            noise[row] = torch.empty_like(probs[row]).exponential_(generator=gen)
    return noise.clamp_min_(1e-20)
