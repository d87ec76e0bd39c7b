"""The `workload` group: one schema for every workload; its `kind` says which fields apply, each checked by
the table of its kind."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from omegaconf import MISSING

from nanoexp.config import KnobError
from nanoexp.config.checks import MAX_INT64, is_int, is_number, is_real


class WorkloadKind(Enum):
    random = "random"
    nanovllm_bench = "nanovllm_bench"
    shared_prefix = "shared_prefix"
    prompts_file = "prompts_file"
    latency = "latency"
    trace = "trace"  # timestamps and lengths of a production trace (nanoexp/experiment/measure/traces.py)
    sharegpt = "sharegpt"  # conversations of a ShareGPT-format dataset (datasets.py)
    multi_turn = "multi_turn"  # closed-loop chat sessions (sessions.py)


Check = tuple[Callable[[object], bool], str]  # (accepts the value?, what is allowed)
POSITIVE_INT: Check = (lambda v: is_int(v) and v >= 1, "an integer >= 1")
COUNT_INT: Check = (lambda v: is_int(v) and v >= 0, "an integer >= 0")
RATIO: Check = (lambda v: is_real(v) and 0 <= v < 1, "a number in [0, 1)")
BENCH_LEN: Check = (lambda v: is_int(v) and v >= 100, "an integer >= 100 (bench.py draws in [100, it])")
ARRIVALS: dict[str, Check] = {  # request_rate: a slower one overflows the clock (1e-300: arrivals at 1e300 s)
    "seed": (lambda v: is_int(v) and 0 <= v <= MAX_INT64, f"an integer in [0, {MAX_INT64}]"),
    "request_rate": (lambda v: is_real(v) and v >= 1e-3, "a number >= 0.001 requests/s (.inf = offline)"),
    "burstiness": (lambda v: is_number(v) and 1e-3 <= v <= 1e3, "a number in [0.001, 1000] (1 = Poisson)"),
    "max_concurrency": (lambda v: v is None or POSITIVE_INT[0](v), "null (unlimited) or an integer >= 1"),
}
RANDOM: dict[str, Check] = dict.fromkeys(("num_requests", "input_len", "output_len"), POSITIVE_INT) | {
    "range_ratio": RATIO,
    "output_range_ratio": (lambda v: v is None or RATIO[0](v), "null or a number in [0, 1)"),
}
TRACE_FORMATS = ("auto", "azure", "burstgpt", "mooncake")
RAMPS = ("none", "linear", "exponential")
ALL_OR_COUNT: Check = (lambda v: is_int(v) and (v == -1 or v >= 1), "-1 (all) or an integer >= 1")
SECONDS: Check = (lambda v: is_number(v) and v >= 0, "a number >= 0 (seconds)")
RAMP: dict[str, Check] = {
    "ramp": (lambda v: v in RAMPS, f"one of {', '.join(RAMPS)}"),
    "ramp_end_rate": (lambda v: v is None or (is_number(v) and v >= 1e-3), "null or a number >= 0.001"),
}
FIELDS_BY_KIND: dict[WorkloadKind, dict[str, Check]] = {  # the fields each kind uses
    WorkloadKind.random: RANDOM,
    WorkloadKind.shared_prefix: RANDOM | {"prefix_len": POSITIVE_INT, "num_prefixes": POSITIVE_INT},
    WorkloadKind.latency: dict.fromkeys(("batch_size", "input_len", "output_len", "num_iters"), POSITIVE_INT)
    | {"num_iters_warmup": COUNT_INT},
    WorkloadKind.nanovllm_bench: {"num_requests": POSITIVE_INT}
    | dict.fromkeys(("input_len", "output_len"), BENCH_LEN),
    WorkloadKind.prompts_file: {
        "num_requests": (lambda v: is_int(v) and (v == -1 or v >= 1), "-1 (all prompts) or an integer >= 1"),
        "output_len": POSITIVE_INT,
    },
    WorkloadKind.trace: {
        "format": (lambda v: v in TRACE_FORMATS, f"one of {', '.join(TRACE_FORMATS)}"),
        "num_requests": ALL_OR_COUNT,
        "time_scale": (lambda v: is_number(v) and v > 0, "a number > 0 (2 = the trace at half its rate)"),
        "start_s": SECONDS,
        "trace_block_size": POSITIVE_INT,
    },
    WorkloadKind.sharegpt: {"num_requests": POSITIVE_INT, "min_len": COUNT_INT}
    | dict.fromkeys(("max_input_len", "max_total_len"), POSITIVE_INT),
    WorkloadKind.multi_turn: dict.fromkeys(
        ("num_sessions", "num_turns", "input_len", "output_len"), POSITIVE_INT
    )
    | {"range_ratio": RATIO, "prefix_len": COUNT_INT, "think_time_s": SECONDS},
}
FILE_KINDS = {  # the kinds that read workload.path, and what it must be
    WorkloadKind.prompts_file: "a readable file (JSONL or text, one prompt a line)",
    WorkloadKind.trace: "a readable trace file (Azure or BurstGPT CSV, Mooncake JSONL)",
    WorkloadKind.sharegpt: "a readable ShareGPT-format JSON file",
}


def length_range(length: int, ratio: float) -> tuple[int, int]:
    """Lengths uniform in [len * (1 - r), len * (1 + r)] (vLLM's random dataset)."""
    return int(length * (1 - ratio)), int(length * (1 + ratio))


@dataclass
class WorkloadConfig:
    """One schema for all workloads; `kind` says which fields apply (see conf/workload/*.yaml)."""

    name: str = MISSING
    kind: WorkloadKind = WorkloadKind.random
    seed: int = 0
    num_requests: int = 8
    input_len: int = 128  # random: mean prompt length; shared_prefix: suffix length
    output_len: int = 32
    range_ratio: float = 0.0  # lengths uniform in [len * (1 - r), len * (1 + r)]
    output_range_ratio: float | None = None  # unset = range_ratio
    prefix_len: int = 0  # shared_prefix: tokens shared by every request of a group
    num_prefixes: int = 1  # shared_prefix: number of distinct prefixes
    path: str | None = None  # prompts_file: JSONL ({"prompt"|"prompt_token_ids", "max_tokens"}) or text
    ignore_eos: bool = True
    temperature: float | None = None  # set = pins the temperature (nanovllm_bench: 0.6)
    request_rate: float = float("inf")  # requests/s; inf = all at t0 (offline)
    burstiness: float = 1.0  # gamma shape of inter-arrival times; 1 = Poisson
    max_concurrency: int | None = None  # most requests in the engine at once; null = unlimited
    batch_size: int = 8  # latency: requests per iteration (vllm bench latency's defaults, as the next two)
    num_iters: int = 30  # latency: timed iterations
    num_iters_warmup: int = 10  # latency: untimed iterations
    format: str = "auto"  # trace: azure, burstgpt or mooncake (auto: from the file's header)
    time_scale: float = 1.0  # trace: its inter-arrival times times this (2 = half its rate)
    start_s: float = 0.0  # trace: skip its first start_s seconds (the window starts there)
    model_filter: str | None = None  # trace, burstgpt: only the rows of this Model (ChatGPT, GPT-4)
    trace_block_size: int = 512  # trace, mooncake: tokens per hash_ids block
    min_len: int = 4  # sharegpt: drop conversations whose prompt or output is shorter
    max_input_len: int = 1024  # sharegpt: ... or whose prompt is longer
    max_total_len: int = 2048  # sharegpt: ... or whose prompt + output is longer
    num_sessions: int = 8  # multi_turn: sessions, started at request_rate
    num_turns: int = 4  # multi_turn: turns per session
    think_time_s: float = 0.0  # multi_turn: mean (exponential) pause between an answer and the next turn
    ramp: str = "none"  # arrivals' rate from request_rate to ramp_end_rate: none, linear or exponential
    ramp_end_rate: float | None = None

    def __post_init__(self) -> None:  # checks every field the workload's kind uses; reports the first bad one
        for name, (ok, allowed) in (ARRIVALS | FIELDS_BY_KIND[WorkloadKind(self.kind)]).items():
            value = getattr(self, name)
            if not ok(value):
                raise KnobError(f"workload.{name}", value, allowed)
        if self.kind in (WorkloadKind.random, WorkloadKind.shared_prefix):  # a 0-token range is an error
            out_ratio = "range_ratio" if self.output_range_ratio is None else "output_range_ratio"
            for name, ratio_name in (("input_len", "range_ratio"), ("output_len", out_ratio)):
                length, ratio = getattr(self, name), getattr(self, ratio_name)
                if length_range(length, ratio)[0] < 1:
                    allowed = f"small enough that {name}={length} * (1 - {ratio_name}) >= 1"
                    raise KnobError(f"workload.{ratio_name}", ratio, allowed)
        self._check_ramp()
        readable = self.path and Path(self.path).is_file() and os.access(self.path, os.R_OK)
        if WorkloadKind(self.kind) in FILE_KINDS and not readable:
            raise KnobError("workload.path", self.path, FILE_KINDS[WorkloadKind(self.kind)])

    def _check_ramp(self) -> None:
        for name, (ok, allowed) in RAMP.items():
            if not ok(getattr(self, name)):
                raise KnobError(f"workload.{name}", getattr(self, name), allowed)
        if self.ramp == "none":
            return
        if WorkloadKind(self.kind) in (WorkloadKind.trace, WorkloadKind.latency):
            raise KnobError(
                "workload.ramp", self.ramp, f"none with workload.kind={WorkloadKind(self.kind).value}"
            )
        if math.isinf(self.request_rate) or self.ramp_end_rate is None:
            allowed = "none unless workload.request_rate and workload.ramp_end_rate are finite rates"
            raise KnobError("workload.ramp", self.ramp, allowed)
