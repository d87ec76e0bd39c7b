"""The workload's requests checked as the user knows them (index, file and line): against the engine's
limits before any runs, and after the runs for requests the engine ended in error."""

from __future__ import annotations

from nanoexp.experiment.driver import EngineDriver, RunRecord
from nanoexp.experiment.schema import ConfigError
from nanoexp.experiment.workloads import Workload, request_label


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
    """A request the engine ended with an error (non-finite logits) fails the job after its outputs are
    written: its numbers would rest on garbage. The line names the first such request as the user knows it."""
    failed = [(r, o) for r in records for o in r.outputs if o.finish_reason == "error"]
    if failed:
        record, out = failed[0]
        requests = workloads[record.repeat].requests  # latency mode numbers across iterations
        label = request_label(out.request_id, requests[out.request_id % len(requests)])
        total = sum(len(r.outputs) for r in records)
        repeat = f" in repeat {record.repeat}" if len(records) > 1 else ""
        raise RuntimeError(
            f"{label}{repeat}: {out.error}; {len(failed)} of {total} requests ended with finish_reason "
            "'error' (see requests.csv)"
        )
