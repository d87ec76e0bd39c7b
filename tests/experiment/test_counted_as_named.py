"""Every number counted as its name says: the traced repeat out of the summary and the profiler started
before the clock; mixed steps in their own bucket; rates over repeats as total over total time; every
tensor-parallel rank's memory; the resident part of a CPU KV cache; NA (not 0) where a metric does not
apply; GiB where the knob is in GiB."""

from __future__ import annotations

import logging

import pytest
import torch

from nanoexp.config import CacheConfig
from nanoexp.engine.outputs import StepStats
from nanoexp.experiment.measure import profiling
from nanoexp.experiment.measure.driver import RunRecord, StepLog
from nanoexp.experiment.measure.repeats import summarize_repeats
from nanoexp.experiment.metrics import registry
from nanoexp.experiment.metrics.summarize import aggregate_repeats, step_aggregates, step_row
from nanoexp.experiment.schema import NoiseConfig, ProfileConfig
from nanoexp.runner.executor import per_rank_memory
from nanoexp.runner.peak_memory import resident_bytes


def stats(phase: str, tokens: int, prefill: int = 0, decode: int = 0, time_s: float = 0.1) -> StepStats:
    return StepStats(
        phase, 2, tokens, decode + (phase == "prefill"), time_s, 1, 8, 0, 0, 0, 1, 0, 0, decode, prefill
    )


def test_mixed_steps_are_their_own_bucket() -> None:
    steps = [
        stats("prefill", 64, prefill=64),
        stats("mixed", 34, prefill=32, decode=2),
        stats("decode", 2, decode=2),
    ]
    out = step_aggregates(steps)
    assert out["prefill_time_s"] == pytest.approx(0.1) and out["mixed_time_s"] == pytest.approx(0.1)
    assert out["decode_time_s"] == pytest.approx(0.1)  # before: decode 0.2 s, the mixed step inside it
    assert (out["prefill_tokens"], out["mixed_tokens"], out["decode_tokens"]) == (64, 34, 2)
    assert out["mixed_prefill_tokens"] == 32 and out["mixed_decode_tokens"] == 2
    assert out["num_mixed_steps"] == 1 and out["mean_decode_batch_size"] == 2.0
    rows = [step_row(i, s, 0.0) for i, s in enumerate(steps)]
    assert [r["phase"] for r in rows] == ["prefill", "mixed", "decode"]
    assert [r["is_prefill"] for r in rows] == [1, 0, 0]  # the deprecated column keeps its meaning


def test_rates_over_repeats_are_total_over_total_time() -> None:
    fast = {"completed": 4, "total_input_tokens": 40, "total_output_tokens": 100, "duration_s": 0.1}
    slow = {"completed": 4, "total_input_tokens": 40, "total_output_tokens": 100, "duration_s": 0.9}
    for s in (fast, slow):
        s |= {
            "output_throughput": s["total_output_tokens"] / s["duration_s"],
            "request_throughput": 4 / s["duration_s"],
        }
    out = aggregate_repeats([fast, slow])
    assert out["output_throughput"] == pytest.approx(200 / 1.0)  # not (1000 + 111) / 2
    assert out["output_throughput"] == pytest.approx(out["total_output_tokens"] / out["duration_s"])
    assert out["request_throughput"] == pytest.approx(8 / 1.0) and "total" in out["rates_over_repeats"]


def test_the_traced_repeat_is_left_out_of_the_summary() -> None:
    records = [
        RunRecord(repeat=r, duration_s=d, facts={"other_cpu_cores": 0.0})
        for r, d in enumerate((5.0, 1.0, 1.0))
    ]
    summary = summarize_repeats(records, {}, NoiseConfig(min_duration_s=0), traced=0)
    assert summary["repeats"] == 2 and summary["duration_s"] == pytest.approx(1.0)
    assert summary["traced_repeat"] == 0 and summary["traced_repeat_in_summary"] is False
    only = summarize_repeats(records[:1], {}, NoiseConfig(min_duration_s=0), traced=0)
    assert only["repeats"] == 1 and only["traced_repeat_in_summary"] is True  # said, not hidden


def test_the_profiler_starts_before_the_timed_steps(tmp_path, monkeypatch) -> None:
    events: list[str] = []

    class Recorder:
        def start(self):
            events.append("profiler start")

        def step(self):
            events.append("profiler step")

        def stop(self):
            events.append("profiler stop")

    class Engine:
        scheduler = executor = object()

        def set_hooks(self, step=None, phases=None) -> tuple[str, ...]:
            return ()  # the phases it reports: none

        def step(self):
            events.append("engine step")
            return [], None

    monkeypatch.setattr(profiling, "_torch_profiler", lambda *a: Recorder())
    engine = Engine()
    profiler = profiling.StepProfiler(ProfileConfig(trace_steps=1), engine, tmp_path)
    with profiler.repeat(0, StepLog(lambda *a: None)):
        events.append("clock starts")  # driver.run starts the repeat's clock here
        engine.step()
    assert events[:2] == ["profiler start", "clock starts"], events


def test_every_ranks_memory_is_reported() -> None:
    ranks = [{"peak_memory_bytes": 300, "weights_bytes": 100, "kv_cache_bytes": 50}] * 2
    out = per_rank_memory(ranks)
    assert out["peak_memory_bytes_per_rank"] == [300, 300] and out["peak_memory_bytes_total"] == 600
    assert out["weights_bytes_total"] == 200 and out["kv_cache_bytes_total"] == 100


def test_the_cpu_split_counts_the_resident_kv_cache() -> None:
    cache = torch.empty(64 * 2**20, dtype=torch.uint8)  # allocated, untouched: not resident
    untouched = resident_bytes(cache)
    if untouched is None:
        pytest.skip("no mincore here")
    cache[: 8 * 2**20] = 1
    assert untouched < 2**20 and 8 * 2**20 <= resident_bytes(cache) < 9 * 2**20


def test_metrics_that_do_not_apply_to_the_baseline_are_absent() -> None:
    missing = set(registry.not_applicable("hf"))
    assert {"prefix_cache_hit_rate", "num_preemptions", "peak_kv_blocks_used", "kv_cache_bytes"} <= missing
    assert "output_throughput" not in missing


def test_the_cpu_kv_cache_knob_is_in_gib_and_the_old_spelling_warns(caplog) -> None:
    assert CacheConfig().cpu_kv_cache_gib == 2.0
    with caplog.at_level(logging.WARNING):
        old = CacheConfig(cpu_kv_cache_gb=0.5)
    assert old.cpu_kv_cache_gib == 0.5 and "deprecated" in caplog.text and "cpu_kv_cache_gib" in caplog.text


def test_the_registry_prints_numbers_a_researcher_reads() -> None:
    assert registry.display("peak_memory_bytes", 75440105984) == "75.4"
    assert registry.display("output_throughput", 14547.3) == "14,547"
    assert registry.title("peak_memory_bytes") == "peak memory (GB)"
    assert registry.better("p99_ttft_ms") == "lower" and registry.better("output_throughput") == "higher"
