"""The workload's requests checked as the user knows them (index, file and line): against the engine's
limits before any runs, and after the runs for requests the engine ended in error."""

from __future__ import annotations

from nanoexp.experiment.measure.driver import EngineDriver, RunRecord
from nanoexp.experiment.measure.workloads import Workload, request_label
from nanoexp.experiment.schema import ConfigError


def check_requests(driver, workloads: list[Workload]) -> None:
    """Every request against the engine before any runs (config errors: the workload and the engine's
    limits disagree), named as the user knows it."""
    if not isinstance(driver, EngineDriver):
        return
    try:
        for workload in workloads:
            driver.check(workload.requests)
    except (ValueError, TypeError) as e:
        raise ConfigError(str(e)) from None


def check_outputs(records: list[RunRecord], workloads: list[Workload]) -> None:
    """Every request of every repeat has its output, and none ended in error (non-finite logits): else the
    job fails after its outputs are written, as its numbers would rest on garbage, naming the first such
    request as the user knows it."""
    for record, workload in zip(records, workloads):
        expected = workload.num_requests * (
            workload.num_iters if workload.latency_mode else 1
        )  # follow-ups too
        if len(record.outputs) != expected:  # no summary may rest on a repeat that lost outputs
            raise RuntimeError(
                f"repeat {record.repeat}: {len(record.outputs)} outputs for {expected} requests"
            )
    failed = [(r, o) for r in records for o in r.outputs if o.finish_reason == "error"]
    if failed:
        record, out = failed[0]
        requests = workloads[record.repeat].requests  # latency mode numbers across iterations
        request = record.requests.get(out.request_id) or requests[out.request_id % len(requests)]
        label = request_label(out.request_id, request)
        total = sum(len(r.outputs) for r in records)
        repeat = f" in repeat {record.repeat}" if len(records) > 1 else ""
        raise RuntimeError(
            f"{label}{repeat}: {out.error}; {len(failed)} of {total} requests ended with finish_reason "
            "'error' (see requests.csv)"
        )
