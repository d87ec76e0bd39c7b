"""Goodput (vLLM's --goodput rule) and outputs.jsonl."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nanoexp.engine.outputs import RequestOutput
from nanoexp.experiment.metrics import meets_slo, summarize

ROOT = Path(__file__).resolve().parents[1]


def output(ttft_s: float, gap_s: float, n: int) -> RequestOutput:
    times = [ttft_s + i * gap_s for i in range(n)]
    return RequestOutput(0, [1, 2], list(range(n)), "length", 0.0, 0.0, times[0], times, times[-1], 0, 0)


def test_goodput_counts_requests_meeting_every_slo_set() -> None:
    fast, slow_decode = output(0.1, 0.01, 5), output(0.1, 0.2, 5)
    assert meets_slo(fast, {"ttft_ms": 100.0, "tpot_ms": 10.5})  # TTFT exactly at the SLO is good
    assert not meets_slo(slow_decode, {"ttft_ms": 200.0, "tpot_ms": 50.0})
    assert meets_slo(slow_decode, {"ttft_ms": 200.0})  # unset SLOs do not count
    assert not meets_slo(fast, {"e2el_ms": 139.0})  # e2el = 0.14 s
    summary = summarize([fast, slow_decode], [], 2.0, {"tpot_ms": 50.0})
    assert summary["good_requests"] == 1 and summary["request_goodput"] == pytest.approx(0.5)
    assert "request_goodput" not in summarize([fast], [], 1.0)


def test_slo_must_be_positive(tmp_path: Path) -> None:
    proc = run_py(tmp_path, "metrics.slo.ttft_ms=0")
    assert proc.returncode == 2
    assert "nanoexp: error: metrics.slo.ttft_ms=0.0 is invalid" in proc.stderr


def run_py(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "HYDRA_FULL_ERROR"))}
    env |= {"HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}
    tiny = ["model=qwen3_tiny", "cache.cpu_kv_cache_gib=0.05", "logger=none"]
    cmd = [sys.executable, "run.py", f"hydra.run.dir={tmp_path / 'job'}", *tiny, *overrides]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_prompts_file_saves_outputs_and_reports_goodput(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    lines = [{"prompt_token_ids": [5, 6, 7, 8][: i + 1], "max_tokens": 3 + i} for i in range(3)]
    prompts.write_text("".join(json.dumps(x) + "\n" for x in lines))
    slo = ["metrics.slo.ttft_ms=1e6", "metrics.slo.tpot_ms=1e6", "metrics.slo.e2el_ms=1e6"]
    proc = run_py(tmp_path, "workload=prompts_file", f"workload.path={prompts}", *slo)
    assert proc.returncode == 0, proc.stderr[-3000:]
    job = tmp_path / "job"
    summary = json.loads((job / "results.json").read_text())["summary"]
    assert summary["good_requests"] == 3
    assert summary["request_goodput"] == pytest.approx(summary["request_throughput"])
    assert "request goodput" in proc.stdout
    out = proc.stdout.splitlines()  # log lines (a noise or compile warning) may come before the table
    start = next(i for i, line in enumerate(out) if line.startswith("nanoexp | "))
    header = out[start : start + 3]
    assert header[1] == "TP 1, block size 256, rate inf, attention torch"
    changed = header[2].removeprefix("changed from the defaults: ").split()
    for setting in (
        "workload=prompts_file",
        "model=qwen3_tiny",
        "logger=none",
        "metrics.slo.tpot_ms=1000000.0",
    ):
        assert setting in changed
    assert not any(
        s.startswith(("model.arch", "workload.kind", "hydra")) for s in changed
    )  # from the options
    run_log = (job / "run.log").read_text()
    assert "\n".join(header) in run_log and "request goodput" in run_log
    rows = [json.loads(line) for line in (job / "outputs.jsonl").read_text().splitlines()]
    with (job / "requests.csv").open() as f:
        requests = {int(r["request_id"]): r for r in csv.DictReader(f)}
    assert [r["prompt_len"] for r in rows] == [1, 2, 3]
    for row in rows:
        assert set(row) == {"request_id", "repeat", "prompt_len", "output_token_ids", "finish_reason"}
        assert len(row["output_token_ids"]) == int(requests[row["request_id"]]["output_len"])
        assert row["finish_reason"] == requests[row["request_id"]]["finish_reason"]


def test_outputs_carry_text_when_there_is_a_tokenizer(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from nanoexp.experiment.driver import RunRecord
    from nanoexp.experiment.loggers import write_outputs

    raw = Tokenizer(models.WordLevel({f"w{i}": i for i in range(8)}, unk_token="w0"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw)
    record = RunRecord(repeat=1, outputs=[output(0.1, 0.01, 3)])
    write_outputs(tmp_path / "outputs.jsonl", [record], tokenizer)
    (row,) = [json.loads(line) for line in (tmp_path / "outputs.jsonl").read_text().splitlines()]
    assert row["output_token_ids"] == [0, 1, 2] and row["text"] == "w0 w1 w2" and row["repeat"] == 1
