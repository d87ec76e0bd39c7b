"""Load ramps: arrivals drawn at a rate going from request_rate to ramp_end_rate over the requests, linearly
or exponentially (as `vllm bench serve --ramp-up-strategy`); the realized rate follows the ramp."""

from __future__ import annotations

import numpy as np
import pytest

from nanoexp.config import KnobError
from nanoexp.experiment.measure.workloads import arrival_offsets, build_workload, offered_rates
from nanoexp.experiment.schema import SamplerConfig, WorkloadConfig, WorkloadKind


@pytest.mark.parametrize("ramp", ["linear", "exponential"])
def test_realized_rate_follows_the_ramp(ramp: str) -> None:
    num, start, end = 8000, 10.0, 90.0
    rates = offered_rates(num, start, ramp, end)
    assert rates[0] == start and rates[-1] == pytest.approx(end)
    offsets = arrival_offsets(num, start, 1.0, seed=3, rates=rates)
    gaps, drawn = np.diff(offsets), np.asarray(rates[1:])
    for part_gaps, part_rates in zip(np.array_split(gaps, 8), np.array_split(drawn, 8)):
        expected = 1 / np.mean(1 / part_rates)  # the rate over a group is its gaps' harmonic mean
        assert 1 / part_gaps.mean() == pytest.approx(expected, rel=0.12)
    # a fit over the requests' positions: the local rate (linear) or its log (exponential) is a line
    position = np.array([p.mean() for p in np.array_split(np.arange(1, num) / (num - 1), 16)])
    local = np.array([1 / g.mean() for g in np.array_split(gaps, 16)])
    if ramp == "linear":
        slope, intercept = np.polyfit(position, local, 1)
        assert (intercept, intercept + slope) == pytest.approx((start, end), rel=0.15)
    else:
        slope, intercept = np.polyfit(position, np.log(local), 1)
        assert (np.exp(intercept), np.exp(intercept + slope)) == pytest.approx((start, end), rel=0.15)


def test_the_workload_draws_its_arrivals_at_the_ramp() -> None:
    w = WorkloadConfig(
        name="r",
        kind=WorkloadKind.random,
        num_requests=50,
        request_rate=5.0,
        ramp="exponential",
        ramp_end_rate=50.0,
    )
    workload = build_workload(w, SamplerConfig(), 1024)
    assert workload.offered_rates == pytest.approx(offered_rates(50, 5.0, "exponential", 50.0))
    expected = arrival_offsets(50, 5.0, 1.0, 0, workload.offered_rates)
    assert [r.arrival_offset_s for r in workload.requests] == expected


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"ramp": "linear", "request_rate": 5.0}, "workload.ramp='linear' is invalid: must be none unless"),
        ({"ramp": "linear", "ramp_end_rate": 9.0}, "workload.ramp='linear' is invalid: must be none unless"),
        ({"ramp": "sine"}, "workload.ramp='sine' is invalid: must be one of none, linear, exponential"),
        (
            {"ramp": "linear", "request_rate": 1.0, "ramp_end_rate": 0.0},
            "workload.ramp_end_rate=0.0 is invalid",
        ),
    ],
)
def test_bad_ramps_name_the_key(knobs: dict, message: str) -> None:
    with pytest.raises(KnobError) as err:
        WorkloadConfig(name="r", kind=WorkloadKind.random, **knobs)
    assert message in str(err.value)
