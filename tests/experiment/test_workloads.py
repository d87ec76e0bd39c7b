"""Workload fields and prompts files: every bad value is a one-line error naming the field (or the
file and its 1-based line) and what is allowed; nothing is clamped, wrapped or coerced."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from nanoexp.experiment.measure.workloads import build_workload, nanovllm_bench_prompts
from nanoexp.experiment.schema import SamplerConfig, WorkloadConfig, WorkloadKind

VOCAB = 384


def build(**fields):
    fields.setdefault("kind", WorkloadKind.random)
    fields.setdefault("input_len", 16)
    fields.setdefault("output_len", 4)
    fields.setdefault("prefix_len", 8)
    return build_workload(WorkloadConfig(name="t", **fields), SamplerConfig(), VOCAB)


def error(**fields) -> str:
    with pytest.raises(ValueError) as info:
        build(**fields)
    message = str(info.value)
    assert "\n" not in message, message
    return message


@pytest.mark.parametrize(
    ("field", "value", "kind"),
    [
        ("request_rate", math.nan, WorkloadKind.random),
        ("request_rate", -1.0, WorkloadKind.random),
        ("request_rate", 0.0, WorkloadKind.random),
        ("burstiness", 0.0, WorkloadKind.random),
        ("burstiness", -1.0, WorkloadKind.random),
        ("burstiness", math.nan, WorkloadKind.random),
        ("num_requests", 0, WorkloadKind.random),
        ("num_requests", -3, WorkloadKind.random),
        ("num_requests", 0, WorkloadKind.prompts_file),
        ("batch_size", 0, WorkloadKind.latency),
        ("input_len", 0, WorkloadKind.random),
        ("input_len", 0, WorkloadKind.latency),
        ("output_len", 0, WorkloadKind.random),
        ("output_len", 0, WorkloadKind.shared_prefix),
        ("range_ratio", 2.0, WorkloadKind.random),
        ("range_ratio", 1.0, WorkloadKind.random),
        ("range_ratio", -0.5, WorkloadKind.random),
        ("output_range_ratio", 1.5, WorkloadKind.random),
        ("prefix_len", 0, WorkloadKind.shared_prefix),
        ("num_prefixes", 0, WorkloadKind.shared_prefix),
        ("input_len", 50, WorkloadKind.nanovllm_bench),
    ],
)
def test_bad_field_names_the_field_and_what_is_allowed(field, value, kind, tmp_path):
    extra = {}
    if kind is WorkloadKind.prompts_file:
        extra = {"path": str(prompts(tmp_path, ['{"prompt_token_ids": [1]}']))}
    message = error(kind=kind, **{field: value}, **extra)
    assert f"workload.{field}=" in message and "must be" in message


def test_range_ratio_that_would_make_empty_prompts_is_an_error_not_a_clamp():
    message = error(input_len=1, range_ratio=0.5)
    assert "workload.range_ratio" in message and "input_len=1" in message


def test_offline_rate_and_numpy_integers_are_accepted():
    workload = build(request_rate=math.inf, num_requests=np.int64(3), input_len=np.int32(5))
    assert len(workload.requests) == 3 and all(r.arrival_offset_s == 0 for r in workload.requests)
    assert all(len(r.prompt_token_ids) == 5 for r in workload.requests)


def test_generated_ids_are_drawn_inside_a_small_vocabulary():
    prompts, _ = nanovllm_bench_prompts(num=4, max_input=200, max_output=100, vocab=50)
    assert all(0 <= t < 50 for p in prompts for t in p)
    assert max(t for p in prompts for t in p) >= 40  # drawn across the vocabulary, not folded into it
    bench = build(kind=WorkloadKind.nanovllm_bench, num_requests=4, input_len=200, output_len=100)
    assert all(0 <= t < VOCAB for r in bench.requests for t in r.prompt_token_ids)


def prompts(tmp_path, lines: list[str], name: str = "prompts.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def file_error(tmp_path, lines: list[str]) -> str:
    path = prompts(tmp_path, lines)
    message = error(kind=WorkloadKind.prompts_file, path=str(path), num_requests=-1)
    assert str(path) in message
    return message


GOOD = '{"prompt_token_ids": [1, 2, 3]}'


def test_malformed_json_names_the_file_and_its_line(tmp_path):
    assert ":3:" in file_error(tmp_path, [GOOD, GOOD, '{"prompt_token_ids": [1, 2'])


def test_a_blank_line_among_the_prompts_is_an_error_naming_it(tmp_path):
    assert ":2: a blank line" in file_error(tmp_path, [GOOD, "", GOOD, '{"prompt_token_ids": [1, 2'])


def test_a_line_that_is_not_an_object(tmp_path):
    assert ":2:" in file_error(tmp_path, [GOOD, "[1, 2, 3]"])


@pytest.mark.parametrize("value", ['"abc"', "2.5", "0", "-1", "true"])
def test_bad_max_tokens(tmp_path, value):
    message = file_error(tmp_path, [GOOD, f'{{"prompt_token_ids": [1], "max_tokens": {value}}}'])
    assert ":2:" in message and "max_tokens" in message


@pytest.mark.parametrize("ids", ["[1, 384]", "[-1]", "[1.5]", '["7"]', "[true]", "[]", "[null]"])
def test_token_ids_outside_the_vocabulary_or_not_ints_are_errors_never_wrapped(tmp_path, ids):
    message = file_error(tmp_path, [f'{{"prompt_token_ids": {ids}, "max_tokens": 2}}'])
    assert ":1:" in message and "prompt_token_ids" in message


def test_missing_prompt(tmp_path):
    assert ":1:" in file_error(tmp_path, ['{"max_tokens": 2}'])


def test_text_prompts_without_a_tokenizer_name_the_line(tmp_path):
    assert ":1:" in file_error(tmp_path, ['{"prompt": "hello"}'])


def test_user_token_ids_are_kept_exactly(tmp_path):
    ids = [0, 5, VOCAB - 1]
    path = prompts(tmp_path, [json.dumps({"prompt_token_ids": ids, "max_tokens": 3})])
    workload = build(kind=WorkloadKind.prompts_file, path=str(path), num_requests=-1)
    assert workload.requests[0].prompt_token_ids == ids
    assert workload.requests[0].sampling_params.max_tokens == 3


def test_binary_or_non_utf8_bytes_name_the_file_line_and_column(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(GOOD.encode() + b"\n" + b'{"prompt": "caf\xe9"}\n')
    message = error(kind=WorkloadKind.prompts_file, path=str(path), num_requests=-1)
    assert f"{path}:2: not UTF-8 text (byte 0xe9 at column 16)" in message
    (tmp_path / "blob.txt").write_bytes(bytes(range(256)))
    message = error(kind=WorkloadKind.prompts_file, path=str(tmp_path / "blob.txt"), num_requests=-1)
    assert "blob.txt:3: not UTF-8 text (byte 0x80" in message  # after its newline and return bytes


def test_deeply_nested_json_names_the_line(tmp_path):
    deep = '{"prompt": ' + "[" * 100_000 + "]" * 100_000 + "}"
    assert ":2: JSON nested too deeply" in file_error(tmp_path, [GOOD, deep])


def test_a_lone_surrogate_names_the_line(tmp_path):
    message = file_error(tmp_path, [GOOD, GOOD, '{"prompt": "ab\\ud800c"}'])
    assert ":3: the prompt holds a lone surrogate" in message


@pytest.mark.parametrize("ids", ['"123"', "123", '{"0": 1}', "null"])
def test_token_ids_that_are_not_a_list_are_an_error_not_text(tmp_path, ids):
    message = file_error(tmp_path, [f'{{"prompt_token_ids": {ids}}}'])
    assert ":1: prompt_token_ids must be a list of ints" in message


def test_prompt_and_token_ids_together_are_an_error(tmp_path):
    assert ":1: has both" in file_error(tmp_path, ['{"prompt": "a", "prompt_token_ids": [1]}'])
