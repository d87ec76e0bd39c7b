"""The profile knobs on a stand-in engine: events land on the step they hit, phases add up, the
engine is left unwrapped afterwards, and with every knob off nothing is wrapped at all."""

from __future__ import annotations

import gc
import time
from pathlib import Path

import pytest
import torch

from nanoexp.experiment.measure.driver import StepLog
from nanoexp.experiment.measure.profiling import StepProfiler, _triton_runtime_knobs
from nanoexp.experiment.measure.repeats import _profiler
from nanoexp.experiment.schema import ProfileConfig


class Scheduler:
    def schedule(self):
        return self.schedule_decode()  # as the real one falls back to a decode batch

    def schedule_decode(self):
        time.sleep(0.002)  # long enough that counting it twice would exceed the whole step
        return "batch"


class Executor:
    def run(self, batch):
        return [1]

    def launch(self, batch):
        pass

    def collect(self):
        return [1]


class Engine:
    """Step 1 compiles a torch.compile graph, step 2 runs a full collection, step 3 a Triton compile
    (Triton calls its post-compile hook)."""

    def __init__(self):
        self.scheduler, self.executor, self.count = Scheduler(), Executor(), 0
        self.compiled = torch.compile(lambda x: x + 1, backend="eager")

    def step(self):
        batch = self.scheduler.schedule()
        self.executor.run(batch)
        self.advance()
        self.complete()
        if self.count == 1:
            self.compiled(torch.ones(3 + self.count))
        if self.count == 2:
            gc.collect()
        hook = _triton_runtime_knobs().jit_post_compile_hook
        if self.count == 3 and hook is not None:
            hook(key="k", repr="kernel")
        self.count += 1
        return [], None

    def advance(self):
        pass

    def complete(self):
        pass


def _run_steps(profiler: StepProfiler, engine: Engine, n: int) -> StepLog:
    log = StepLog(lambda *a: None)
    with profiler.repeat(0, log):
        for _ in range(n):
            engine.step()
            log.index += 1
    return log


def test_events_count_on_the_step_they_hit_and_the_engine_is_unwrapped(tmp_path: Path) -> None:
    pytest.importorskip("triton")
    engine = Engine()
    profiler = StepProfiler(ProfileConfig(host_phases=True, events=True), engine, tmp_path)
    hook_before = _triton_runtime_knobs().jit_post_compile_hook
    _run_steps(profiler, engine, 5)
    cols = profiler.columns
    assert [cols[i]["torch_compiles"] for i in range(5)] == [0, 1, 0, 0, 0]
    assert cols[2]["gc_full_collections"] >= 1 and cols[2]["gc_ms"] > 0
    assert [cols[i]["triton_compiles"] for i in range(5)] == [0, 0, 0, 1, 0]
    assert profiler.job_summary()["profile_compiled_steps"] == "1 3"
    assert (
        profiler.summary()["profile_torch_compiles"] == 1
        and profiler.summary(since=2)["profile_torch_compiles"] == 0
    )
    for c in cols.values():
        parts = (
            "host_schedule_ms",
            "host_launch_ms",
            "host_collect_ms",
            "host_bookkeeping_ms",
            "host_other_ms",
        )
        assert sum(c[k] for k in parts) == pytest.approx(c["host_step_ms"])
        assert c["host_other_ms"] >= 0  # the phases are disjoint parts of the step
        assert c["host_schedule_ms"] > 0 and c["host_launch_ms"] > 0
    assert "step" not in vars(engine) and "schedule" not in vars(engine.scheduler)
    assert "run" not in vars(engine.executor) and "advance" not in vars(engine)
    assert _triton_runtime_knobs().jit_post_compile_hook is hook_before
    assert gc.callbacks.count(profiler._on_gc) == 0


def test_untimed_steps_are_not_counted(tmp_path: Path) -> None:
    engine = Engine()
    profiler = StepProfiler(ProfileConfig(events=True), engine, tmp_path)
    log = StepLog(lambda *a: None)
    log.recording = False  # latency mode's warm-up iterations
    with profiler.repeat(0, log):
        engine.step()
    assert profiler.columns == {}


def test_trace_covers_the_chosen_steps(tmp_path: Path) -> None:
    import json

    engine = Engine()
    profiler = StepProfiler(ProfileConfig(trace_steps=2, trace_first_step=1), engine, tmp_path)
    _run_steps(profiler, engine, 5)
    trace = json.loads((tmp_path / "profile" / "trace_repeat0.json").read_text())
    steps = {e["name"] for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep")}
    assert steps == {"ProfilerStep#1", "ProfilerStep#2"}
    assert profiler.job_summary()["profile_traces"].endswith("trace_repeat0.json")


def test_no_profiler_when_every_knob_is_off(tmp_path: Path) -> None:
    class Driver:
        engine = Engine()

    assert _profiler(ProfileConfig(), Driver(), tmp_path) is None
    assert _profiler(None, Driver(), tmp_path) is None
    assert _profiler(ProfileConfig(events=True), object(), tmp_path) is None  # the hf baseline


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["profile.trace_steps=4", "profile.trace_repeat=2", "repeats=2"],
            "profile.trace_repeat=2 is invalid",
        ),
        (["profile.trace_steps=-1"], "profile.trace_steps=-1 is invalid: must be an integer >= 0"),
        (["trial=-1"], "trial=-1 is invalid"),
        (["metrics.noise.max_ci_share=0"], "metrics.noise.max_ci_share=0.0 is invalid: must be a number > 0"),
    ],
)
def test_bad_profile_and_noise_knobs_are_one_line_errors(overrides: list[str], message: str) -> None:
    from helpers import compose_cfg

    from nanoexp.experiment.schema import ConfigError, to_spec

    with pytest.raises(ConfigError) as err:
        to_spec(compose_cfg("model=qwen3_tiny", *overrides))
    assert message in str(err.value) and "\n" not in str(err.value)
