"""ShareGPT-format datasets: the first human turn is the prompt, the next model turn's token count the output
length; seeded order, vLLM's length filters, and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nanoexp.experiment.measure.datasets import sharegpt_prompts
from nanoexp.experiment.measure.workloads import build_workload
from nanoexp.experiment.schema import ConfigError, SamplerConfig, WorkloadConfig, WorkloadKind

WORDS = lambda text: [len(word) for word in text.split()]  # a tokenizer: one token per word


def conversation(*turns: tuple[str, str]) -> dict:
    return {"id": "x", "conversations": [{"from": who, "value": text} for who, text in turns]}


DATA = [
    conversation(("human", "a b c d e"), ("gpt", "one two three four five six")),
    conversation(("system", "be brief"), ("human", "p q r s"), ("gpt", "w x y z"), ("human", "more please")),
    conversation(("human", "too short"), ("gpt", "a b c d")),  # a 2-token prompt: filtered
    conversation(
        ("gpt", "no human turn first"),
    ),
    conversation(("human", " ".join(["w"] * 30)), ("gpt", "a b c d e")),  # prompt over max_input_len=20
    {
        "conversations": [
            {"role": "user", "content": "u v w x y z"},
            {"role": "assistant", "content": "k l m n"},
        ]
    },
]


def dataset(tmp_path: Path, data=DATA, **knobs) -> WorkloadConfig:
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(data))
    knobs = {"num_requests": 3, "max_input_len": 20} | knobs
    return WorkloadConfig(name="sharegpt", kind=WorkloadKind.sharegpt, path=str(path), **knobs)


def test_first_human_turn_is_the_prompt_and_the_answer_sets_the_output_length(tmp_path: Path) -> None:
    prompts, out_lens, origins = sharegpt_prompts(dataset(tmp_path), WORDS)
    by_origin = dict(zip(origins, zip(prompts, out_lens)))
    assert sorted(by_origin) == ["sharegpt.json#0", "sharegpt.json#1", "sharegpt.json#5"]
    assert by_origin["sharegpt.json#0"] == ([1] * 5, 6)
    assert by_origin["sharegpt.json#1"] == ([1] * 4, 4)  # the system turn is skipped
    assert by_origin["sharegpt.json#5"] == ([1] * 6, 4)  # role/content spelling


def test_the_seed_sets_the_order(tmp_path: Path) -> None:
    data = [conversation(("human", "a " * (4 + i)), ("gpt", "b " * 4)) for i in range(12)]
    orders = {seed: sharegpt_prompts(dataset(tmp_path, data, seed=seed), WORDS)[2] for seed in (0, 0, 1)}
    assert len(orders) == 2 and orders[0] != orders[1]
    assert sharegpt_prompts(dataset(tmp_path, data, seed=1), WORDS)[2] == orders[1]


def test_the_workload_generates_each_answer_to_its_length(tmp_path: Path) -> None:
    workload = build_workload(dataset(tmp_path), SamplerConfig(), 1024, WORDS)
    answers = {"sharegpt.json#0": 6, "sharegpt.json#1": 4, "sharegpt.json#5": 4}
    assert {r.origin: r.sampling_params.max_tokens for r in workload.requests} == answers
    assert all(r.sampling_params.ignore_eos for r in workload.requests)


def test_too_few_conversations_name_the_filters(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"workload.num_requests=5: only 3 of the 5 conversations .* pass"):
        sharegpt_prompts(dataset(tmp_path, num_requests=5), WORDS)


def test_no_tokenizer_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="workload=sharegpt counts tokens with the checkpoint's tokenizer"):
        sharegpt_prompts(dataset(tmp_path), None)


def test_not_json_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text("[{oops\n")
    w = WorkloadConfig(name="sharegpt", kind=WorkloadKind.sharegpt, path=str(path))
    with pytest.raises(ConfigError, match=r"workload.path=.*bad.json: not ShareGPT JSON"):
        sharegpt_prompts(w, WORDS)
