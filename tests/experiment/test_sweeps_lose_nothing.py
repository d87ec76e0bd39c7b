"""Sweeps that lose nothing and plots a reader trusts: appended jobs numbered after the sweep's, jobs with
different unswept keys listed, a report failure an error line and exit code, unknown metric names and
empty comparisons errors; flagged jobs marked in every plot, the max-rate line never resting on one."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from nanoexp.experiment.launch.sweep_callback import next_job_number
from nanoexp.experiment.report import compare, sweep_plots, sweep_report
from nanoexp.experiment.schema import JOB_NUM_OFFSET, job_number


def fake_job(sweep: Path, num: int, overrides: list[str], value: float, **extra) -> Path:
    job = sweep / f"{num}_{','.join(overrides)}"
    job.mkdir(parents=True)
    summary = {"output_throughput": value, "mean_ttft_ms": 10.0, "repeats": 1, "noise_warning": ""}
    summary |= {"per_repeat": [{"output_throughput": value}]} | extra
    results = {"status": "ok", "job": {"job_num": num, "overrides": overrides}, "summary": summary}
    (job / "results.json").write_text(json.dumps(results))
    return job


def test_appended_jobs_are_numbered_after_the_sweeps(tmp_path: Path, monkeypatch) -> None:
    fake_job(tmp_path, 0, ["cache.block_size=16"], 1.0)
    fake_job(tmp_path, 1, ["cache.block_size=64"], 1.0)
    assert next_job_number(tmp_path) == 2 and next_job_number(tmp_path / "0_cache.block_size=16") == 0
    monkeypatch.setenv(JOB_NUM_OFFSET, "2")
    assert job_number(0) == 2  # the first appended job's dir and job_num: 2, not 0 (overwritten before)


def test_jobs_with_different_unswept_keys_are_listed_not_a_crash(tmp_path: Path) -> None:
    fake_job(tmp_path, 0, ["cache.block_size=16"], 100.0)
    fake_job(tmp_path, 1, ["cache.block_size=64"], 120.0)
    fake_job(tmp_path, 2, ["cache.block_size=64", "scheduler.max_num_seqs=8"], 90.0)
    table = sweep_report.write_report(tmp_path)
    text = (tmp_path / "sweep_summary.md").read_text()
    assert len(table) == 3 and "scheduler.max_num_seqs: set only in jobs 2" in text
    assert (tmp_path / "sweep_scheduler_max_num_seqs.png").is_file()


def test_a_report_failure_is_an_error_line_and_a_non_zero_exit(tmp_path: Path, monkeypatch, capsys) -> None:
    fake_job(tmp_path, 0, ["cache.block_size=16"], 100.0)

    def broken(*args, **kwargs):
        raise ValueError("Categorical categories cannot be null")

    monkeypatch.setattr(sweep_report, "mark_noise", broken)
    assert sweep_report.cli([str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("nanoexp: error: sweep report of") and "Categorical" in err


def test_an_unknown_metric_name_is_an_error(tmp_path: Path, capsys) -> None:
    a = tmp_path / "a"
    fake_job(a, 0, ["cache.block_size=16"], 100.0, prefill_time_s=1.0)
    assert sweep_report.cli([str(a), "--metrics", "not_a_metric"]) == 1
    assert "unknown metric 'not_a_metric'" in capsys.readouterr().err
    assert sweep_report.cli([str(a), "--metrics", "prefill_time_s"]) == 0  # any summary key the jobs wrote
    assert compare.cli([str(a), str(a), "--metrics", "nonexistent"]) == 2
    assert "nanoexp: error: --metrics: unknown metric 'nonexistent'" in capsys.readouterr().err


def test_two_sweeps_with_nothing_in_common_are_an_error(tmp_path: Path, capsys) -> None:
    fake_job(tmp_path / "a", 0, ["cache.block_size=16"], 100.0)
    fake_job(tmp_path / "a", 1, ["cache.block_size=32"], 100.0)
    fake_job(tmp_path / "b", 0, ["cache.block_size=64"], 100.0)
    fake_job(tmp_path / "b", 1, ["cache.block_size=128"], 100.0)
    assert compare.cli([str(tmp_path / "a"), str(tmp_path / "b")]) == 2
    assert "nanoexp: error: no configuration of" in capsys.readouterr().err


def rate_table(busy_at: float | None) -> pd.DataFrame:
    rates = [1.0, 4.0, 16.0]
    return pd.DataFrame(
        {
            "status": ["ok"] * 3,
            "param:workload.request_rate": [str(r) for r in rates],
            "slo_attainment": [1.0, 1.0, 1.0],
            "noisy_runs": [int(r == busy_at) for r in rates],
        }
    )


def test_the_max_rate_line_never_rests_on_a_flagged_job() -> None:
    slo = {"ttft_ms": 200.0}
    clean = sweep_plots.max_rates(rate_table(None), [])[0]
    assert clean["max_rate"] == 16.0
    busy = sweep_plots.max_rates(rate_table(4.0), [])[0]
    assert busy["max_rate"] == 1.0 and busy["withheld_at"] == 4.0
    line = sweep_plots.rate_line(slo, busy)
    assert "1 req/s or more" in line and "rate 4 req/s unknown (machine busy" in line


class Captured:
    figures: list = []


@pytest.fixture
def captured(monkeypatch):
    Captured.figures = []
    real = sweep_plots.save_figure

    def keep(fig, *args, **kwargs):
        real(fig, *args, **kwargs)
        Captured.figures.append(fig)

    monkeypatch.setattr(sweep_plots, "save_figure", keep)
    monkeypatch.setattr(compare, "save_figure", keep)
    return Captured.figures


def test_flagged_jobs_are_marked_in_the_parameter_plots(tmp_path: Path, captured) -> None:
    table = pd.DataFrame(
        {
            "status": ["ok", "ok"],
            "param:cache.block_size": ["16", "64"],
            "output_throughput": [100.0, 60.0],
            "noisy_runs": [0, 1],
        }
    )
    sweep_plots.plot_param(
        table, ["output_throughput"], "param:cache.block_size", [], "t", tmp_path / "p.png"
    )
    (fig,) = captured
    marks = [
        line for ax in fig.axes for line in ax.get_lines() if line.get_label() == sweep_plots.FLAGGED_LABEL
    ]
    assert len(marks) == 1 and list(marks[0].get_ydata()) == [60.0]
    assert fig.legends and sweep_plots.FLAGGED_LABEL in [t.get_text() for t in fig.legends[0].get_texts()]


def test_the_serving_plot_is_a_readable_grid(tmp_path: Path, captured) -> None:
    table = pd.DataFrame(
        {
            "status": ["ok"] * 4,
            "param:workload.request_rate": ["1", "4", "1", "4"],
            "param:cache.block_size": ["16", "16", "64", "64"],
            **{
                m: [1.0, 2.0, 1.5, 2.5]
                for m in ("median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms")
            },
            **{m: [1.0, 2.0, 1.5, 2.5] for m in ("median_itl_ms", "p99_itl_ms", "request_throughput")},
            "noisy_runs": [0, 0, 0, 1],
        }
    )
    sweep_plots.plot_serving(table, ["param:cache.block_size"], {}, "t", tmp_path / "s.png")
    (fig,) = captured
    visible = [ax for ax in fig.axes if ax.get_visible()]
    rows = {round(ax.get_position().y0, 2) for ax in visible}
    assert len(visible) == len(sweep_plots.SERVING_PANELS) and len(rows) == 2  # a grid, not one long row
    legend = fig.legends[0]
    assert min(t.get_fontsize() for t in legend.get_texts()) >= 9
    assert "median: solid" in legend.get_title().get_text()
    styles = {line.get_linestyle() for line in visible[0].get_lines()}
    assert {"-", "--"} <= styles  # median solid, p99 dashed


def test_compare_plot_titles_say_the_unit_and_which_way_is_better(tmp_path: Path, captured) -> None:
    table = pd.DataFrame(
        {
            "config": ["all"],
            "metric": ["mean_ttft_ms"],
            "ratio": [1.1],
            "ratio_ci95_low": [1.0],
            "ratio_ci95_high": [1.2],
            "verdict": ["within noise"],
        }
    )
    compare.plot(table, tmp_path / "c.png")
    (fig,) = captured
    ax = fig.axes[0]
    assert ax.get_title() == "mean TTFT (ms)" and "lower is better" in ax.get_ylabel()
