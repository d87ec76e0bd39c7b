"""Metrics named as in vLLM's benchmarks, from finished requests and per-step statistics."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

import numpy as np

from nanoexp.config.checks import is_real
from nanoexp.engine.outputs import RequestOutput, StepStats
from nanoexp.experiment.metrics import registry

PERCENTILES = (90, 99)
LATENCY_PERCENTILES = registry.ITERATION_PERCENTILES
CONFIDENCE = 0.95
# Metrics that get a spread over repeats: `<key>_std`, `<key>_ci95_low`, `<key>_ci95_high`.
HEADLINE = tuple(registry.names(headline=True))
FRACTIONS = {"slo_attainment": 1.0}  # HEADLINE metrics bounded above (all are >= 0)
# rates over repeats: total amount over total time (the ratio of the means), not the mean of the ratios
POOLED_RATES = {
    "request_throughput": "completed",
    "output_throughput": "total_output_tokens",
    "total_token_throughput": ("total_input_tokens", "total_output_tokens"),
    "request_goodput": "good_requests",
}
RATES_OVER_REPEATS = "total over total time (mean amount / mean duration_s); per repeat in per_repeat"
PHASES = ("prefill", "decode", "mixed")  # a mixed step carries decodes and prefill chunks


def summarize(
    outputs: Sequence[RequestOutput], steps: Sequence[StepStats], duration_s: float, slo: dict | None = None
) -> dict[str, float]:
    """Throughput, latency distributions and step aggregates of one repeat; goodput against `slo` (ms)."""
    inputs = sum(len(o.prompt_token_ids) for o in outputs)
    generated = sum(len(o.token_ids) for o in outputs)
    summary: dict[str, float] = {
        "completed": len(outputs),
        "total_input_tokens": inputs,
        "total_output_tokens": generated,
        "duration_s": duration_s,
        "request_throughput": _rate(len(outputs), duration_s),
        "output_throughput": _rate(generated, duration_s),
        "total_token_throughput": _rate(inputs + generated, duration_s),
    }
    summary |= distribution("ttft_ms", [o.ttft * 1e3 for o in outputs])
    summary |= distribution("tpot_ms", [o.tpot * 1e3 for o in outputs if len(o.token_ids) > 1])
    summary |= distribution("itl_ms", [x * 1e3 for o in outputs for x in o.inter_token_latencies])
    summary |= distribution("e2el_ms", [o.e2e_latency * 1e3 for o in outputs])
    summary["total_cached_tokens"] = sum(o.num_cached_tokens for o in outputs)
    summary["total_preempted_requests"] = sum(o.num_preemptions > 0 for o in outputs)
    if slo:
        good = sum(meets_slo(o, slo) for o in outputs)
        summary |= {"good_requests": good, "request_goodput": _rate(good, duration_s)}
        summary["slo_attainment"] = _rate(good, len(outputs))
    return summary | step_aggregates(steps)


def meets_slo(o: RequestOutput, slo: dict[str, float]) -> bool:
    """vLLM's goodput rule: every SLO that is set is met (value <= the SLO, in ms)."""
    return all(_latencies_ms(o)[k] <= limit for k, limit in slo.items())


def _latencies_ms(o: RequestOutput) -> dict[str, float]:
    return {"ttft_ms": o.ttft * 1e3, "tpot_ms": o.tpot * 1e3, "e2el_ms": o.e2e_latency * 1e3}


def aggregate_repeats(summaries: Sequence[dict]) -> dict:
    """Each numeric key's mean over the repeats, a rate as total over total time (POOLED_RATES); with two
    or more repeats, each HEADLINE key's spread too (over the repeats' own values: within-run noise)."""
    first, n = summaries[0], len(summaries)
    out: dict = {"repeats": n}
    for key in first:
        values: list[Any] = [s.get(key) for s in summaries]
        numeric = all(is_real(v) for v in values)
        out[key] = float(np.mean(values)) if numeric and len(set(values)) > 1 else first[key]
        if numeric and n > 1 and key in HEADLINE:
            out |= spread(key, values)
    if n > 1:
        out |= pooled_rates(summaries)
    return out


def pooled_rates(summaries: Sequence[dict]) -> dict:
    """Each rate of POOLED_RATES as the repeats' total amount over their total duration, so that rate,
    duration and tokens of a job agree; `rates_over_repeats` says so."""
    duration = sum(float(s.get("duration_s", 0.0)) for s in summaries)
    out = {}
    for rate, amounts in POOLED_RATES.items():
        keys = (amounts,) if isinstance(amounts, str) else amounts
        if all(k in s and is_real(s[k]) for s in summaries for k in keys) and rate in summaries[0]:
            out[rate] = _rate(sum(float(s[k]) for s in summaries for k in keys), duration)
    return out | {"rates_over_repeats": RATES_OVER_REPEATS} if out else {}


def spread(key: str, values: Sequence[float]) -> dict[str, float]:
    """`<key>_std` (ddof=1) and `<key>_ci95_low/high`: the mean's t-interval cut to the metric's range
    (>= 0, a fraction <= 1), which keeps its coverage: a latency's would reach below 0."""
    from scipy import stats as scipy_stats  # here: its import costs a job of one repeat ~1 s of CPU

    arr = np.asarray(values, dtype=float)
    mean, sem = float(arr.mean()), float(scipy_stats.sem(arr))
    half = float(scipy_stats.t.ppf((1 + CONFIDENCE) / 2, arr.size - 1)) * sem  # NaN with a NaN value
    low, high = max(mean - half, 0.0), min(mean + half, FRACTIONS.get(key, math.inf))
    return {f"{key}_std": float(arr.std(ddof=1)), f"{key}_ci95_low": low, f"{key}_ci95_high": high}


def distribution(
    name: str,
    values: Sequence[float],
    percentiles: Sequence[int] = PERCENTILES,
) -> dict[str, float]:
    """mean_/median_/std_/pNN_ keys for one latency series (NaN when empty)."""
    arr = np.asarray(values if len(values) else [math.nan], dtype=float)
    out = {f"mean_{name}": arr.mean(), f"median_{name}": np.median(arr), f"std_{name}": arr.std()}
    out |= {f"p{p}_{name}": np.percentile(arr, p) for p in percentiles}
    return {k: float(v) for k, v in out.items()}


def step_aggregates(steps: Sequence[StepStats]) -> dict[str, float]:
    """Per phase (prefill, decode, mixed: decodes and prefill chunks in one step) the steps, their time
    and tokens; decode_throughput and mean_decode_batch_size count pure decode steps only."""
    by_phase = {phase: [s for s in steps if s.phase == phase] for phase in PHASES}
    queries = sum(s.prefix_cache_queries for s in steps)
    peak_blocks = max((s.kv_blocks_used for s in steps), default=0)
    total_blocks = max((s.num_kv_blocks for s in steps), default=0)
    prefill, decode, mixed = (by_phase[p] for p in PHASES)
    out: dict[str, float] = {"num_steps": len(steps)}
    for phase, part in by_phase.items():
        out |= {f"num_{phase}_steps": len(part), f"{phase}_time_s": _time(part)}
        out[f"{phase}_tokens"] = sum(s.num_tokens for s in part)
    out["mixed_prefill_tokens"] = sum(s.num_prefill_tokens for s in mixed)
    out["mixed_decode_tokens"] = sum(s.num_decode_tokens for s in mixed)
    return out | {
        "mean_decode_batch_size": _rate(sum(s.num_seqs for s in decode), len(decode)),
        "prefill_throughput": _rate(sum(s.num_tokens for s in prefill), _time(prefill)),
        "decode_throughput": _rate(sum(s.num_output_tokens for s in decode), _time(decode)),
        "prefix_cache_hit_rate": _rate(sum(s.prefix_cache_hits for s in steps), queries),
        "num_preemptions": sum(s.num_preemptions for s in steps),
        "peak_kv_blocks_used": peak_blocks,
        "peak_kv_cache_usage": _rate(peak_blocks, total_blocks),
    }


def latency_summary(latencies_s: Sequence[float]) -> dict[str, float]:
    """Per-iteration latency of the latency workload, with the percentiles `vllm bench latency` reports."""
    latencies_ms = [t * 1e3 for t in latencies_s]
    return distribution("latency_ms", latencies_ms, LATENCY_PERCENTILES) | {"num_iters": len(latencies_ms)}


def request_rows(
    outputs: Sequence[RequestOutput], t0: float, repeat: int = 0, requests: dict | None = None
) -> list[dict]:
    """One row per finished request, times in ms (arrival relative to the workload start); with `requests`
    (request id -> the workload's Request), its origin and its session and turn where it has them."""
    rows = [
        {
            "repeat": repeat,
            "request_id": o.request_id,
            "arrival_ms": (o.arrival_time - t0) * 1e3,
            "prompt_len": len(o.prompt_token_ids),
            "output_len": len(o.token_ids),
            **_latencies_ms(o),
            "queue_ms": (o.first_scheduled_time - o.arrival_time) * 1e3,
            "num_cached_tokens": o.num_cached_tokens,
            "num_preemptions": o.num_preemptions,
            "finish_reason": o.finish_reason,
        }
        for o in outputs
    ]
    tags = request_tags(requests or {})
    return [row | tags(row["request_id"]) for row in rows]


def request_tags(requests: dict):
    """request id -> its origin, session and turn columns (for the workloads that set them)."""
    with_origin = any(r.origin for r in requests.values())
    with_session = any(r.session is not None for r in requests.values())

    def tags(request_id: int) -> dict:
        r = requests.get(request_id)
        out = {"origin": r.origin if r else ""} if with_origin else {}
        return out | ({"session": r and r.session, "turn": r and r.turn} if with_session else {})

    return tags


NOT_IN_STEP_ROWS = ("phase", "step_time_s", "expert_load")  # the last: a matrix, summed per job


def step_row(index: int, stats: StepStats, t_s: float, repeat: int = 0) -> dict:
    """A flat, numeric row for the per-step history (`t_s`: seconds since the repeat started)."""
    values = ((f.name, getattr(stats, f.name)) for f in fields(stats) if f.name not in NOT_IN_STEP_ROWS)
    row = {k: v for k, v in values if v is not None}  # a dense model's step has no expert_load_* columns
    return row | {
        "step": index,
        "repeat": repeat,
        "t_s": t_s,
        "phase": stats.phase,  # prefill, decode or mixed
        "is_prefill": int(stats.phase == "prefill"),  # deprecated (one release): read phase
        "kv_blocks_total": stats.num_kv_blocks,  # deprecated (one release): read num_kv_blocks
        "step_time_ms": stats.step_time_s * 1e3,
        "tokens_per_s": _rate(stats.num_tokens, stats.step_time_s),
        "kv_cache_usage": _rate(stats.kv_blocks_used, stats.num_kv_blocks),
    }


def _rate(num: float, den: float) -> float:
    return float(num) / den if den else 0.0


def _time(steps: Sequence[StepStats]) -> float:
    return sum(s.step_time_s for s in steps)
