"""What a real run.py job leaves for reproducing and explaining it: provenance in results.json and
the W&B config, a Chrome trace and per-step host phases and events with `profile=all`, the
profile artifact, a busy machine flagged, and a compile forced into a timed step counted and named."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT, TINY_JOB, job_env

from nanoexp.experiment.schema import BUSY_CORES

WANDB = Path(sys.executable).with_name("wandb")


def run_py(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = job_env(home)  # no API key: W&B offline
    proc = subprocess.run(
        [sys.executable, "run.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def wandb_records(run_dir: Path, *flags: str) -> str:
    proc = subprocess.run(
        [str(WANDB), "leet", "inspect", "--json", *flags, str(run_dir)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


# A busy loop from the job's start (Hydra makes its dir once run.py's imports are done) until its
# results.json: the timed repeats run beside it, and no core is spent on it while the job imports.
BUSY_DURING_THE_JOB = """
import os, sys, time
job = sys.argv[1]
while not os.path.isdir(job):
    time.sleep(0.05)
while not os.path.exists(os.path.join(job, "results.json")):
    for _ in range(100_000):
        pass
"""


@pytest.fixture(scope="module")
def profiled_job(tmp_path_factory) -> Path:
    """One job, two repeats, every profile knob on, logged to an offline W&B run, with a busy loop
    running beside it."""
    tmp = tmp_path_factory.mktemp("profiled")
    job = tmp / "job"
    busy = subprocess.Popen([sys.executable, "-c", BUSY_DURING_THE_JOB, str(job)])
    try:
        # repeats of ~1 s (metrics.noise.min_duration_s on a CPU): long enough to see the loop beside them
        size = ["workload.num_requests=32", "workload.output_len=200"]
        run_py(
            tmp / "home",
            f"hydra.run.dir={job}",
            *TINY_JOB,
            *size,
            "profile=all",
            "repeats=2",
            "sampler=greedy",
        )
    finally:
        busy.kill()
        busy.wait()
    return job


def results(job: Path) -> dict:
    return json.loads((job / "results.json").read_text())


def test_results_and_wandb_config_record_provenance(profiled_job: Path) -> None:
    res = results(profiled_job)
    prov = res["config"]["resolved"]["provenance"]
    assert len(prov["git"]["commit"]) == 40 and isinstance(prov["git"]["dirty"], bool)
    assert prov["packages"]["torch"] and prov["packages"]["transformers"] and "flash-attn" in prov["packages"]
    assert prov["cpu"]["count"] >= 1 and prov["hostname"]
    assert "run.py" in prov["command"] and "profile=all" in prov["command"]
    assert {"gpus", "driver", "cuda_build"} <= set(prov["device"])
    state = json.loads(wandb_records(Path(res["job"]["wandb"]["dir"]), "--summary"))
    assert state["config"]["resolved"]["provenance"]["git"]["commit"] == prov["git"]["commit"]


def test_trace_is_chrome_json_with_the_engines_ops(profiled_job: Path) -> None:
    trace = json.loads((profiled_job / "profile" / "trace_repeat0.json").read_text())
    names = {e.get("name", "") for e in trace["traceEvents"]}
    assert {f"ProfilerStep#{i}" for i in range(2, 10)} <= names
    assert any(n.startswith("aten::") for n in names), "no torch ops in the trace"
    summary = results(profiled_job)["summary"]
    assert summary["profile_traces"].endswith("trace_repeat0.json")


def test_steps_csv_has_host_phases_and_events_for_every_timed_step(profiled_job: Path) -> None:
    with (profiled_job / "steps.csv").open() as f:
        steps = list(csv.DictReader(f))
    summary = results(profiled_job)["summary"]  # repeat 1's: repeat 0 ran under the profiler
    assert summary["traced_repeat"] == 0 and summary["traced_repeat_in_summary"] is False
    assert sum(r["repeat"] == "1" for r in steps) == summary["num_steps"] and {
        r["repeat"] for r in steps
    } == {"0", "1"}
    phases = ("schedule", "launch", "prepare", "forward", "sample", "collect", "bookkeeping", "other")
    for row in steps:
        parts = sum(float(row[f"host_{p}_ms"]) for p in phases if p not in ("prepare", "forward", "sample"))
        assert parts == pytest.approx(float(row["host_step_ms"]), rel=1e-6, abs=1e-6)
        assert float(row["host_other_ms"]) >= -1e-6  # the phases are disjoint parts of the step
        assert float(row["host_schedule_ms"]) > 0
    assert all(float(r["host_forward_ms"]) > 0 for r in steps if float(r["host_launch_ms"]) > 0)
    assert sum(float(r["host_forward_ms"]) > 0 for r in steps) >= len(steps) / 2
    for row in steps:
        for event in ("triton_compiles", "torch_compiles", "gc_collections", "gc_full_collections"):
            assert int(row[event]) >= 0
    total_gcs = sum(int(r["gc_collections"]) for r in steps if r["repeat"] == "1")
    assert summary["profile_gc_collections"] == pytest.approx(total_gcs)  # the timed repeat's


def test_trace_is_a_wandb_artifact(profiled_job: Path) -> None:
    run_dir = Path(results(profiled_job)["job"]["wandb"]["dir"])
    records = [json.loads(line) for line in wandb_records(run_dir).splitlines()]
    artifacts = [r for r in records if r["type"] == "artifact"]
    assert any("profile" in json.dumps(a) and "trace_repeat0.json" in json.dumps(a) for a in artifacts)


def test_a_busy_machine_is_flagged(profiled_job: Path) -> None:
    summary = results(profiled_job)["summary"]
    limit = summary["noise_busy_limit_cores"]  # BUSY_CORES beyond the cores the job left free
    assert limit >= BUSY_CORES and round(limit - BUSY_CORES, 6) % 1 == 0
    busy = [r for r in summary["per_repeat"] if r["other_cpu_cores"] > limit]  # the loop's share varies
    assert summary["noise_busy_repeats"] == len(busy) >= 1, summary["per_repeat"]
    assert "noisy measurement: machine busy" in (profiled_job / "run.log").read_text()


# run.py with LLMEngine.step compiling one torch.compile graph in the third timed step: a step
# wrapped by the profiler (`step` set on the instance) is a timed one.
FORCED_COMPILE = """
import runpy, sys
import torch
from nanoexp.engine.llm_engine import LLMEngine

step, timed = LLMEngine.step, []
graph = torch.compile(lambda x: x * 2, backend="eager")

def compiling_step(self):
    if self.step_hooks is not None:  # the profiler hooks the timed repeats only
        timed.append(self)
        if len(timed) == 3:
            graph(torch.ones(3))
    return step(self)

LLMEngine.step = compiling_step
sys.argv = ["run.py", *sys.argv[1:]]
runpy.run_path("run.py", run_name="__main__")
"""


def test_a_compile_forced_in_a_timed_step_is_counted_and_flagged(tmp_path: Path) -> None:
    job = tmp_path / "job"
    env = job_env(tmp_path / "home")
    args = [
        f"hydra.run.dir={job}",
        *TINY_JOB,
        "profile=host",
        "logger=none",
        "metrics.kv_quality.num_requests=0",
    ]
    proc = subprocess.run(
        [sys.executable, "-c", FORCED_COMPILE, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with (job / "steps.csv").open() as f:
        compiles = [int(row["torch_compiles"]) for row in csv.DictReader(f)]
    assert compiles[2] == 1 and sum(compiles) == 1, compiles
    summary = results(job)["summary"]
    assert summary["profile_torch_compiles"] == 1 and summary["profile_compiled_steps"] == "2"
    assert "1 timed steps compiled a kernel or graph (steps 2)" in (job / "run.log").read_text()
