"""A job's summary never rests on a pass that lost outputs or on a request that ended in error."""

from __future__ import annotations

import pytest

from nanoexp import SamplingParams
from nanoexp.engine.outputs import RequestOutput
from nanoexp.experiment.measure.driver import RunRecord
from nanoexp.experiment.measure.request_checks import check_outputs
from nanoexp.experiment.measure.workloads import Request, Workload

PARAMS = SamplingParams(max_tokens=2)


def output(request_id: int, reason: str = "length", error: str = "") -> RequestOutput:
    return RequestOutput(request_id, [1], [2, 3], reason, 0.0, 0.0, 0.1, [0.1, 0.2], 0.2, 0, 0, error=error)


def workload(lines: int = 3, **latency) -> Workload:
    requests = [Request([1], PARAMS, source_file="p.txt", source_line=n + 1) for n in range(lines)]
    return Workload("w", requests, **latency)


def test_whole_passes_pass() -> None:
    check_outputs([RunRecord(0, [output(i) for i in range(3)])], [workload()])
    latency = workload(2, num_iters=2)
    check_outputs([RunRecord(0, [output(i) for i in range(4)])], [latency])


def test_a_pass_that_lost_an_output_fails() -> None:
    with pytest.raises(RuntimeError, match="repeat 1: 2 outputs for 3 requests"):
        check_outputs([RunRecord(0, [output(i) for i in range(3)]), RunRecord(1, [output(0), output(2)])],
                      [workload(), workload()])  # fmt: skip


def test_an_errored_request_fails_the_job_naming_its_line() -> None:
    outs = [
        output(0),
        output(1, "error", "non-finite logits (NaN or inf) at engine step 4, output token 2"),
        output(2),
    ]
    with pytest.raises(RuntimeError) as info:
        check_outputs([RunRecord(0, outs)], [workload()])
    assert str(info.value) == (
        "request 1 (p.txt:2): non-finite logits (NaN or inf) at engine step 4, output token 2; "
        "1 of 3 requests ended with finish_reason 'error' (see requests.csv)"
    )
