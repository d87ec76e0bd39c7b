"""The profile knobs on the engine over a stand-in executor: events land on the step they hit, phases add
up, the engine is left unwrapped and unhooked afterwards, and with every knob off no profiler exists."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import StandInExecutor, stand_in_engine

from nanoexp import LLM
from nanoexp.config import SamplingParams
from nanoexp.engine.llm_engine import LLMEngine
from nanoexp.experiment.measure.driver import StepLog
from nanoexp.experiment.measure.profiling import StepProfiler, _triton_runtime_knobs
from nanoexp.experiment.measure.repeats import _profiler
from nanoexp.experiment.schema import ProfileConfig


class Events:
    """Step 1 compiles a torch.compile graph, step 2 runs a full collection, step 3 a Triton compile
    (Triton calls its post-compile hook)."""

    def __init__(self):
        self.compiled = torch.compile(lambda x: x + 1, backend="eager")

    def __call__(self, step: int) -> None:
        if step == 1:
            self.compiled(torch.ones(3 + step))
        if step == 2:
            gc.collect()
        hook = _triton_runtime_knobs().jit_post_compile_hook
        if step == 3 and hook is not None:
            hook(key="k", repr="kernel")


@pytest.fixture
def engine() -> Iterator[LLMEngine]:
    """The real engine, one step at a time (not overlapped), over an executor that causes the Events."""
    engine = stand_in_engine(StandInExecutor(on_step=Events()), async_scheduling=False)
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=50, ignore_eos=True))
    yield engine
    engine.close()


def _run_steps(profiler: StepProfiler, engine: LLMEngine, n: int) -> StepLog:
    log = StepLog(lambda *a: None)
    with profiler.repeat(0, log):
        for _ in range(n):
            engine.step()
            log.index += 1
    return log


def test_events_count_on_the_step_they_hit_and_the_engine_is_unwrapped(tmp_path: Path, engine) -> None:
    pytest.importorskip("triton")
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
        assert "host_forward_ms" not in c  # no runner in this process to time the launch's parts
    assert "step" not in vars(engine) and "schedule" not in vars(engine.scheduler)
    assert "run" not in vars(engine.executor) and "advance" not in vars(engine)
    assert engine.step_hooks is None and engine.phase_hooks is None
    assert _triton_runtime_knobs().jit_post_compile_hook is hook_before
    assert gc.callbacks.count(profiler._on_gc) == 0


@pytest.mark.parametrize("overlap", [False, True])
def test_an_in_process_runner_adds_the_launchs_parts(tmp_path: Path, checkpoints, overlap: bool) -> None:
    with LLM(checkpoints["qwen3_gqa1"][0], num_kv_blocks=16, async_scheduling=overlap) as llm:
        llm.engine.add_request([1, 2, 3], SamplingParams(max_tokens=8, ignore_eos=True))
        profiler = StepProfiler(ProfileConfig(host_phases=True), llm.engine, tmp_path)
        _run_steps(profiler, llm.engine, 4)
    parts = ("schedule", "launch", "collect", "bookkeeping", "other")
    assert len(profiler.columns) == 4
    for c in profiler.columns.values():
        assert set(c) == {f"host_{k}_ms" for k in ("step", *parts, "prepare", "forward", "sample")}
        assert c["host_prepare_ms"] > 0 and c["host_forward_ms"] > 0 and c["host_sample_ms"] >= 0
        assert sum(c[f"host_{k}_ms"] for k in parts) == pytest.approx(c["host_step_ms"])
        assert c["host_other_ms"] >= 0


def test_untimed_steps_are_not_counted(tmp_path: Path, engine) -> None:
    profiler = StepProfiler(ProfileConfig(events=True), engine, tmp_path)
    log = StepLog(lambda *a: None)
    log.recording = False  # latency mode's warm-up iterations
    with profiler.repeat(0, log):
        engine.step()
    assert profiler.columns == {}


def test_trace_covers_the_chosen_steps(tmp_path: Path, engine) -> None:
    import json

    profiler = StepProfiler(ProfileConfig(trace_steps=2, trace_first_step=1), engine, tmp_path)
    _run_steps(profiler, engine, 5)
    trace = json.loads((tmp_path / "profile" / "trace_repeat0.json").read_text())
    steps = {e["name"] for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep")}
    assert steps == {"ProfilerStep#1", "ProfilerStep#2"}
    assert profiler.job_summary()["profile_traces"].endswith("trace_repeat0.json")


def test_no_profiler_when_every_knob_is_off(tmp_path: Path, engine) -> None:
    driver = SimpleNamespace(engine=engine)
    assert _profiler(ProfileConfig(), driver, tmp_path) is None
    assert _profiler(None, driver, tmp_path) is None
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
