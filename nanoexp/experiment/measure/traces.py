"""Trace replay: a production trace's timestamps become arrival offsets and its lengths the requests'.

Formats, with their published columns: Azure LLM inference (CSV `TIMESTAMP,ContextTokens,GeneratedTokens`,
the timestamp a date-time string), BurstGPT (CSV `Timestamp,Model,Request tokens,Response tokens,Total
tokens,Log Type`, seconds) and Mooncake (JSONL `{"timestamp": ms, "input_length", "output_length",
"hash_ids"}`: request i's prompt is its hash_ids' blocks of `trace_block_size` tokens, the same block for the
same hash, so requests with a common hash_ids prefix share exactly those blocks)."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from nanoexp.config import SamplingParams
from nanoexp.experiment.measure.workloads import TOKEN_ID_HIGH, Request, Workload
from nanoexp.experiment.schema import ConfigError, WorkloadConfig

log = logging.getLogger(__name__)
Params = Callable[[int, int], SamplingParams]  # (max_tokens, request index) -> its sampling params
CSV_COLUMNS = {  # format -> (timestamp, prompt length, output length) columns
    "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    "burstgpt": ("Timestamp", "Request tokens", "Response tokens"),
}
MOONCAKE_KEYS = ("timestamp", "input_length", "output_length")


@dataclass(frozen=True)
class TraceRow:
    timestamp_s: float
    input_len: int
    output_len: int
    origin: str  # `<file>:<line>`
    hash_ids: tuple[int, ...] = ()


def trace_workload(w: WorkloadConfig, params: Params, vocab: int) -> Workload:
    """The trace's window (from `start_s`, `num_requests` rows) as requests arriving at its timestamps."""
    fmt, rows, skipped = read_trace(w)
    rows = window(rows, w)
    first = rows[0].timestamp_s
    offsets = [(r.timestamp_s - first) * w.time_scale for r in rows]
    prompts = mooncake_prompts(rows, w.trace_block_size, w.seed, vocab) if fmt == "mooncake" else None
    prompts = prompts or random_prompts(rows, w.seed, vocab)
    requests = [
        Request(p, params(r.output_len, i), o, *source_of(r.origin))
        for i, (r, p, o) in enumerate(zip(rows, prompts, offsets))
    ]
    span = offsets[-1]
    facts = {"trace_format": fmt, "trace_rows_skipped": skipped, "trace_span_s": span}
    facts["offered_request_rate"] = (len(rows) - 1) / span if span > 0 else math.inf  # as scaled
    return Workload(w.name, requests, facts=facts)


def native_rate(w: WorkloadConfig) -> float:
    """The window's mean request rate at time_scale=1 (what the capacity search scales)."""
    rows = window(read_trace(w)[1], w)
    span = rows[-1].timestamp_s - rows[0].timestamp_s
    return (len(rows) - 1) / span if span > 0 else math.inf


def read_trace(w: WorkloadConfig) -> tuple[str, list[TraceRow], int]:
    """(format, rows sorted by timestamp, rows skipped for a zero length)."""
    assert w.path is not None  # workload=trace's check requires it
    path = Path(w.path)
    fmt = w.format if w.format != "auto" else detect_format(path)
    if w.model_filter is not None and fmt != "burstgpt":
        raise ConfigError(
            f"workload.model_filter={w.model_filter!r}: only a burstgpt trace has a Model column"
        )
    rows = read_mooncake(path) if fmt == "mooncake" else read_csv_trace(path, fmt, w.model_filter)
    kept = [r for r in rows if r.input_len > 0 and r.output_len > 0]
    if not kept:
        raise ConfigError(f"workload.path={w.path}: no request with a prompt and an output in the trace")
    if len(kept) < len(rows):
        log.warning("%s: %d rows with a zero length skipped", path, len(rows) - len(kept))
    return fmt, sorted(kept, key=lambda r: r.timestamp_s), len(rows) - len(kept)


def detect_format(path: Path) -> str:
    """mooncake for a file of JSON objects, else the CSV format whose columns its header has."""
    head = _first_line(path)
    if head.lstrip().startswith("{"):
        return "mooncake"
    columns = {c.strip() for c in head.split(",")}
    for fmt, needed in CSV_COLUMNS.items():
        if set(needed) <= columns:
            return fmt
    raise ConfigError(
        f"workload.format=auto: cannot tell the format of {path} (its first line: {head[:80]!r}); "
        "set workload.format=azure|burstgpt|mooncake"
    )


def _first_line(path: Path) -> str:
    with path.open("rb") as f:
        raw = f.readline()
    try:
        return raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ConfigError(f"workload.path={path}: not UTF-8 text; a trace is a CSV or JSONL file") from None


def read_csv_trace(path: Path, fmt: str, model: str | None) -> list[TraceRow]:
    """Azure or BurstGPT rows; a missing column or a bad value is one line naming the file and row."""
    try:
        table = pd.read_csv(path, dtype=str, skipinitialspace=True)
    except (ValueError, UnicodeDecodeError) as err:  # pandas' ParserError is a ValueError
        raise ConfigError(
            f"workload.format={fmt}: {path} is not a CSV trace ({str(err).splitlines()[0]})"
        ) from None
    table.columns = [c.strip() for c in table.columns]
    needed = (*CSV_COLUMNS[fmt], *(("Model",) if model is not None else ()))
    missing = [c for c in needed if c not in table.columns]
    if missing:
        raise ConfigError(
            f"workload.format={fmt}: {path} lacks the column(s) {', '.join(missing)} "
            f"(its columns: {', '.join(table.columns[:12])}); a {fmt} trace has {', '.join(CSV_COLUMNS[fmt])}"
        )
    if table.empty:
        raise ConfigError(f"workload.path={path}: the {fmt} trace has a header and no rows")
    lines = pd.Series(np.arange(len(table)) + 2, index=table.index)  # the header is line 1
    if model is not None:
        keep = table["Model"].str.strip() == model
        if not keep.any():
            models = ", ".join(sorted(table["Model"].dropna().str.strip().unique())[:10])
            raise ConfigError(
                f"workload.model_filter={model!r}: no row of {path} has it (its models: {models})"
            )
        table, lines = table[keep], lines[keep]
    stamp, prompt, output = CSV_COLUMNS[fmt]
    seconds = _azure_seconds if fmt == "azure" else _float_seconds
    times = seconds(table[stamp], path, lines, stamp)
    inputs, outputs = (_lengths(table[c], path, lines, c) for c in (prompt, output))
    return [
        TraceRow(t, i, o, f"{path.name}:{line}")
        for t, i, o, line in zip(times, inputs, outputs, lines.tolist())
    ]


def _azure_seconds(column: pd.Series, path: Path, lines: pd.Series, name: str) -> list[float]:
    """Date-time strings (`2023-11-16 18:15:46.6805900`) as seconds since the first, to the nanosecond."""
    parsed = pd.to_datetime(column, format="ISO8601", errors="coerce")
    _first_bad(parsed.isna(), column, path, lines, name, "a date-time such as 2023-11-16 18:15:46.6805900")
    ns = parsed.astype("int64").to_numpy()
    return ((ns - ns.min()) / 1e9).tolist()


def _float_seconds(column: pd.Series, path: Path, lines: pd.Series, name: str) -> list[float]:
    values = pd.to_numeric(column, errors="coerce")
    _first_bad(~np.isfinite(values.fillna(np.nan)), column, path, lines, name, "a number of seconds")
    return values.astype(float).tolist()


def _lengths(column: pd.Series, path: Path, lines: pd.Series, name: str) -> list[int]:
    values = pd.to_numeric(column, errors="coerce")
    bad = values.isna() | (values < 0) | (values != values.round())
    _first_bad(bad, column, path, lines, name, "a token count (an integer >= 0)")
    return values.astype(int).tolist()


def _first_bad(
    bad: pd.Series, column: pd.Series, path: Path, lines: pd.Series, name: str, allowed: str
) -> None:
    if bad.any():
        where = bad.to_numpy().nonzero()[0][0]
        value = column.iloc[where]
        raise ConfigError(f"{path.name}:{lines.iloc[where]}: {name}={value!r} is invalid: must be {allowed}")


def read_mooncake(path: Path) -> list[TraceRow]:
    """One JSON object per line: timestamp (ms), input_length, output_length and hash_ids."""
    rows = []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if line.strip():
            rows.append(_mooncake_row(json_object(line, f"{path.name}:{number}"), f"{path.name}:{number}"))
    return rows


def json_object(line: str, where: str) -> dict:
    try:
        item = json.loads(line)
    except json.JSONDecodeError as err:
        raise ConfigError(
            f"workload.format=mooncake: {where} is not JSON ({err.msg}); a Mooncake trace is JSONL"
        ) from None
    if not isinstance(item, dict):
        raise ConfigError(f"workload.format=mooncake: {where} is not a JSON object: {line[:80]}")
    return item


def _mooncake_row(item: dict, where: str) -> TraceRow:
    missing = [k for k in MOONCAKE_KEYS if k not in item]
    if missing:
        raise ConfigError(
            f"workload.format=mooncake: {where} lacks {', '.join(missing)} "
            f"(a Mooncake line has {', '.join(MOONCAKE_KEYS)}, hash_ids)"
        )
    stamp, lengths, hashes = item["timestamp"], [item[k] for k in MOONCAKE_KEYS[1:]], item.get("hash_ids", [])
    if isinstance(stamp, bool) or not isinstance(stamp, int | float) or not math.isfinite(stamp):
        raise ConfigError(f"{where}: timestamp={stamp!r} is invalid: must be a number of milliseconds")
    for key, value in zip(MOONCAKE_KEYS[1:], lengths):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"{where}: {key}={value!r} is invalid: must be an integer >= 0")
    if not isinstance(hashes, list) or not all(
        isinstance(h, int) and not isinstance(h, bool) and h >= 0 for h in hashes
    ):
        raise ConfigError(f"{where}: hash_ids={hashes!r:.80} is invalid: must be a list of integers >= 0")
    input_len, output_len = lengths
    return TraceRow(stamp / 1e3, input_len, output_len, where, tuple(hashes))


def window(rows: list[TraceRow], w: WorkloadConfig) -> list[TraceRow]:
    """The rows from `start_s` after the trace's first, at most `num_requests` of them (-1: all)."""
    start = rows[0].timestamp_s + w.start_s
    kept = [r for r in rows if r.timestamp_s >= start]
    kept = kept[: w.num_requests] if w.num_requests > 0 else kept
    if not kept:
        span = rows[-1].timestamp_s - rows[0].timestamp_s
        raise ConfigError(
            f"workload.start_s={w.start_s}: past the trace's end ({span:.3f} s after its start)"
        )
    return kept


def random_prompts(rows: list[TraceRow], seed: int, vocab: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, min(vocab, TOKEN_ID_HIGH), size=r.input_len).tolist() for r in rows]


def mooncake_prompts(rows: list[TraceRow], block: int, seed: int, vocab: int) -> list[list[int]]:
    """Each prompt: its hash_ids' blocks, then tokens of its own up to input_length (cut to it). A block
    (and a request's own tail) starts with digits naming it, so two prompts part within a block's first
    tokens where their hash_ids part: they share exactly their common prefix of whole blocks."""
    high = min(vocab, TOKEN_ID_HIGH)
    largest = max([2 * h for r in rows for h in r.hash_ids] + [2 * len(rows) + 1])
    digits = max(1, math.ceil(math.log(largest + 1, high)))
    blocks: dict[int, list[int]] = {}

    def tokens(name: int, size: int) -> list[int]:
        head = [(name // high**d) % high for d in reversed(range(digits))]
        rest = np.random.default_rng([seed, name]).integers(0, high, size=max(0, size - digits))
        return (head + rest.tolist())[:size]

    prompts = []
    for i, r in enumerate(rows):
        prompt = [t for h in r.hash_ids for t in blocks.setdefault(h, tokens(2 * h, block))]
        if len(prompt) < r.input_len:
            prompt += tokens(2 * i + 1, r.input_len - len(prompt))
        prompts.append(prompt[: r.input_len])
    return prompts


def source_of(origin: str) -> tuple[str, int]:
    """A trace row's `<file>:<line>` as the Request's source file and line."""
    file, _, line = origin.rpartition(":")
    return file, int(line)
