"""Trace replay: Azure, BurstGPT and Mooncake files become arrival offsets and lengths; Mooncake prompts
share exactly their common hash_ids blocks; bad files are one line naming the key."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from nanoexp.config import KnobError, SamplingParams
from nanoexp.experiment.measure.driver import EngineDriver
from nanoexp.experiment.measure.traces import native_rate, trace_workload
from nanoexp.experiment.measure.workloads import Request
from nanoexp.experiment.schema import ConfigError, WorkloadConfig, WorkloadKind

PARAMS = lambda m, i: SamplingParams(max_tokens=m, ignore_eos=True)
AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,40,5
2023-11-16 18:15:46.7005900,12,3
2023-11-16 18:15:46.8805901,80,7
2023-11-16 18:15:47.0000000,0,7
2023-11-16 18:15:48.1234567,33,4
"""
BURSTGPT = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,100,20,120,Conversation log
5.25,GPT-4,30,9,39,Conversation log
7.5,ChatGPT,16,2,18,API log
8.125,GPT-4,64,0,64,API log
9.0,GPT-4,50,11,61,Conversation log
"""


def trace(tmp_path: Path, text: str, name: str, **knobs) -> tuple[WorkloadConfig, Path]:
    path = tmp_path / name
    path.write_text(text)
    return WorkloadConfig(name="trace", kind=WorkloadKind.trace, path=str(path), **knobs), path


def mooncake_text(rows: list[tuple[float, int, int, list[int]]]) -> str:
    keys = ("timestamp", "input_length", "output_length", "hash_ids")
    return "".join(json.dumps(dict(zip(keys, row))) + "\n" for row in rows)


def test_azure_offsets_are_the_timestamps_scaled_and_lengths_the_trace(tmp_path: Path) -> None:
    w, _ = trace(tmp_path, AZURE, "azure.csv", time_scale=2.0)
    workload = trace_workload(w, PARAMS, 1024)
    expected = [0.0, 0.02, 0.2000001, 1.4428667]  # the zero-length row is skipped
    assert [r.arrival_offset_s for r in workload.requests] == pytest.approx(
        [2 * t for t in expected], abs=5e-4
    )
    assert [len(r.prompt_token_ids) for r in workload.requests] == [40, 12, 80, 33]
    assert [r.sampling_params.max_tokens for r in workload.requests] == [5, 3, 7, 4]
    assert [r.origin for r in workload.requests] == [
        "azure.csv:2",
        "azure.csv:3",
        "azure.csv:4",
        "azure.csv:6",
    ]
    assert workload.facts["trace_format"] == "azure" and workload.facts["trace_rows_skipped"] == 1
    assert workload.facts["offered_request_rate"] == pytest.approx(3 / (2 * 1.4428667))


def test_burstgpt_model_filter_and_window(tmp_path: Path) -> None:
    w, _ = trace(tmp_path, BURSTGPT, "burst.csv", model_filter="GPT-4")
    workload = trace_workload(w, PARAMS, 1024)
    assert [r.arrival_offset_s for r in workload.requests] == pytest.approx([0.0, 3.75])
    assert [len(r.prompt_token_ids) for r in workload.requests] == [30, 50]
    w, _ = trace(tmp_path, BURSTGPT, "burst.csv", start_s=0.2, num_requests=2)  # from 5.2 s: rows 3 and 4
    workload = trace_workload(w, PARAMS, 1024)
    assert [r.origin for r in workload.requests] == ["burst.csv:3", "burst.csv:4"]
    assert [r.arrival_offset_s for r in workload.requests] == pytest.approx([0.0, 2.25])
    assert native_rate(w) == pytest.approx(1 / 2.25)


def test_mooncake_prompts_share_exactly_their_common_hash_blocks(tmp_path: Path) -> None:
    rows = [
        (0, 3 * 32 + 5, 4, [7, 8, 9]),
        (1500, 3 * 32 + 9, 2, [7, 8, 4]),
        (2000, 40, 2, [7]),
        (2500, 50, 2, []),
    ]
    w, _ = trace(tmp_path, mooncake_text(rows), "mooncake.jsonl", trace_block_size=32)
    workload = trace_workload(w, PARAMS, 1024)
    prompts = [r.prompt_token_ids for r in workload.requests]
    assert [len(p) for p in prompts] == [101, 105, 40, 50]
    assert [r.arrival_offset_s for r in workload.requests] == pytest.approx([0.0, 1.5, 2.0, 2.5])

    def common(a: list[int], b: list[int]) -> int:
        return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))

    assert common(prompts[0], prompts[1]) == 64  # two blocks, parted within the third's first tokens
    assert common(prompts[0], prompts[2]) == 32 and common(prompts[1], prompts[2]) == 32
    assert common(prompts[0], prompts[3]) == 0


def test_tokens_stay_inside_a_small_vocabulary(tmp_path: Path) -> None:
    rows = [(i * 10, 70, 2, [i * 5000, 3]) for i in range(4)]
    w, _ = trace(tmp_path, mooncake_text(rows), "m.jsonl", trace_block_size=16)
    prompts = [r.prompt_token_ids for r in trace_workload(w, PARAMS, 64).requests]
    assert all(0 <= t < 64 for p in prompts for t in p)
    assert len({tuple(p[:16]) for p in prompts}) == 4  # distinct hashes, distinct blocks


@pytest.mark.parametrize(
    ("text", "name", "knobs", "message"),
    [
        (
            "TIMESTAMP,ContextTokens\n2023-11-16 18:15:46,3\n",
            "a.csv",
            {"format": "azure"},
            "workload.format=azure: a.csv lacks the column(s) GeneratedTokens",
        ),
        (
            AZURE,
            "a.csv",
            {"format": "burstgpt"},
            "workload.format=burstgpt: a.csv lacks the column(s) Timestamp",
        ),
        (AZURE, "a.csv", {"format": "mooncake"}, "workload.format=mooncake: a.csv:1 is not JSON"),
        ("a,b\n1,2\n", "a.csv", {}, "workload.format=auto: cannot tell the format"),
        (AZURE.replace("12,3", "x,3"), "a.csv", {}, "a.csv:3: ContextTokens='x' is invalid"),
        (AZURE.replace("46.70", "4x.70"), "a.csv", {}, "a.csv:3: TIMESTAMP='2023-11-16 18:15:4x.7005900'"),
        (BURSTGPT, "b.csv", {"model_filter": "GPT-5"}, "workload.model_filter='GPT-5': no row of"),
        (AZURE, "a.csv", {"model_filter": "GPT-4"}, "workload.model_filter='GPT-4': only a burstgpt trace"),
        ('{"timestamp": 1, "input_length": 3}\n', "m.jsonl", {}, "m.jsonl:1 lacks output_length"),
        (AZURE, "a.csv", {"start_s": 60.0}, "workload.start_s=60.0: past the trace's end"),
        (
            AZURE.splitlines()[0] + "\n",
            "a.csv",
            {},
            "workload.path=a.csv: the azure trace has a header and no rows",
        ),
        (
            BURSTGPT.splitlines()[0] + "\n",
            "b.csv",
            {"model_filter": "GPT-4"},
            "the burstgpt trace has a header",
        ),
    ],
)
def test_bad_traces_are_one_line_naming_the_key(tmp_path, text, name, knobs, message) -> None:
    w, path = trace(tmp_path, text, name, **knobs)
    with pytest.raises(ConfigError) as err:
        trace_workload(w, PARAMS, 1024)
    line = str(err.value).replace(f"{path.parent}/", "")  # the file as named in the line, without its dir
    assert message in line and "\n" not in line


def test_a_missing_trace_file_names_workload_path(tmp_path: Path) -> None:
    with pytest.raises(
        KnobError, match=r"workload.path='.*nope.csv' is invalid: must be a readable trace file"
    ):
        WorkloadConfig(name="trace", kind=WorkloadKind.trace, path=str(tmp_path / "nope.csv"))


class RefusingEngine:
    def add_request(self, prompt, params, arrival_time=None) -> int:
        raise ValueError("request 0: prompt + max_tokens = 900 tokens exceeds the whole KV cache (64 tokens)")

    def has_unfinished(self) -> bool:
        return False


def test_an_engine_refusal_names_the_trace_line() -> None:
    request = Request([1, 2], SamplingParams(max_tokens=2), 0.0, "azure.csv:7")
    with pytest.raises(ValueError, match=r"^azure.csv:7: request 0: prompt \+ max_tokens = 900"):
        EngineDriver(RefusingEngine()).drive([request], time.perf_counter(), lambda s: None)
