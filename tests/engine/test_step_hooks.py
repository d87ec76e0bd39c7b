"""LLMEngine.set_hooks: an observer hears each step begin and end and its host phases, nested as they
run, on every step path; removed, it hears nothing."""

from __future__ import annotations

import pytest
from helpers import StandInExecutor, stand_in_engine

from nanoexp import LLM
from nanoexp.config import SamplingParams
from nanoexp.engine.llm_engine import LLMEngine
from nanoexp.runner.step_hooks import ENGINE_PHASES, RUNNER_PHASES

PARAMS = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
SYNC_STEP = ["schedule", "launch", "bookkeeping", "bookkeeping"]
# overlapped: the previous step's launch came before; this one launches the next (if any) before collecting
OVERLAPPED_STEPS = (
    ["bookkeeping", "schedule", "launch", "collect", "bookkeeping"],
    ["bookkeeping", "schedule", "collect", "bookkeeping"],
)


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def step_begin(self) -> None:
        self.events.append(("step", "begin"))

    def step_end(self) -> None:
        self.events.append(("step", "end"))

    def phase_begin(self, phase: str) -> None:
        self.events.append((phase, "begin"))

    def phase_end(self, phase: str) -> None:
        self.events.append((phase, "end"))


def phases_per_step(events: list[tuple[str, str]]) -> list[list[str]]:
    """The engine phases of each step, in order; checks that steps and phases open and close in turn, that
    engine phases never nest, and that the runner's nest in a launch."""
    steps, stack = [], []
    for name, edge in events:
        if edge == "begin":
            if name == "step":
                assert not stack
                steps.append([])
            else:
                parent = "launch" if name in RUNNER_PHASES else "step"
                assert stack and stack[-1] == parent, (name, stack)
                if name in ENGINE_PHASES:
                    steps[-1].append(name)
            stack.append(name)
        else:
            assert stack.pop() == name
    assert not stack
    return steps


def run_steps(engine: LLMEngine, prompts: list[list[int]]) -> int:
    for prompt in prompts:
        engine.add_request(prompt, PARAMS)
    count = 0
    while engine.has_unfinished():
        engine.step()
        count += 1
    return count


@pytest.mark.parametrize("batching", ["mixed", "prefill_first"])
@pytest.mark.parametrize("overlap", [False, True])
def test_every_step_reports_its_phases_in_order(overlap: bool, batching: str) -> None:
    engine = stand_in_engine(StandInExecutor(), async_scheduling=overlap, batching=batching, max_num_seqs=2)
    recorder = Recorder()
    try:
        assert engine.set_hooks(recorder, recorder) == ENGINE_PHASES  # no runner in this process
        count = run_steps(engine, [[1, 2, 3], [4, 5, 6, 7, 8, 9], [3] * 11])
        steps = phases_per_step(recorder.events)
        assert len(steps) == count >= 6
        if not overlap:
            assert all(step == SYNC_STEP for step in steps)
        else:
            assert steps[0][:2] == ["schedule", "launch"]  # nothing in flight: a step launches its own batch
            assert all((s[2:] if s[:2] == ["schedule", "launch"] else s) in OVERLAPPED_STEPS for s in steps)

        heard = len(recorder.events)
        assert engine.set_hooks(None, None) == ()
        run_steps(engine, [[1, 2]])
        assert len(recorder.events) == heard
    finally:
        engine.close()


def test_step_hooks_alone_hear_no_phases() -> None:
    engine = stand_in_engine(StandInExecutor())
    recorder = Recorder()
    try:
        assert engine.set_hooks(step=recorder) == ()
        count = run_steps(engine, [[1, 2, 3]])
        assert recorder.events == [("step", "begin"), ("step", "end")] * count
    finally:
        engine.close()


@pytest.mark.parametrize("overlap", [False, True])
def test_an_in_process_runner_reports_prepare_and_forward_inside_each_launch(checkpoints, overlap) -> None:
    with LLM(checkpoints["qwen3_gqa1"][0], num_kv_blocks=16, async_scheduling=overlap) as llm:
        recorder = Recorder()
        assert llm.engine.set_hooks(recorder, recorder) == ENGINE_PHASES + RUNNER_PHASES
        llm.generate([[1, 2, 3], [4, 5]], PARAMS, use_tqdm=False)
        llm.engine.set_hooks(None, None)
    phases_per_step(recorder.events)  # runner phases only inside a launch
    edges = [e for e in recorder.events if e[0] in ("launch", *RUNNER_PHASES)]
    launch = [("launch", "begin"), ("prepare", "begin"), ("prepare", "end")]
    launch += [("forward", "begin"), ("forward", "end"), ("launch", "end")]
    assert len(edges) >= 6 * len(launch) and edges == launch * (len(edges) // len(launch))
