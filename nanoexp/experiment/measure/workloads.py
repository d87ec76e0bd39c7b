"""Workloads: a workload config (plus sampler) becomes a list of requests with arrival offsets."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from nanoexp.config import SamplingParams
from nanoexp.config.checks import is_int, machine_memory_gb
from nanoexp.engine.outputs import RequestOutput
from nanoexp.experiment.schema import ConfigError, SamplerConfig, WorkloadConfig, WorkloadKind, length_range

Tokenize = Callable[[str], list[int]]
Prompts = tuple[list[list[int]], list[int]]  # each request's prompt token ids and max_tokens
TOKEN_ID_HIGH = 10000  # random prompts use ids below this (ordinary tokens), as nano-vLLM's bench
# A prompt token id in host memory: a Python int (28 bytes) and its list slot (8), held by the workload and
# again by the engine's sequence
HOST_BYTES_PER_TOKEN = 72


@dataclass(frozen=True)
class Request:
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_offset_s: float = 0.0  # seconds after the workload starts
    source_file: str = ""  # where it came from (a prompts file, a trace, a dataset), for errors and outputs
    source_line: int = 0  # its line there, from 1 (0: a source without lines, e.g. a dataset's conversation)
    session: int | None = None  # multi_turn: its session and turn (from 1)
    turn: int | None = None

    @property
    def origin(self) -> str:
        """`file:line` (or the source alone), as errors, requests.csv and outputs.jsonl name it."""
        if not self.source_file:
            return ""
        return f"{self.source_file}:{self.source_line}" if self.source_line else self.source_file


def request_label(index: int, request: Request) -> str:
    """How errors name a workload's request: its index in the workload (what outputs.jsonl and
    requests.csv call `request_id`) and where it came from."""
    where = f" ({request.origin})" if request.origin else ""
    return f"request {index}{where}"


# closed loop: (finished request, its output, its finish in seconds after t0) -> the request it brings
FollowUp = Callable[[Request, RequestOutput, float], "Request | None"]


@dataclass
class Workload:
    name: str
    requests: list[Request]  # those known up front (multi_turn: each session's first turn)
    num_iters: int = 1  # >1 or warm-up iterations: latency mode, the same batch run repeatedly
    num_iters_warmup: int = 0
    follow_up: FollowUp | None = None
    num_total: int | None = None  # requests with the follow-ups (None: len(requests))
    longest: int | None = None  # the longest request's prompt + max_tokens, when follow-ups grow them
    offered_rates: list[float] | None = None  # the rate each request's arrival was drawn at (None: trace)
    facts: dict = field(default_factory=dict)  # what building it found (a trace's rate and window)

    @property
    def num_requests(self) -> int:
        return len(self.requests) if self.num_total is None else self.num_total

    @property
    def latency_mode(self) -> bool:
        return self.num_iters > 1 or self.num_iters_warmup > 0


def build_workload(
    w: WorkloadConfig, sampler: SamplerConfig, vocab_size: int, tokenize: Tokenize | None = None
) -> Workload:
    """Build the requests of workload `w`; random token ids are drawn inside [0, vocab_size). (trace and
    multi_turn have their own modules, which build on this one: build.build_workload picks.)"""
    if w.kind in (WorkloadKind.trace, WorkloadKind.multi_turn):
        raise ValueError(
            f"workload.kind={w.kind.value} is built by nanoexp.experiment.job.build.build_workload"
        )
    if w.kind is WorkloadKind.sharegpt:
        from nanoexp.experiment.measure.datasets import sharegpt_prompts

        prompts, max_tokens, origins = sharegpt_prompts(w, tokenize)
    else:
        prompts, max_tokens = _prompts(w, vocab_size, tokenize)
        origins = [""] * len(prompts)
    params = [sampling_params(w, sampler, m, i) for i, m in enumerate(max_tokens)]
    rates = offered_rates(len(prompts), w.request_rate, w.ramp, w.ramp_end_rate)
    ramp = rates if w.ramp != "none" else None
    offsets = arrival_offsets(len(prompts), w.request_rate, w.burstiness, w.seed, ramp)
    requests = [
        Request(p, sp, o, source_file=org) for p, sp, o, org in zip(prompts, params, offsets, origins)
    ]
    if w.kind is WorkloadKind.prompts_file:
        lines, source = prompt_lines(w), str(w.path)
        requests = [replace(r, source_file=source, source_line=n) for r, n in zip(requests, lines)]
    iters = (w.num_iters, w.num_iters_warmup) if w.kind is WorkloadKind.latency else (1, 0)
    return Workload(w.name, requests, *iters, offered_rates=rates)


def _prompts(w: WorkloadConfig, vocab: int, tokenize: Tokenize | None) -> Prompts:
    check_fits_in_memory(w)
    if w.kind is WorkloadKind.nanovllm_bench:
        return nanovllm_bench_prompts(w.num_requests, w.input_len, w.output_len, w.seed, vocab)
    if w.kind is WorkloadKind.random:
        return random_prompts(w, w.num_requests, vocab)
    if w.kind is WorkloadKind.shared_prefix:  # num_prefixes prefixes, round-robin, before each suffix
        rng, high = np.random.default_rng(w.seed), min(vocab, TOKEN_ID_HIGH)
        prefixes = [rng.integers(0, high, size=w.prefix_len).tolist() for _ in range(w.num_prefixes)]
        suffixes, out_lens = random_prompts(w, w.num_requests, vocab)
        return [prefixes[i % w.num_prefixes] + s for i, s in enumerate(suffixes)], out_lens
    if w.kind is WorkloadKind.latency:  # one batch, every prompt and output of the same length
        return random_prompts(replace(w, range_ratio=0.0, output_range_ratio=None), w.batch_size, vocab)
    return file_prompts(w, tokenize, vocab)


def check_fits_in_memory(w: WorkloadConfig) -> None:
    """A synthetic workload whose prompts alone would fill half this machine's memory is a config error
    naming the key that sized it, before any is drawn (instead of a machine swapping until killed)."""
    latency = w.kind is WorkloadKind.latency
    count_key, count = (
        ("workload.batch_size", w.batch_size) if latency else ("workload.num_requests", w.num_requests)
    )
    if w.kind is WorkloadKind.prompts_file or count <= 0:
        return  # a file's prompts are as large as the file
    tokens = w.input_len + (w.prefix_len if w.kind is WorkloadKind.shared_prefix else 0)
    gib, memory = count * tokens * HOST_BYTES_PER_TOKEN / 2**30, machine_memory_gb()
    if gib > memory / 2:
        raise ConfigError(
            f"{count_key}={count} of ~{tokens}-token prompts would hold ~{gib:.3g} GiB of token ids in host "
            f"memory, over half of this machine's {memory:.3g} GiB: lower {count_key} or workload.input_len"
        )


def nanovllm_bench_prompts(
    num: int = 256, max_input: int = 1024, max_output: int = 1024, seed: int = 0, vocab: int | None = None
) -> Prompts:
    """nano-vLLM's bench.py, call for call (ids below a smaller vocabulary than 10000 change its lengths)."""
    rng = random.Random(seed)
    top = TOKEN_ID_HIGH if vocab is None else min(TOKEN_ID_HIGH, vocab - 1)
    prompts = [[rng.randint(0, top) for _ in range(rng.randint(100, max_input))] for _ in range(num)]
    max_tokens = [rng.randint(100, max_output) for _ in range(num)]
    return prompts, max_tokens


def random_prompts(w: WorkloadConfig, num: int, vocab: int) -> Prompts:
    """vLLM's random dataset: lengths uniform in [len * (1 - r), len * (1 + r)]."""
    rng = np.random.default_rng(w.seed)
    out_ratio = w.range_ratio if w.output_range_ratio is None else w.output_range_ratio
    ranges = (length_range(w.input_len, w.range_ratio), length_range(w.output_len, out_ratio))
    in_lens, out_lens = (rng.integers(low, high + 1, size=num).tolist() for low, high in ranges)
    return [rng.integers(0, min(vocab, TOKEN_ID_HIGH), size=n).tolist() for n in in_lens], out_lens


def file_prompts(w: WorkloadConfig, tokenize: Tokenize | None, vocab: int) -> Prompts:
    """JSONL lines {"prompt": str} | {"prompt_token_ids": [...]} (+ "max_tokens"), or text lines;
    bytes that are not UTF-8 are an error naming the line, in any line of the file."""
    numbered, path = numbered_lines(w), Path(str(w.path))  # WorkloadConfig requires it for prompts_file
    items = [_file_request(path, i, ln, w.output_len, tokenize, vocab) for i, ln in numbered]
    return [p for p, _ in items], [m for _, m in items]


def prompt_lines(w: WorkloadConfig) -> list[int]:
    """The line (from 1) each request of a prompts file comes from."""
    return [number for number, _ in numbered_lines(w)]


def numbered_lines(w: WorkloadConfig) -> list[tuple[int, str]]:
    """The prompts' lines with their numbers: every line up to the last non-blank one (blank lines at the
    end are not prompts), at most `num_requests`; a blank line among them is an error, as an empty prompt."""
    path, lines = Path(str(w.path)), []
    for number, raw in enumerate(path.read_bytes().splitlines(), 1):
        try:
            lines.append((number, raw.decode("utf-8")))
        except UnicodeDecodeError as err:
            raise ConfigError(
                f"{path}:{number}: not UTF-8 text (byte 0x{raw[err.start]:02x} at column {err.start + 1}); "
                "a prompts file is JSONL or text, one prompt a line"
            ) from None
    while lines and not lines[-1][1].strip():
        lines.pop()
    limit = w.num_requests if w.num_requests > 0 else None  # -1: every prompt
    numbered = lines[:limit]
    if not numbered:
        raise ConfigError(f"workload.path={w.path!r}: no prompts in the file")
    blank = next((number for number, line in numbered if not line.strip()), None)
    if blank is not None:
        raise ConfigError(
            f"{path}:{blank}: a blank line, i.e. an empty prompt; a prompts file holds one prompt a line "
            "(remove the line, so each request keeps its line number)"
        )
    return numbered


def _file_request(
    path: Path, line_no: int, line: str, default_max: int, tokenize: Tokenize | None, vocab: int
) -> tuple[list[int], int]:
    where = f"{path}:{line_no}"
    if path.suffix != ".jsonl":
        return _tokenized(line, tokenize, where), default_max
    try:
        item = json.loads(line)
    except json.JSONDecodeError as err:
        raise ConfigError(f"{where}: not valid JSON ({err.msg} at column {err.colno})") from None
    except RecursionError:
        raise ConfigError(f"{where}: JSON nested too deeply; a line is one flat object") from None
    if not isinstance(item, dict):
        raise ConfigError(f'{where}: must be a JSON object like {{"prompt": "..."}}, got {line[:80]}')
    max_tokens = item.get("max_tokens", default_max)
    if not is_int(max_tokens) or max_tokens < 1:
        raise ConfigError(f"{where}: max_tokens={max_tokens!r} is invalid: must be an integer >= 1")
    if "prompt_token_ids" in item and "prompt" in item:
        raise ConfigError(f"{where}: has both 'prompt' and 'prompt_token_ids'; give one")
    if "prompt_token_ids" in item:
        return _checked_ids(item["prompt_token_ids"], vocab, where), int(max_tokens)
    prompt = item.get("prompt")
    if isinstance(prompt, str):
        return _tokenized(prompt, tokenize, where), int(max_tokens)
    raise ConfigError(
        f"{where}: needs 'prompt' (a string) or 'prompt_token_ids' (a list of ints), got {prompt!r:.80}"
    )


def _checked_ids(ids: object, vocab: int, where: str) -> list[int]:
    if not isinstance(ids, list):
        raise ConfigError(f"{where}: prompt_token_ids must be a list of ints, got {ids!r:.80}")
    if not ids:
        raise ConfigError(f"{where}: prompt_token_ids is empty: a prompt needs at least one token")
    for pos, t in enumerate(ids):
        if not is_int(t) or not 0 <= t < vocab:
            raise ConfigError(
                f"{where}: prompt_token_ids[{pos}]={t!r} is invalid: must be an integer in [0, {vocab})"
            )
    return [int(t) for t in ids]


def _tokenized(text: str, tokenize: Tokenize | None, where: str) -> list[int]:
    try:  # a lone surrogate (JSON "\\ud800" without its pair) is not text
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ConfigError(
            f"{where}: the prompt holds a lone surrogate ({text[err.start]!r} at character "
            f"{err.start}), which is not valid Unicode text"
        ) from None
    if tokenize is None:
        raise ConfigError(
            f"{where}: a text prompt, but the model has no tokenizer "
            "(dummy weights): use prompt_token_ids or a real checkpoint"
        )
    ids = tokenize(text)
    if not ids:
        raise ConfigError(f"{where}: the prompt is empty (no tokens)")
    return ids


def arrival_offsets(
    num: int, rate: float, burstiness: float, seed: int, rates: list[float] | None = None
) -> list[float]:
    """All zero when offline (rate=inf); else gamma inter-arrival times (burstiness 1 = Poisson), the gap
    before request i drawn at `rates[i]` when given (a ramp, as `vllm bench serve --ramp-up-strategy`)."""
    if math.isinf(rate):
        return [0.0] * num
    rng = np.random.default_rng(seed + 1)
    scale = 1.0 / (np.asarray(rates, dtype=float) * burstiness) if rates else 1.0 / (rate * burstiness)
    gaps = rng.gamma(shape=burstiness, scale=scale, size=num)
    if num:
        gaps[0] = 0.0
    return np.cumsum(gaps).tolist()


def offered_rates(num: int, rate: float, ramp: str = "none", end_rate: float | None = None) -> list[float]:
    """The rate request i's arrival is drawn at: `rate` throughout, or a ramp from `rate` to `end_rate`
    over the requests (linear, or exponential: a constant ratio from one request to the next)."""
    if ramp == "none" or num < 2:
        return [rate] * num
    assert end_rate is not None  # a ramp's check requires workload.end_rate
    progress = np.arange(num) / (num - 1)
    if ramp == "linear":
        return (rate + (end_rate - rate) * progress).tolist()
    return (rate * (end_rate / rate) ** progress).tolist()


def sampling_params(w: WorkloadConfig, s: SamplerConfig, max_tokens: int, i: int) -> SamplingParams:
    """Request i's params: the sampler's knobs (its seed + i), the workload's temperature and ignore_eos."""
    temperature = s.temperature if w.temperature is None else w.temperature  # set by the workload: pinned
    knobs = s.knobs() | {"temperature": temperature, "seed": None if s.seed is None else s.seed + i}
    return SamplingParams(**knobs, max_tokens=max_tokens, ignore_eos=w.ignore_eos)
