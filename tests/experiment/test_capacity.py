"""The capacity search's bracketing and bisection, its answer and interval, and its config checks."""

from __future__ import annotations

import math

import pytest

from nanoexp.experiment.job.capacity import Probe, answer, at_rate, bracket, check
from nanoexp.experiment.schema import ConfigError, NanoexpConfig, SloConfig, WorkloadConfig, WorkloadKind


def searcher(capacity: float):
    probes: list[float] = []

    def probe(rate: float) -> bool:
        probes.append(rate)
        return rate <= capacity

    return probe, probes


@pytest.mark.parametrize("capacity", [0.3, 5.0, 37.0, 700.0])
def test_bracket_then_bisection_converge_around_the_flip(capacity: float) -> None:
    probe, probes = searcher(capacity)
    low, high = bracket(probe, 8.0, 2.0, 0.01, 1e4, 30)
    assert low <= capacity < high and high / low == pytest.approx(2.0)
    while high / low - 1 > 0.05:
        middle = math.sqrt(low * high)
        low, high = (middle, high) if probe(middle) else (low, middle)
    assert low <= capacity < high and high / low - 1 <= 0.05
    assert len(probes) <= 4 + math.ceil(math.log2(math.log(2) / math.log(1.05))) + abs(
        math.log2(capacity / 8)
    )


def test_bracket_stops_at_the_rate_limits() -> None:
    assert bracket(searcher(1e9)[0], 8.0, 2.0, 0.01, 100.0, 30) == (64.0, None)
    assert bracket(searcher(0.0)[0], 8.0, 2.0, 1.0, 100.0, 30) == (None, 1.0)
    probe, probes = searcher(1e9)
    bracket(probe, 8.0, 2.0, 0.01, 1e9, 3)
    assert len(probes) == 3


def probe(rate: float, attainment: float, low: float, high: float, target: float = 0.9) -> Probe:
    return Probe(rate, attainment, low, high, attainment >= target, f"probes/{rate}", [])


def test_answer_reports_the_bracket_and_the_interval_where_the_verdict_is_out_of_the_noise() -> None:
    probes = [
        probe(8, 1.0, 1.0, 1.0),
        probe(16, 0.97, 0.93, 1.0),
        probe(32, 0.5, 0.4, 0.6),
        probe(22.6, 0.92, 0.85, 0.99),  # passed, but its CI reaches below the target
        probe(26.9, 0.88, 0.8, 0.95),  # failed, within noise
    ]
    found = answer(probes, 22.6, 26.9, 0.9, 0.2)
    assert found["capacity_request_rate"] == 22.6 and found["capacity_converged"]
    assert (found["capacity_bracket_low"], found["capacity_bracket_high"]) == (22.6, 26.9)
    assert (found["capacity_ci95_low"], found["capacity_ci95_high"]) == (16, 32)
    assert [p["passed"] for p in found["capacity_probes"]] == [True, True, False, True, False]
    assert not answer(probes, 22.6, 32, 0.9, 0.2)["capacity_converged"]


def test_the_knob_is_the_rate_or_a_traces_time_scale() -> None:
    spec = NanoexpConfig(workload=WorkloadConfig(name="r", request_rate=2.0))
    assert at_rate(spec, 12.0).workload.request_rate == 12.0
    trace = WorkloadConfig(name="t", kind=WorkloadKind.trace, path=__file__)
    assert at_rate(NanoexpConfig(workload=trace), 12.0, trace_rate=3.0).workload.time_scale == 0.25


def test_the_search_needs_slos_and_arrivals() -> None:
    with pytest.raises(ConfigError, match="capacity.enabled=true needs an SLO"):
        check(NanoexpConfig(workload=WorkloadConfig(name="r")))
    spec = NanoexpConfig(workload=WorkloadConfig(name="l", kind=WorkloadKind.latency))
    spec.metrics.slo = SloConfig(ttft_ms=100)
    with pytest.raises(ConfigError, match="workload=latency has no arrivals"):
        check(spec)
