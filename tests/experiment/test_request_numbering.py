"""Requests are numbered as the user knows them (their index in the workload, with file and line from a
prompts file), never by the engine's internal ids, which the untimed warm-up request shifts."""

from __future__ import annotations

import pytest

from nanoexp import LLM, SamplingParams
from nanoexp.experiment.job.main import warm_up
from nanoexp.experiment.measure.driver import EngineDriver
from nanoexp.experiment.measure.workloads import Request, Workload, request_label

PARAMS = SamplingParams(temperature=0.0, max_tokens=3)


class RefusingEngine:
    def check_request(self, name, prompt, params):
        raise ValueError(f"{name}: refused")


def test_the_warm_up_request_is_named_as_such_never_as_a_number() -> None:
    first = Request([1, 2, 3], PARAMS, source_file="p.jsonl", source_line=7)
    with pytest.raises(ValueError) as info:
        warm_up(EngineDriver(RefusingEngine()), Workload("w", [first]))
    assert str(info.value) == "the untimed warm-up request (from request 0 (p.jsonl:7)): refused"


def test_labels_carry_the_source_line_only_when_there_is_one() -> None:
    assert request_label(3, Request([1], PARAMS)) == "request 3"
    assert request_label(0, Request([1], PARAMS, source_file="a.txt", source_line=2)) == "request 0 (a.txt:2)"


def test_outputs_carry_the_workload_index_after_a_warm_up(checkpoints) -> None:
    with LLM(checkpoints["qwen3_gqa1"][0], kv_block_size=16) as llm:
        driver = EngineDriver(llm.engine)
        requests = [Request([5, 6, 7], PARAMS), Request([8, 9], PARAMS), Request([10], PARAMS)]
        driver.drive(requests[:1], 0.0, lambda s: None)  # the warm-up takes engine id 0
        outputs = driver.drive(requests, 0.0, lambda s: None)
        assert sorted(o.request_id for o in outputs) == [0, 1, 2]
        assert {o.request_id: len(o.prompt_token_ids) for o in outputs} == {0: 3, 1: 2, 2: 1}
