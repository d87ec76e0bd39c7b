"""Online serving: the load generator keeps the schedule (arrivals are the scheduled times, also while a
step runs or a request waits for a concurrency slot), offered vs achieved rate, workload.max_concurrency,
and the serving preset's sweep report (inf rates, the max rate meeting the SLOs)."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from helpers import ROOT, TINY_JOB, job_env

from nanoexp.config import SamplingParams
from nanoexp.engine.outputs import RequestOutput
from nanoexp.experiment.measure.driver import EngineDriver
from nanoexp.experiment.measure.workloads import Request, arrival_offsets
from nanoexp.experiment.report.sweep_plots import NumericAxis, figure, max_rates, rate_line, spans_decades

TINY = [*TINY_JOB, "logger=none", "metrics.kv_quality.num_requests=0"]


class SlowEngine:
    """Steps take `step_s`; each step finishes the oldest request. Records what the driver submitted."""

    def __init__(self, step_s: float):
        self.step_s, self.queue, self.submitted, self.most_in_engine = step_s, [], [], 0

    def add_request(self, prompt, params, arrival_time=None) -> int:
        self.submitted.append((time.perf_counter(), arrival_time))
        self.queue.append(len(self.submitted) - 1)
        self.most_in_engine = max(self.most_in_engine, len(self.queue))
        return self.queue[-1]

    def has_unfinished(self) -> bool:
        return bool(self.queue)

    def step(self):
        time.sleep(self.step_s)
        done = RequestOutput(self.queue.pop(0), [1, 2, 3], [4], "length", 0.0, 0.0, 0.0, [0.0], 0.0, 0, 0)
        return [done], None


def requests(offsets: list[float]) -> list[Request]:
    return [Request([1, 2, 3], SamplingParams(max_tokens=2), o) for o in offsets]


def test_requests_are_stamped_with_their_scheduled_arrival_not_the_submission() -> None:
    engine, offsets = SlowEngine(step_s=0.05), [0.0, 0.01, 0.02, 0.03]
    t0 = time.perf_counter()
    EngineDriver(engine).drive(requests(offsets), t0, lambda s: None)
    assert [a for _, a in engine.submitted] == [t0 + o for o in offsets]
    assert engine.submitted[1][0] - engine.submitted[1][1] > 0.03  # submitted after the first step


def test_max_concurrency_caps_requests_in_the_engine() -> None:
    engine = SlowEngine(step_s=0.01)
    t0 = time.perf_counter()
    outputs = EngineDriver(engine, max_concurrency=2).drive(requests([0.0] * 5), t0, lambda s: None)
    assert len(outputs) == 5 and engine.most_in_engine == 2
    assert all(a == t0 for _, a in engine.submitted)  # a request waiting for a slot keeps its arrival


def run_job(tmp_path: Path, *overrides: str, multirun: bool = False) -> subprocess.CompletedProcess:
    env = job_env(tmp_path / "home")
    where = f"hydra.sweep.dir={tmp_path / 'sweep'}" if multirun else f"hydra.run.dir={tmp_path / 'run'}"
    cmd = [sys.executable, "run.py", *(["-m"] if multirun else []), where, *TINY, *overrides]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)


@pytest.mark.slow  # a run.py job
def test_requests_csv_arrivals_are_the_workloads_offsets(tmp_path: Path) -> None:
    proc = run_job(tmp_path, "workload.request_rate=50", "workload.max_concurrency=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    with (tmp_path / "run" / "requests.csv").open() as f:
        arrivals = [float(r["arrival_ms"]) for r in csv.DictReader(f)]
    assert arrivals == pytest.approx([o * 1e3 for o in arrival_offsets(8, 50.0, 1.0, 0)], abs=1e-6)
    summary = json.loads((tmp_path / "run" / "results.json").read_text())["summary"]
    assert summary["offered_request_rate"] == 50 and summary["max_concurrency"] == 2
    assert summary["request_throughput"] == pytest.approx(8 / summary["duration_s"])
    steps = pd.read_csv(tmp_path / "run" / "steps.csv")
    assert steps["num_running"].max() <= 2


@pytest.mark.slow  # a run.py job
def test_hf_baseline_batches_at_most_max_concurrency(tmp_path: Path) -> None:
    proc = run_job(tmp_path, "engine=hf", "workload.num_requests=5", "workload.max_concurrency=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert pd.read_csv(tmp_path / "run" / "steps.csv")["num_seqs"].max() == 2
    summary = json.loads((tmp_path / "run" / "results.json").read_text())["summary"]
    assert summary["offered_request_rate"] == "inf"  # results.json is strict JSON


@pytest.mark.slow  # a run.py job
@pytest.mark.parametrize("value", ["0", "-3"])
def test_bad_max_concurrency_is_one_line_naming_the_knob(tmp_path: Path, value: str) -> None:
    proc = run_job(tmp_path, f"workload.max_concurrency={value}")
    assert proc.returncode == 2
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("nanoexp: error:")]
    assert f"workload.max_concurrency={value}" in line and "null (unlimited) or an integer >= 1" in line


def test_inf_sits_one_step_past_the_largest_rate() -> None:
    rates = pd.Series(["8", "16", "32", "64", "128", "inf"])
    axis = NumericAxis(rates, "param:workload.request_rate")
    assert axis.log and list(axis.place(rates)) == [8, 16, 32, 64, 128, 256]
    linear = NumericAxis(pd.Series(["2", "4", "inf"]), "param:workload.request_rate")
    assert not linear.log and list(linear.place(pd.Series(["inf"]))) == [6]
    assert list(NumericAxis(pd.Series(["inf"]), "param:x").place(pd.Series(["inf"]))) == [1]


def rate_table(rows: list[tuple[str, str, float | None]]) -> pd.DataFrame:
    """(engine, rate, slo_attainment or None for a failed job)."""
    return pd.DataFrame(
        {
            "param:engine": e,
            "param:workload.request_rate": r,
            "status": "ok" if a is not None else "failed",
            "slo_attainment": a if a is not None else math.nan,
        }
        for e, r, a in rows
    )


def test_latency_panels_spanning_decades_are_log_scaled() -> None:
    """All at t0, TTFT is queueing (hundreds of ms); at low rates a few ms: a linear axis hides the latter."""
    wide, narrow = figure().subplots(1, 2)
    wide.errorbar([1, 2, 3], [4.0, 6.5, 200.0], yerr=[0.1, 0.1, 5.0])
    narrow.errorbar([1, 2, 3], [1.4, 2.3, 6.4])
    narrow.axhline(0.5)  # an SLO line counts as a point: below the data it widens the span ~13x
    assert spans_decades(wide) and not spans_decades(narrow)


def test_max_rate_is_the_last_rate_before_the_first_miss() -> None:
    table = rate_table(
        [
            ("nanoexp", "8", 1.0),
            ("nanoexp", "16", 0.95),
            ("nanoexp", "32", 0.5),
            ("nanoexp", "inf", 0.92),  # above a miss: does not count
            ("hf", "8", None),
            ("hf", "16", 1.0),
        ]
    )
    found = {e["group"]: e["max_rate"] for e in max_rates(table, ["param:engine"])}
    assert found == {"engine=hf": None, "engine=nanoexp": 16}
    slo = {"ttft_ms": 200.0, "tpot_ms": 20.0}
    assert rate_line(slo, {"group": "", "max_rate": 64.0}).endswith("): 64 req/s")
    assert rate_line(slo, {"group": "", "max_rate": "inf"}).endswith("all at t0 (inf)")
    assert "none of the offered rates" in rate_line(slo, {"group": "engine=hf", "max_rate": None})


@pytest.mark.slow  # a run.py job
def test_rate_sweep_with_inf_writes_its_plots(tmp_path: Path) -> None:
    proc = run_job(tmp_path, "workload.num_requests=4", "workload.request_rate=8,inf", multirun=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "OverflowError" not in proc.stderr and "raised" not in proc.stderr
    sweep = tmp_path / "sweep"
    for name in ("sweep_workload_request_rate.png", "sweep_latency_cdf.png", "sweep_serving.png"):
        assert (sweep / name).stat().st_size > 1000, name
    table = pd.read_csv(sweep / "sweep_summary.csv")
    assert sorted(table["offered_request_rate"].astype(str)) == ["8.0", "inf"]
    assert (table["request_throughput"] > 0).all()


@pytest.mark.slow  # a run.py job
def test_swept_paths_with_slashes_keep_plots_and_latencies(tmp_path: Path) -> None:
    paths = []
    for name in ("a", "b"):
        path = tmp_path / name / "prompts.jsonl"
        path.parent.mkdir()
        path.write_text("".join(json.dumps({"prompt_token_ids": [1, 2, 3 + i]}) + "\n" for i in range(3)))
        paths.append(str(path))
    proc = run_job(tmp_path, "workload=prompts_file", f"workload.path={','.join(paths)}", multirun=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sweep = tmp_path / "sweep"
    assert (sweep / "sweep_workload_path.png").stat().st_size > 1000
    assert (sweep / "sweep_latency_cdf.png").stat().st_size > 1000
    table = pd.read_csv(sweep / "sweep_summary.csv")
    assert all((sweep / d / "requests.csv").is_file() for d in table["job_dir"])


@pytest.mark.slow  # a run.py job
def test_serving_preset_reports_the_max_rate_meeting_slos(tmp_path: Path) -> None:
    small = ["workload.num_requests=8", "workload.input_len=16", "workload.output_len=4", "repeats=1"]
    proc = run_job(tmp_path, "experiment=serving", *small, "workload.request_rate=4,inf", multirun=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sweep = tmp_path / "sweep"
    markdown = (sweep / "sweep_summary.md").read_text()
    (line,) = [ln for ln in markdown.splitlines() if "max rate meeting SLOs" in ln]
    assert "ttft_ms <= 200, tpot_ms <= 20 for >= 90% of requests" in line
    found = json.loads((sweep / "sweep_serving.json").read_text())
    assert found["slo"] == {"ttft_ms": 200.0, "tpot_ms": 20.0}
    (entry,) = found["max_rate_meeting_slo"]
    assert [r["offered_request_rate"] for r in entry["rates"]] == [4.0, "inf"]
    expected = rate_line(found["slo"], entry)  # whatever rate a loaded machine sustains
    assert line == f"- {expected}"
    for name in ("sweep_serving.png", "sweep_workload_request_rate.png", "sweep_latency_cdf.png"):
        assert (sweep / name).stat().st_size > 1000, name
    table = pd.read_csv(sweep / "sweep_summary.csv")
    assert (table["repeats"] == 1).all() and (table["slo:ttft_ms"] == 200).all()
