"""Multi-turn chat sessions, closed loop per session: turn k's prompt is the whole conversation so far (the
previous turn's prompt and answer) plus a new user message, and it arrives when the previous answer is
complete plus an exponential think time. Sessions start at `request_rate` (gamma/Poisson, or a ramp).
Also the per-turn metrics: TTFT by turn index and the share of each turn's prompt served from the cache."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from nanoexp.config import SamplingParams
from nanoexp.engine.outputs import RequestOutput
from nanoexp.experiment.measure.workloads import (
    TOKEN_ID_HIGH,
    Request,
    Workload,
    arrival_offsets,
    offered_rates,
)
from nanoexp.experiment.schema import WorkloadConfig, length_range

Params = Callable[[int, int], SamplingParams]  # (max_tokens, request index) -> its sampling params


class Conversations:
    """Every session's user messages, answer lengths and think times, drawn up front from the seed, so a
    session's turns do not depend on when the engine finishes the others."""

    def __init__(self, w: WorkloadConfig, params: Params, vocab: int):
        rng, high = np.random.default_rng(w.seed), min(vocab, TOKEN_ID_HIGH)
        shape = (w.num_sessions, w.num_turns)
        in_low, in_high = length_range(w.input_len, w.range_ratio)
        out_low, out_high = length_range(w.output_len, w.range_ratio)
        self.prefix = rng.integers(
            0, high, size=w.prefix_len
        ).tolist()  # a system prompt every session shares
        in_lens, self.out_lens = (
            rng.integers(in_low, in_high + 1, size=shape),
            rng.integers(out_low, out_high + 1, size=shape),
        )
        self.messages = [[rng.integers(0, high, size=n).tolist() for n in row] for row in in_lens]
        self.think_s = rng.exponential(w.think_time_s, size=shape) if w.think_time_s > 0 else np.zeros(shape)
        self.params, self.num_turns = params, w.num_turns
        self.longest = w.prefix_len + w.num_turns * (in_high + out_high)

    def request(self, session: int, turn: int, history: list[int], offset: float) -> Request:
        """Turn `turn` (from 1) of `session`: the history, then its user message."""
        prompt = history + self.messages[session][turn - 1]
        max_tokens = int(self.out_lens[session][turn - 1])
        params = self.params(max_tokens, session * self.num_turns + turn - 1)
        return Request(prompt, params, offset, session=session, turn=turn)

    def follow_up(self, done: Request, output: RequestOutput, finished_s: float) -> Request | None:
        """The session's next turn: its conversation so far, due one think time after this answer."""
        assert done.session is not None and done.turn is not None  # every request here is a session's turn
        if done.turn >= self.num_turns:
            return None
        history = list(done.prompt_token_ids) + list(output.token_ids)
        think = float(self.think_s[done.session][done.turn - 1])
        return self.request(done.session, done.turn + 1, history, finished_s + think)


def multi_turn_workload(w: WorkloadConfig, params: Params, vocab: int) -> Workload:
    talks = Conversations(w, params, vocab)
    rates = offered_rates(w.num_sessions, w.request_rate, w.ramp, w.ramp_end_rate)
    starts = arrival_offsets(w.num_sessions, w.request_rate, w.burstiness, w.seed, rates)
    first = [talks.request(s, 1, list(talks.prefix), start) for s, start in enumerate(starts)]
    total = w.num_sessions * w.num_turns
    return Workload(
        w.name, first, follow_up=talks.follow_up, num_total=total, longest=talks.longest, offered_rates=rates
    )


def turn_metrics(records: list) -> dict:
    """Per turn index k (every repeat's requests): `turn{k}_mean_ttft_ms`, `turn{k}_p99_ttft_ms` and
    `turn{k}_prefix_hit_rate` (prompt tokens served from the prefix cache / prompt tokens); with
    `followup_prefix_hit_rate` over turns 2 and later. {} for a workload without turns."""
    rows = [
        (r.requests[o.request_id].turn, o) for r in records for o in r.outputs if o.request_id in r.requests
    ]
    rows = [(turn, o) for turn, o in rows if turn is not None]
    out: dict = {}
    for turn in sorted({t for t, _ in rows}):
        outs = [o for t, o in rows if t == turn]
        ttft = np.array([o.ttft * 1e3 for o in outs])
        out |= {
            f"turn{turn}_mean_ttft_ms": float(ttft.mean()),
            f"turn{turn}_p99_ttft_ms": float(np.percentile(ttft, 99)),
        }
        out[f"turn{turn}_prefix_hit_rate"] = _hit_rate(outs)
    if rows:
        out["followup_prefix_hit_rate"] = _hit_rate([o for t, o in rows if t > 1])
    return out


def _hit_rate(outputs: list[RequestOutput]) -> float:
    prompt = sum(len(o.prompt_token_ids) for o in outputs)
    return sum(o.num_cached_tokens for o in outputs) / prompt if prompt else 0.0
