"""The pieces behind reproducing, explaining and comparing a run, one by one: the ratio interval,
typed swept values, short run names, the per-job memory reset, the noise flags and the load
meter, pooled trials."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from nanoexp.experiment.job.memory import JobMemory
from nanoexp.experiment.measure.repeats import LoadMeter, noise_flags
from nanoexp.experiment.report.compare import ratio
from nanoexp.experiment.report.sweep_report import typed
from nanoexp.experiment.runtime.job_info import run_name, swept_keys
from nanoexp.experiment.schema import NoiseConfig


def test_ratio_interval_is_significant_only_beyond_noise() -> None:
    same = ratio([100, 102, 98], [101, 99, 100])
    assert same[1] < 1 < same[2]
    faster = ratio([100, 101, 99], [120, 121, 119])
    assert faster[0] == pytest.approx(1.2) and faster[1] > 1
    assert ratio([100], [120])[1] != ratio([100], [120])[1]  # one repeat: no interval (NaN)


def test_swept_values_are_typed() -> None:
    assert list(typed(pd.Series(["16", "64"]))) == [16, 64]
    assert list(typed(pd.Series(["0.5", "inf"]))) == [0.5, float("inf")]
    assert list(typed(pd.Series(["true", "False", None]))) == [True, False, None]
    assert list(typed(pd.Series(["16", None]))) == [16, None]
    assert list(typed(pd.Series(["qwen3_tiny", "16"]))) == ["qwen3_tiny", "16"]


def test_run_names_are_the_swept_values(tmp_path: Path) -> None:
    task = ["model=qwen3_tiny", "cache.block_size=16,64", "x.block_size=1"]
    saved = {"hydra": {"sweeper": {"params": {"workload.request_rate": "8,16"}}, "overrides": {"task": task}}}
    (tmp_path / "multirun.yaml").write_text(json.dumps(saved))  # JSON is YAML
    swept = swept_keys(str(tmp_path))
    assert swept == {"cache.block_size", "workload.request_rate"}
    overrides = ["model=qwen3_tiny", "cache.block_size=16", "workload.request_rate=8", "x.block_size=1"]
    assert run_name(overrides, swept) == "block_size=16 request_rate=8"
    assert (
        run_name(overrides, swept | {"x.block_size"}) == "cache.block_size=16 request_rate=8 x.block_size=1"
    )
    assert run_name(overrides, None) == ",".join(overrides)  # a single run keeps its overrides
    assert swept_keys(str(tmp_path / "none")) is None


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux only")
def test_job_memory_peak_is_the_jobs_not_the_processs() -> None:
    first = JobMemory()
    block = bytearray(256 * 2**20)
    block[::4096] = b"x" * len(block[::4096])  # touch every page: resident
    first_peak = first.summary({})["job_peak_rss_bytes"]
    del block
    second = JobMemory().summary({"weights_bytes": 10, "kv_cache_bytes": 20})
    assert second["job_peak_rss_bytes"] < first_peak - 200 * 2**20
    assert second["memory_weights_bytes"] == 10 and second["memory_kv_cache_bytes"] == 20


def test_noise_flags_name_busy_repeats_and_wide_intervals() -> None:
    cfg = NoiseConfig(busy_cores=0.5, max_ci_share=0.1)
    summary = {
        "output_throughput": 100.0,
        "output_throughput_ci95_low": 70.0,
        "output_throughput_ci95_high": 130.0,
    }
    flags = noise_flags(summary, [{"other_cpu_cores": 1.2}, {"other_cpu_cores": 0.1}], cfg)
    assert flags["noise_busy_repeats"] == 1 and flags["noise_wide_ci"] == "output_throughput ±30%"
    assert "machine busy in 1 of 2 repeats" in flags["noise_warning"]
    quiet = noise_flags({"output_throughput": 100.0}, [{"other_cpu_cores": 0.1}], cfg)
    assert quiet.pop("noise_busy_limit_cores") >= 0.5  # busy_cores beyond the cores the job left free
    assert quiet == {
        "noise_busy_repeats": 0,
        "noise_too_short": False,
        "noise_wide_ci": "",
        "noise_warning": "",
    }


def test_load_meter_counts_a_busy_loop_beside_it() -> None:
    meter = LoadMeter()
    busy = subprocess.Popen(
        [sys.executable, "-c", "import time\nend = time.time() + 1.5\nwhile time.time() < end: pass"]
    )
    busy.wait()
    load = meter.read()
    assert load["other_cpu_cores"] > 0.5  # a finished child is not one of the job's live workers
    assert load["cpu_count"] >= 1 and load["load_avg_1m_after"] >= 0


def _fake_job(sweep: Path, num: int, overrides: list[str], throughputs: list[float]) -> None:
    job = sweep / f"{num}_job"
    job.mkdir(parents=True)
    per_repeat = [{"output_throughput": t} for t in throughputs]
    summary = {"output_throughput": sum(throughputs) / len(throughputs), "repeats": len(throughputs)}
    summary |= {"per_repeat": per_repeat, "prefill_time_s": float(num), "noise_warning": ""}
    results = {"status": "ok", "job": {"job_num": num, "overrides": overrides}, "summary": summary}
    (job / "results.json").write_text(json.dumps(results))


def test_interleaved_trials_pool_into_one_row_per_configuration(tmp_path: Path) -> None:
    from nanoexp.experiment.report.compare import compare
    from nanoexp.experiment.report.sweep_report import collect, pool_trials

    sweep = tmp_path / "sweep"
    order = [(t, size) for t in range(3) for size in (16, 64)]
    for num, (trial, size) in enumerate(order):
        values = [100.0 + trial, 102.0 + trial] if size == 16 else [200.0 + trial, 198.0 + trial]
        _fake_job(sweep, num, [f"trial={trial}", f"cache.block_size={size}"], values)
    table = pool_trials(collect(sweep, metrics=["prefill_time_s"]), sweep)
    rows = {r["param:cache.block_size"]: r for _, r in table.iterrows()}
    assert sorted(rows) == ["16", "64"] and list(table["param:trial"]) == ["0,1,2", "0,1,2"]
    assert rows["16"]["repeats"] == 6 and rows["16"]["output_throughput"] == pytest.approx(102.0)
    # the interval is over the 3 runs' means (101, 102, 103): t(2) * 1 / sqrt(3) = 2.48
    assert rows["16"]["output_throughput_ci95_low"] == pytest.approx(102.0 - 2.484, abs=0.01)
    assert rows["16"]["runs"] == 3 and rows["16"]["interval"] == "over 3 runs"
    assert rows["16"]["prefill_time_s"] == pytest.approx(2.0)  # mean of jobs 0, 2 and 4
    compared, header = compare(sweep, sweep, ["output_throughput"])
    assert set(compared["runs"]) == {"3/3"} and "matched on cache.block_size" in header[2]
    assert set(compared["verdict"]) == {"within noise"}


def test_two_runs_are_not_enough_for_an_interval(tmp_path: Path) -> None:
    from nanoexp.experiment.report.compare import compare
    from nanoexp.experiment.report.sweep_report import collect, mark_noise, pool_trials

    for num, trial in enumerate((0, 1)):
        _fake_job(tmp_path, num, [f"trial={trial}", "cache.block_size=16"], [100.0 + trial, 101.0 + trial])
        _fake_job(tmp_path, num + 2, [f"trial={trial}", "cache.block_size=64"], [300.0, 301.0])
    table = mark_noise(pool_trials(collect(tmp_path), tmp_path))
    assert table["output_throughput_ci95_low"].isna().all() and "noise:output_throughput" not in table
    assert set(table["interval"]) == {"none: 2 clean runs"}
    compared, _ = compare(tmp_path, tmp_path, ["output_throughput"])
    assert set(compared["verdict"]) == {"not enough runs"}


def test_sweep_table_shows_a_noisy_jobs_warning(tmp_path: Path) -> None:
    from nanoexp.experiment.report.sweep_report import collect, markdown, swept_keys

    _fake_job(tmp_path, 0, ["cache.block_size=16"], [100.0, 101.0])
    _fake_job(tmp_path, 1, ["cache.block_size=64"], [100.0, 180.0])
    noisy = json.loads((tmp_path / "1_job" / "results.json").read_text())
    noisy["summary"]["noise_warning"] = "machine busy in 1 of 2 repeats (up to 1.0 other cores)"
    (tmp_path / "1_job" / "results.json").write_text(json.dumps(noisy))
    table = collect(tmp_path)
    text = markdown(table, swept_keys(table), "t")
    header = next(line for line in text.splitlines() if line.startswith("| job_num"))
    assert header.endswith("| noise_warning |") and "machine busy in 1 of 2 repeats" in text


def test_a_job_appended_to_a_sweep_is_not_swept_by_its_append_flag(tmp_path: Path) -> None:
    from nanoexp.experiment.report.sweep_report import collect, swept_keys

    _fake_job(tmp_path, 0, ["workload.input_len=16"], [100.0, 101.0])
    _fake_job(tmp_path, 1, ["workload.input_len=512", "append_to_sweep=true"], [50.0, 51.0])
    assert swept_keys(collect(tmp_path)) == ["param:workload.input_len"]
