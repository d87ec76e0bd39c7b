"""Prompts at the API edge and arrival times in the driver: one-line errors, never a guess or a hang."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from nanoexp import LLM, SamplingParams
from nanoexp.experiment.measure.driver import EngineDriver
from nanoexp.experiment.measure.workloads import Request

GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
ALLOWED = "a prompt is a str or a sequence of int token ids"


@pytest.fixture(scope="module")
def llm(checkpoints):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    path = checkpoints["qwen3_gqa1"][0]
    with LLM(path, kv_block_size=16, num_kv_blocks=64, max_model_len=512) as llm:
        words = Tokenizer(models.WordLevel({"[UNK]": 0, "hi": 1, "there": 2}, unk_token="[UNK]"))
        words.pre_tokenizer = pre_tokenizers.Whitespace()
        llm.tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, unk_token="[UNK]")
        yield llm


def one_line(err) -> str:
    text = str(err.value)
    assert "\n" not in text
    return text


def assert_idle_and_serving(llm: LLM) -> None:
    assert not llm.engine.has_unfinished() and llm.engine.block_manager.num_used == 0
    assert not llm.engine.scheduler.waiting_seqs() and not llm.engine.scheduler.running_seqs()
    assert len(llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False)[0].token_ids) == 4


@pytest.mark.parametrize(
    ("prompts", "needles"),
    [
        (["hi", 5], ["prompt 1: got int 5", ALLOWED]),
        ([[1, 2], None], ["prompt 1: got NoneType None", ALLOWED]),
        ([[1, "a"]], ["prompt 0: token id 'a' (str) is not an integer", ALLOWED]),
        ([[3, 4], {"prompt": "hi"}], ["prompt 1: got dict", ALLOWED]),
        ([[3, 4], [1, 2.0]], ["prompt 1: token id 2.0 (float) is not an integer"]),
        ([[3, 4], [1, True]], ["prompt 1: token id True (bool) is not an integer"]),
        ([[3, 4], np.zeros((2, 2), dtype=np.int64)], ["prompt 1: got a 2-D array", ALLOWED]),
        ([[1, 2], []], ["prompt 1: the prompt is empty"]),
        (["hi", ""], ["prompt 1: the prompt is empty"]),
        ({"a": [1, 2]}, ["prompts: got dict", ALLOWED]),
        (7, ["prompts: got int", ALLOWED]),
    ],
)
def test_bad_prompts_name_the_index_and_queue_nothing(llm, prompts, needles) -> None:
    with pytest.raises((TypeError, ValueError)) as err:
        llm.generate(prompts, GREEDY, use_tqdm=False)
    for needle in needles:
        assert needle in one_line(err)
    assert_idle_and_serving(llm)


def test_out_of_vocabulary_ids_name_the_prompt_and_the_id(llm) -> None:
    vocab = llm.engine.vocab_size
    with pytest.raises(ValueError) as err:
        llm.generate([[1, 2], [3, np.int64(vocab)]], GREEDY, use_tqdm=False)
    assert one_line(err) == f"prompt 1: token id {vocab} is outside the vocabulary [0, {vocab})"
    with pytest.raises(ValueError) as err:
        llm.engine.add_request([1, -1], GREEDY)
    assert "token id -1 is outside the vocabulary" in one_line(err) and one_line(err).startswith("request ")
    assert_idle_and_serving(llm)


def test_numpy_and_torch_token_ids_are_accepted(llm) -> None:
    ids = [5, 6, 7, 8]
    expected = llm.generate([ids], GREEDY, use_tqdm=False)[0].token_ids
    for prompt in (
        np.array(ids, dtype=np.int64),
        np.array(ids, dtype=np.int32),
        tuple(ids),
        [np.int64(t) for t in ids],
        torch.tensor(ids),
    ):
        out = llm.generate([prompt], GREEDY, use_tqdm=False)[0]
        assert out.token_ids == expected
    seq_id = llm.engine.add_request(np.array(ids, dtype=np.int16), GREEDY)
    waiting = list(llm.engine.scheduler.waiting_seqs())
    assert all(type(t) is int for t in waiting[-1].token_ids), "numpy ids were queued as numpy"
    llm.engine.abort_all()
    assert seq_id >= 0
    assert_idle_and_serving(llm)


def test_text_prompts_still_work(llm) -> None:
    out = llm.generate(["hi there", [1, 2]], GREEDY, use_tqdm=False)
    assert [len(o.token_ids) for o in out] == [4, 4]


@pytest.mark.parametrize("offset", [float("nan"), float("inf")])
def test_driver_rejects_a_non_finite_arrival_instead_of_spinning(llm, offset) -> None:
    driver = EngineDriver(llm.engine)
    requests = [Request([5, 6, 7], GREEDY, 0.0), Request([5, 6], GREEDY, offset)]
    result: dict = {}

    def drive() -> None:
        try:
            driver.drive(requests, __import__("time").perf_counter(), lambda stats: None)
        except ValueError as e:
            result["error"] = str(e)

    thread = threading.Thread(target=drive, daemon=True)
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive(), "the driver spun on a non-finite arrival time"
    assert "arrival" in result["error"] and "finite" in result["error"]
    llm.engine.abort_all()
    assert_idle_and_serving(llm)


def test_close_releases_the_kv_cache_and_weights_while_the_engine_is_still_referenced(checkpoints):
    """In-process close drops the runner (no garbage collection needed): a later engine in the same
    process sizes its cache from memory that is really free; stats stay readable."""
    import gc
    import weakref

    gc.disable()
    try:
        path = checkpoints["qwen3_gqa1"][0]
        llm = LLM(path, device="cpu", dtype="float32", num_kv_blocks=32, kv_block_size=16)
        runner = llm.engine.executor.runner
        cache, weight = weakref.ref(runner.kv_cache), weakref.ref(next(runner.model.parameters()))
        del runner
        stats = llm.stats()
        llm.close()
        assert cache() is None and weight() is None
        assert llm.stats() == stats
    finally:
        gc.enable()


def test_progress_bar_is_set_at_construction_and_per_call(checkpoints, capsys) -> None:
    path = checkpoints["qwen3_gqa1"][0]
    with LLM(path, use_tqdm=False, kv_block_size=16, num_kv_blocks=16, max_model_len=128) as quiet:
        quiet.generate([[1, 2, 3]], GREEDY)
        assert "Generating" not in capsys.readouterr().err
        quiet.generate([[1, 2, 3]], GREEDY, use_tqdm=True)
        assert "Generating" in capsys.readouterr().err
        with pytest.raises(TypeError) as err:
            quiet.generate([[1, 2, 3]], GREEDY, use_tqdm="no")
        assert one_line(err) == "use_tqdm='no': must be True or False"
    with pytest.raises(TypeError) as err:
        LLM(path, use_tqdm=1)
    assert one_line(err) == "use_tqdm=1: must be True or False"
