"""Two small real sweeps (block size 16 and 64, two repeats; the second, block size 16 only, as
"another commit"): the report's step aggregates and per-repeat CDFs, the redraw command, the typed W&B
sweep table, short run names, system metrics, the noise and memory fields, and the comparison."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from helpers import ROOT, TINY_JOB

from nanoexp.experiment.report import sweep_plots, sweep_report
from nanoexp.experiment.report.sweep_report import collect, job_requests, swept_keys, write_report
from nanoexp.experiment.schema import ReportConfig

WANDB = Path(sys.executable).with_name("wandb")
SWEEP = [*TINY_JOB, "cache.block_size=16,64", "repeats=2"]
REPORT_FILES = (
    "sweep_summary.csv",
    "sweep_summary.md",
    "sweep_cache_block_size.png",
    "sweep_latency_cdf.png",
)


def env(home: Path) -> dict:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "HYDRA_FULL_ERROR"))}
    return base | {"HOME": str(home), "PYTHONPATH": str(ROOT)}  # no API key: W&B offline


def python(home: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env(home), capture_output=True, text=True, timeout=600
    )
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("sweeps")
    a, b = tmp / "a", tmp / "b"
    python(tmp / "home", "run.py", "-m", f"hydra.sweep.dir={a}", *SWEEP)
    one_config = [o if not o.startswith("cache.block_size") else "cache.block_size=16" for o in SWEEP]
    python(tmp / "home", "run.py", "-m", f"hydra.sweep.dir={b}", *one_config, "logger=none")
    return a, b


def job_dirs(sweep: Path) -> list[Path]:
    return sorted(p.parent for p in sweep.glob("*/results.json"))


def summary(job: Path) -> dict:
    return json.loads((job / "results.json").read_text())["summary"]


def records(run_dir: Path, *flags: str) -> str:
    proc = subprocess.run(
        [str(WANDB), "leet", "inspect", "--json", *flags, str(run_dir)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_report_tables_and_plots_the_step_aggregates(sweeps, tmp_path: Path, monkeypatch) -> None:
    a, _ = sweeps
    with (a / "sweep_summary.csv").open() as f:
        columns = next(csv.reader(f))
    header = next(
        line for line in (a / "sweep_summary.md").read_text().splitlines() if line.startswith("| job")
    )
    for metric in ReportConfig().metrics:
        assert metric in columns and metric in header
    panels = []
    monkeypatch.setattr(sweep_plots, "plot_param", lambda table, metrics, *args: panels.append(metrics))
    copy = tmp_path / "a"
    shutil.copytree(a, copy)
    write_report(copy, metrics=["prefill_time_s", "peak_kv_blocks_used"])
    assert panels and {"prefill_time_s", "peak_kv_blocks_used", "output_throughput"} <= set(panels[0])


def test_latency_cdf_has_one_curve_per_job_and_repeat(sweeps) -> None:
    a, _ = sweeps
    table = collect(a)
    curves = job_requests(a, table, swept_keys(table))
    labels = sorted(label.replace(" (machine busy: not judged)", "") for label, _ in curves)
    assert labels == [
        "cache.block_size=16 r0",
        "cache.block_size=16 r1",
        "cache.block_size=64 r0",
        "cache.block_size=64 r1",
    ]
    assert all(part["repeat"].nunique() == 1 for _, part in curves)


def test_redraw_writes_the_same_report_from_the_job_dirs(sweeps, tmp_path: Path, capsys) -> None:
    """The command (`python -m`, once) and its options (through `cli`, the same code in this process)."""
    a, _ = sweeps
    copy = tmp_path / "a"
    shutil.copytree(a, copy)
    assert sweep_report.cli([str(copy)]) == 0  # the sweep's own report, here
    before = {name: (copy / name).read_bytes() for name in REPORT_FILES}
    for name in REPORT_FILES:
        (copy / name).unlink()
    proc = python(tmp_path / "home", "-m", "nanoexp.experiment.report.sweep_report", str(copy))
    assert f"sweep report: {copy / 'sweep_summary.md'}" in proc.stdout
    for name in ("sweep_summary.csv", "sweep_summary.md"):
        assert (copy / name).read_bytes() == before[name], name
    assert all((copy / name).is_file() for name in REPORT_FILES)
    assert sweep_report.cli([str(copy), "--metrics", "decode_time_s"]) == 0
    md = (copy / "sweep_summary.md").read_text()
    assert "decode_time_s" in md and "peak_kv_blocks_used" not in md
    with pytest.raises(SystemExit) as bad:
        sweep_report.cli([str(tmp_path / "nope")])
    assert bad.value.code == 2 and "no such sweep dir" in capsys.readouterr().err


def test_wandb_sweep_table_is_typed_with_one_column_per_key(sweeps) -> None:
    a, _ = sweeps
    (table_file,) = (a / "wandb").glob("offline-run-*/files/media/table/sweep_table_*.table.json")
    table = json.loads(table_file.read_text())
    columns = table["columns"]
    assert len(columns) == len(set(columns)) and columns.count("model") == 1 and columns.count("repeats") == 1
    rows = [dict(zip(columns, row)) for row in table["data"]]
    assert sorted(r["cache.block_size"] for r in rows) == [16, 64]
    assert all(r["repeats"] == 2 for r in rows)
    (run_dir,) = (a / "wandb").glob("offline-run-*")
    config = json.loads(records(run_dir, "--summary"))["config"]
    assert config["cache.block_size"] == [16, 64]


def test_job_runs_have_short_names_per_repeat_and_system_metrics(sweeps) -> None:
    a, _ = sweeps
    for job, size in zip(job_dirs(a), (16, 64)):
        results = json.loads((job / "results.json").read_text())
        assert results["job"]["name"] == f"block_size={size}"
        run_dir = Path(results["job"]["wandb"]["dir"])
        state = json.loads(records(run_dir, "--summary"))
        per_repeat = state["summary"]["per_repeat"]
        assert len(per_repeat) == 2 and per_repeat[0]["output_throughput"] > 0
        types = [json.loads(line)["type"] for line in records(run_dir).splitlines()]
        assert "stats" in types, "no system metrics in the job's W&B run"


def test_each_repeat_records_the_machine_load_and_the_job_its_memory(sweeps) -> None:
    a, _ = sweeps
    for job in job_dirs(a):
        s = summary(job)
        for r in s["per_repeat"]:
            assert r["load_avg_1m_after"] >= 0 and r["process_cpu_cores"] > 0 and r["other_cpu_cores"] >= 0
        assert s["cpu_count"] >= 1 and s["noise_busy_repeats"] in (0, 1, 2)
        assert isinstance(s["noise_warning"], str) and isinstance(s["noise_wide_ci"], str)
        assert s["job_memory_scope"] == "job"
        assert s["job_peak_rss_bytes"] >= s["job_rss_at_start_bytes"] > 0
        assert (
            s["memory_weights_bytes"] == s["weights_bytes"]
            and s["memory_kv_cache_allocated_bytes"] == s["kv_cache_bytes"]
            and 0 < s["memory_kv_cache_bytes"] <= s["kv_cache_bytes"]  # resident: the touched blocks
        )
        assert s["memory_other_bytes"] >= 0


def test_compare_prints_ratios_with_intervals_per_config(sweeps, tmp_path: Path) -> None:
    a, b = sweeps
    proc = python(
        tmp_path / "home", "-m", "nanoexp.experiment.report.compare", str(a), str(b), "--out", str(tmp_path)
    )
    assert "1 configurations matched on cache.block_size; 1 of A and 0 of B unmatched" in proc.stdout
    table = pd.read_csv(tmp_path / "compare.csv")
    assert set(table["config"]) == {"cache.block_size=16"}
    assert {"output_throughput", "mean_ttft_ms"} <= set(table["metric"])
    # one run a side: a ratio, no interval, no verdict (repeats inside one run are not independent)
    assert table["ratio_ci95_low"].isna().all() and (table["ratio"] > 0).all()
    assert set(table["verdict"]) <= {"not enough runs", "withheld: noisy"} and set(table["repeats"]) == {
        "2/2"
    }
    assert (tmp_path / "compare.png").is_file() and (tmp_path / "compare.md").read_text() in proc.stdout
