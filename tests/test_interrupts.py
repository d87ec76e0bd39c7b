"""An interrupted generate (Ctrl-C, an error inside a step) leaves the engine exact: the step that
was in flight is dropped with its tokens, and every later output is the one an idle engine gives."""

from __future__ import annotations

import pytest

from nanoexp import LLM, SamplingParams

SEEDED = SamplingParams(temperature=1.0, seed=7, max_tokens=12, ignore_eos=True)
PROMPTS = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16]]


@pytest.fixture(scope="module", params=[(1, True), (1, False), (2, True)], ids=["async", "sync", "tp2"])
def llm(request, checkpoints):
    tp, overlapped = request.param
    path = checkpoints["qwen3_gqa1"][0]
    with LLM(path, kvcache_block_size=16, num_kvcache_blocks=64, max_model_len=256,
             async_scheduling=overlapped, tensor_parallel_size=tp) as llm:  # fmt: skip
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
