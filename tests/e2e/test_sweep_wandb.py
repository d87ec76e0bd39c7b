"""The acceptance sweep `run.py -m model=qwen3_tiny cache.block_size=16,64 repeats=3` with W&B
offline: a sweep table with mean and 95% CI, plots with error bars, a sweep-level W&B run and
per-job W&B summaries equal to results.json, all read back from the files written."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from helpers import ROOT, job_env

from nanoexp.experiment.report.sweep_plots import plot_param
from nanoexp.experiment.report.sweep_report import JOB_TYPE, TABLE_KEY, mark_noise

WANDB = Path(sys.executable).with_name("wandb")
SWEEP = ["model=qwen3_tiny", "cache.block_size=16,64", "repeats=3"]
SMALL = [
    "cache.cpu_kv_cache_gib=0.05",
    "workload.num_requests=4",
    "workload.output_len=8",
    "workload.range_ratio=0",
]
TOTALS = (
    "completed",
    "total_input_tokens",
    "total_output_tokens",
    "output_throughput",
    "num_steps",
    "output_throughput_ci95_low",
    "output_throughput_ci95_high",
    "mean_ttft_ms",
    "repeats",
)


def inspect(run_dir: Path, *flags: str) -> str:
    cmd = [str(WANDB), "leet", "inspect", "--json", *flags, str(run_dir)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("trust_sweep")
    env = job_env(tmp / "home")  # no API key: W&B offline
    cmd = [sys.executable, "run.py", "-m", f"hydra.sweep.dir={tmp / 'sweep'}", *SWEEP, *SMALL]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp / "sweep"


def test_sweep_table_has_mean_and_ci(sweep: Path) -> None:
    with (sweep / "sweep_summary.csv").open() as f:
        rows = {r["param:cache.block_size"]: r for r in csv.DictReader(f)}
    assert sorted(rows) == ["16", "64"]
    for row in rows.values():
        low, mean, high = (float(row[f"output_throughput{s}"]) for s in ("_ci95_low", "", "_ci95_high"))
        assert low <= mean <= high and row["repeats"] == "3"
    # one run a configuration: its CI spans its repeats only, so no row is marked best (no verdict)
    assert {rows[k]["interval"] for k in rows} == {"within 1 run (3 repeats)"}
    assert "noise:output_throughput" not in rows["16"]
    markdown = (sweep / "sweep_summary.md").read_text()
    assert "±" in markdown and "95% CI" in markdown
    for name in ("sweep_cache_block_size.png", "sweep_latency_cdf.png"):
        assert (sweep / name).stat().st_size > 5000


def test_sweep_level_wandb_run(sweep: Path) -> None:
    (run_dir,) = (sweep / "wandb").glob("offline-run-*")
    state = json.loads(inspect(run_dir, "--summary"))
    assert state["state"] == "finished" and state["name"] == "sweep-report"
    assert state["config"]["cache.block_size"] == [16, 64]  # typed, as numbers
    assert state["config"]["swept_keys"] == ["cache.block_size"]
    assert state["summary"][TABLE_KEY]["_type"] == "table-file"
    images = {
        k for k, v in state["summary"].items() if isinstance(v, dict) and v.get("_type") == "image-file"
    }
    assert images == {"plots/sweep_cache_block_size", "plots/sweep_latency_cdf"}
    run = next(json.loads(line) for line in inspect(run_dir).splitlines() if '"type":"run"' in line)["run"]
    job = json.loads(next(sweep.glob("0_*/results.json")).read_text())["job"]
    assert run["job_type"] == JOB_TYPE and run["run_group"] == job["group"]
    (table_file,) = (run_dir / "files" / "media" / "table").glob(f"{TABLE_KEY}_*.table.json")
    table = json.loads(table_file.read_text())
    assert len(table["data"]) == 2 and "output_throughput_ci95_low" in table["columns"]


def test_job_summaries_equal_results(sweep: Path) -> None:
    for results_file in sorted(sweep.glob("[0-9]*/results.json")):
        results = json.loads(results_file.read_text())
        summary = results["summary"]
        assert not (results_file.parent / "outputs.jsonl").exists()  # off by default off prompts files
        state = json.loads(inspect(Path(results["job"]["wandb"]["dir"]), "--summary"))
        for key in TOTALS:
            assert state["summary"][key] == pytest.approx(summary[key]), key
        # per-step series live under step/ and never shadow the job's totals
        assert "num_output_tokens" not in state["summary"] and "num_seqs" not in state["summary"]
        assert state["summary"]["step/step_time_ms"]["max"] >= state["summary"]["step/step_time_ms"]["min"]
        history = [json.loads(line) for line in inspect(Path(results["job"]["wandb"]["dir"])).splitlines()]
        steps = [r for r in history if r["type"] == "history" and "step/index" in json.dumps(r)]
        assert len(steps) == pytest.approx(summary["num_steps"] * summary["repeats"])


def test_noise_marks_overlapping_intervals() -> None:
    table = pd.DataFrame(
        {
            "status": ["ok", "ok", "ok"],
            "output_throughput": [100.0, 95.0, 50.0],
            "output_throughput_ci95_low": [90.0, 85.0, 45.0],
            "output_throughput_ci95_high": [110.0, 105.0, 55.0],
            "runs": [3, 3, 3],  # intervals over 3 independent runs each
        }
    )
    assert mark_noise(table)["noise:output_throughput"].tolist() == ["best", "within noise", ""]
    one_run = table.assign(runs=[3, 1, 3])  # a row of one run (or flagged) gets no mark, not a guess
    assert mark_noise(one_run)["noise:output_throughput"].tolist() == ["best", "", ""]


def synthetic(engines: list[str], blocks: list[str]) -> pd.DataFrame:
    rows = [
        {
            "status": "ok",
            "param:engine": e,
            "param:cache.block_size": b,
            "output_throughput": 10.0 + i,
            "output_throughput_ci95_low": 9.0 + i,
            "output_throughput_ci95_high": 11.0 + i,
            "peak_memory_bytes": 2e9,
        }
        for i, (e, b) in enumerate((e, b) for e in engines for b in blocks)
    ]
    return pd.DataFrame(rows)


def test_numeric_parameter_is_a_sorted_line_with_error_bars(tmp_path: Path, monkeypatch) -> None:
    from matplotlib.axes import Axes

    calls = []
    original = Axes.errorbar
    monkeypatch.setattr(
        Axes, "errorbar", lambda ax, x, y, **kw: calls.append((list(x), kw)) or original(ax, x, y, **kw)
    )
    table = synthetic(["nanoexp"], ["128", "16", "256", "32"])
    plot_param(table, ["output_throughput"], "param:cache.block_size", [], "t", tmp_path / "p.png")
    ((x, kw),) = calls
    assert x == [16, 32, 128, 256] and kw["yerr"] is not None
    assert (tmp_path / "p.png").stat().st_size > 1000


def test_categorical_parameter_is_grouped_bars_in_numeric_legend_order(tmp_path: Path, monkeypatch) -> None:
    from matplotlib.axes import Axes

    bars = []
    original_bar = Axes.bar
    monkeypatch.setattr(
        Axes, "bar", lambda ax, x, h, **kw: bars.append(kw["label"]) or original_bar(ax, x, h, **kw)
    )
    figure = saved_figure(monkeypatch)
    table = synthetic(["hf", "nanoexp"], ["128", "16", "32"])
    metrics = ["output_throughput", "peak_memory_bytes"]
    plot_param(table, metrics, "param:engine", ["param:cache.block_size"], "t", tmp_path / "p.png")
    expected = [f"cache.block_size={b}" for b in ("16", "32", "128")]
    assert bars == expected * 2  # one bar series per block size, per panel, sorted as numbers
    throughput, memory = figure[0].axes
    assert throughput.get_ylim()[0] == 0 and memory.get_ylim()[0] == 0  # both panels start at zero


def saved_figure(monkeypatch) -> list:
    """Collects the figure the next plot saves (still open when the test reads it)."""
    from nanoexp.experiment.report import sweep_plots

    figures = []
    original = sweep_plots.save_figure

    def keep(fig, *args, **kwargs):
        figures.append(fig)
        fig.savefig = lambda *a, **kw: None
        original(fig, *args, **kwargs)

    monkeypatch.setattr(sweep_plots, "save_figure", keep)
    monkeypatch.setattr("matplotlib.pyplot.close", lambda fig=None: None)
    return figures


def test_panels_are_titled_in_words_hold_every_point_and_keep_the_legend_off_the_data(
    tmp_path: Path, monkeypatch
) -> None:
    figure = saved_figure(monkeypatch)
    table = synthetic(["nanoexp"], ["16", "32", "64"]).assign(p99_ttft_ms=[5.0, 7.0, 9.0])
    table.loc[2, "output_throughput_ci95_high"] = 40.0  # the highest point is an error bar's end
    metrics = ["output_throughput", "p99_ttft_ms", "peak_memory_bytes"]
    plot_param(table, metrics, "param:cache.block_size", ["param:engine"], "t", tmp_path / "p.png")
    (fig,) = figure
    assert [ax.get_title() for ax in fig.axes] == [
        "output throughput (tok/s)",
        "p99 TTFT (ms)",
        "peak memory (GB)",
    ]
    tops = [ax.get_ylim()[1] for ax in fig.axes]
    assert tops[0] > 40.0 and tops[1] > 9.0 and tops[2] > 2.0  # 2e9 bytes: flat at 2 GB, not cut
    assert all(ax.get_legend() is None for ax in fig.axes) and len(fig.legends) == 1  # below the panels
