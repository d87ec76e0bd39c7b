"""An interrupted generate (Ctrl-C, an error inside a step) leaves the engine exact: the step that
was in flight is dropped with its tokens, and every later output is the one an idle engine gives."""

from __future__ import annotations

import threading

import pytest

from nanoexp import LLM, SamplingParams
from nanoexp.engine.llm import EngineBusyError

SEEDED = SamplingParams(temperature=1.0, seed=7, max_tokens=12, ignore_eos=True)
PROMPTS = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16]]


@pytest.fixture(
    scope="module",
    params=[(1, True), (1, False), pytest.param((2, True), marks=pytest.mark.slow)],  # slow: TP workers
    ids=["async", "sync", "tp2"],
)
def llm(request, checkpoints):
    tp, overlapped = request.param
    path = checkpoints["qwen3_gqa1"][0]
    with LLM(
        path,
        kv_block_size=16,
        num_kv_blocks=64,
        max_model_len=256,
        async_scheduling=overlapped,
        tensor_parallel_size=tp,
    ) as llm:
        yield llm


def interrupt_on_step(llm: LLM, monkeypatch, n: int) -> None:
    """Makes the engine's n-th step completion raise KeyboardInterrupt, as a Ctrl-C would."""
    engine, calls = llm.engine, []
    complete = engine.complete

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == n:
            raise KeyboardInterrupt
        return complete(*args, **kwargs)

    monkeypatch.setattr(engine, "complete", interrupted)


@pytest.mark.parametrize("at_step", [1, 3, 6])
def test_outputs_after_an_interrupted_generate_are_exact(llm, monkeypatch, at_step) -> None:
    reference = [o.token_ids for o in llm.generate(PROMPTS, SEEDED, use_tqdm=False)]
    interrupt_on_step(llm, monkeypatch, at_step)
    with pytest.raises(KeyboardInterrupt):
        llm.generate(PROMPTS, SEEDED, use_tqdm=False)
    monkeypatch.undo()
    assert not llm.engine.has_unfinished() and llm.engine.block_manager.num_used == 0
    for _ in range(2):
        assert [o.token_ids for o in llm.generate(PROMPTS, SEEDED, use_tqdm=False)] == reference


def test_abort_all_between_steps_drops_the_step_in_flight(llm) -> None:
    reference = [o.token_ids for o in llm.generate(PROMPTS, SEEDED, use_tqdm=False)]
    engine = llm.engine
    for prompt in PROMPTS:
        engine.add_request(prompt, SEEDED)
    for _ in range(4):
        engine.step()
    engine.abort_all()
    assert not engine.has_unfinished() and engine.block_manager.num_used == 0
    assert [o.token_ids for o in llm.generate(PROMPTS, SEEDED, use_tqdm=False)] == reference


def test_a_second_caller_during_generate_gets_a_clear_error_and_the_first_loses_nothing(
    llm, monkeypatch
) -> None:
    reference = [o.token_ids for o in llm.generate(PROMPTS, SEEDED, use_tqdm=False)]
    entered, release, results = threading.Event(), threading.Event(), []
    step = llm.engine.step

    def first_step_waits():
        entered.set()
        release.wait(timeout=60)
        return step()

    monkeypatch.setattr(llm.engine, "step", first_step_waits)
    first = threading.Thread(target=lambda: results.append(llm.generate(PROMPTS, SEEDED, use_tqdm=False)))
    first.start()
    try:
        assert entered.wait(timeout=60)
        with pytest.raises(EngineBusyError, match="one caller at a time"):
            llm.generate(PROMPTS, SEEDED, use_tqdm=False)
    finally:
        release.set()
        first.join(timeout=120)
    assert [o.token_ids for o in results[0]] == reference


def test_generate_refuses_requests_queued_with_add_request(llm) -> None:
    reference = [o.token_ids for o in llm.generate(PROMPTS, SEEDED, use_tqdm=False)]
    engine = llm.engine
    queued = engine.add_request(PROMPTS[0], SEEDED)
    with pytest.raises(EngineBusyError, match="1 request.*engine.add_request"):
        llm.generate(PROMPTS[1:], SEEDED, use_tqdm=False)
    finished = []
    while engine.has_unfinished():
        finished += engine.step()[0]
    assert [o.request_id for o in finished] == [queued]
    assert finished[0].token_ids == reference[0]
