"""A synthetic workload too large for this machine's memory is a config error naming the key that sized it,
raised before any prompt is drawn (it used to grow the job's memory until the machine killed it)."""

from __future__ import annotations

import time

import pytest

from nanoexp.experiment.measure import workloads
from nanoexp.experiment.measure.workloads import build_workload
from nanoexp.experiment.schema import ConfigError, SamplerConfig, WorkloadConfig, WorkloadKind


@pytest.mark.parametrize(
    ("fields", "key"),
    [
        (
            {"kind": WorkloadKind.random, "num_requests": 10**8, "input_len": 80},
            "workload.num_requests=100000000",
        ),
        (
            {"kind": WorkloadKind.nanovllm_bench, "num_requests": 10**8, "output_len": 128},
            "workload.num_requests=100000000",
        ),
        (
            {"kind": WorkloadKind.latency, "batch_size": 10**8, "input_len": 80},
            "workload.batch_size=100000000",
        ),
        (
            {"kind": WorkloadKind.shared_prefix, "num_requests": 10**6, "input_len": 8, "prefix_len": 10**4},
            "~10008-token prompts",
        ),
    ],
)
def test_a_workload_larger_than_memory_is_refused_before_it_is_drawn(monkeypatch, fields, key) -> None:
    monkeypatch.setattr(workloads, "machine_memory_gb", lambda: 64.0)
    start = time.perf_counter()
    with pytest.raises(
        ConfigError, match="GiB of token ids in host memory, over half of this machine's 64 GiB"
    ):
        build_workload(WorkloadConfig(name="t", **fields), SamplerConfig(), 1024)
    assert time.perf_counter() - start < 1.0  # refused, not drawn
    with pytest.raises(ConfigError) as err:
        build_workload(WorkloadConfig(name="t", **fields), SamplerConfig(), 1024)
    assert key in str(err.value)


def test_a_large_workload_that_fits_is_built(monkeypatch) -> None:
    monkeypatch.setattr(workloads, "machine_memory_gb", lambda: 64.0)
    built = build_workload(
        WorkloadConfig(name="t", kind=WorkloadKind.random, num_requests=2000, input_len=16),
        SamplerConfig(),
        1024,
    )
    assert len(built.requests) == 2000
