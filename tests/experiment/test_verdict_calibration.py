"""The verdicts' calibration on synthetic runs from a known two-level noise model: each run of a
configuration shifts its mean by a between-run effect, and its repeats scatter around that. Identical
configurations (A/A) must be called different at most at the rate the confidence level allows (within
its binomial margin); a known effect must be found; intervals over runs must cover the true mean."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from nanoexp.experiment.metrics.trial_stats import CONFIDENCE, ratio_interval, run_interval, verdict
from nanoexp.experiment.report.compare import compare

COMPARISONS, RUNS, REPEATS = 200, 3, 5
# on GPUs (experiments/verdicts): ±1-2% between processes, ±0.5% inside one
BETWEEN_CV, WITHIN_CV = 0.05, 0.01
ALPHA = 1 - CONFIDENCE
# false verdicts allowed in COMPARISONS A/A tests: the binomial's 99.9% quantile at the nominal rate
BOUND = int(stats.binom.ppf(0.999, COMPARISONS, ALPHA))


def simulate_side(rng: np.random.Generator, mean: float, runs: int = RUNS) -> list[list[float]]:
    """`runs` runs of REPEATS repeats each: a run's own mean, then its repeats around it."""
    run_means = mean * (1 + BETWEEN_CV * rng.standard_normal(runs))
    return [list(m * (1 + WITHIN_CV * rng.standard_normal(REPEATS))) for m in run_means]


def called(a: list[list[float]], b: list[list[float]]) -> bool:
    """A verdict (better/worse) from the runs' means, as compare makes it."""
    value, low, high = ratio_interval([np.mean(r) for r in a], [np.mean(r) for r in b])
    return verdict(value, low, high, "higher") in ("better", "worse")


def pooled_repeats_called(a: list[list[float]], b: list[list[float]]) -> bool:
    """The old rule: every repeat of every run an independent sample (Welch on the pooled repeats)."""
    flat_a, flat_b = sum(a, []), sum(b, [])
    value, low, high = ratio_interval(flat_a, flat_b)
    return verdict(value, low, high, "higher") in ("better", "worse")


def test_identical_configurations_are_called_different_at_most_at_the_nominal_rate() -> None:
    rng = np.random.default_rng(46)
    pairs = [(simulate_side(rng, 1000.0), simulate_side(rng, 1000.0)) for _ in range(COMPARISONS)]
    false = sum(called(a, b) for a, b in pairs)
    assert false <= BOUND, f"{false} of {COMPARISONS} A/A comparisons called different (bound {BOUND})"
    # the same data judged with the repeats as samples: the run-to-run variance is missing, and most
    # identical pairs come out "different" (what `compare` did before trials were its samples)
    assert sum(pooled_repeats_called(a, b) for a, b in pairs) > 4 * BOUND


def test_a_known_effect_is_detected() -> None:
    rng = np.random.default_rng(7)
    slower = [called(simulate_side(rng, 1000.0), simulate_side(rng, 800.0)) for _ in range(COMPARISONS)]
    assert sum(slower) >= 0.8 * COMPARISONS  # a 20% loss against 5% run-to-run noise, 3 runs a side


def test_interval_over_runs_covers_the_true_mean() -> None:
    rng = np.random.default_rng(3)
    covered = 0
    for _ in range(COMPARISONS):
        estimate = run_interval([np.mean(r) for r in simulate_side(rng, 1000.0)])
        covered += estimate.low <= 1000.0 <= estimate.high
    assert covered >= COMPARISONS - BOUND


def test_too_few_runs_give_no_verdict() -> None:
    value, low, high = ratio_interval([100.0, 101.0], [200.0, 201.0])  # two runs a side
    assert verdict(value, low, high, "higher") == "not enough runs"
    assert not run_interval([100.0, 101.0]).has_interval


def write_sweep(sweep: Path, runs: list[list[float]], busy: list[int] | None = None) -> None:
    """A sweep dir of one configuration run len(runs) times (trial=0,1,...), as run.py leaves it."""
    for num, repeats in enumerate(runs):
        job = sweep / f"{num}_trial={num}"
        job.mkdir(parents=True)
        summary = {"output_throughput": float(np.mean(repeats)), "repeats": len(repeats), "noise_warning": ""}
        summary |= {"per_repeat": [{"output_throughput": v} for v in repeats]}
        summary["noise_busy_repeats"] = (busy or [0] * len(runs))[num]
        results = {"status": "ok", "job": {"job_num": num, "overrides": [f"trial={num}"]}, "summary": summary}
        (job / "results.json").write_text(json.dumps(results))


def test_compare_of_identical_sweeps_has_no_verdict_at_the_nominal_rate(tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    false = 0
    for i in range(COMPARISONS // 4):  # through the files and compare(), as a user runs it
        a, b = tmp_path / f"a{i}", tmp_path / f"b{i}"
        write_sweep(a, simulate_side(rng, 1000.0))
        write_sweep(b, simulate_side(rng, 1000.0))
        table, _ = compare(a, b, ["output_throughput"])
        false += table["verdict"].isin(["better", "worse"]).sum()
    assert false <= int(stats.binom.ppf(0.999, COMPARISONS // 4, ALPHA))


def test_a_run_flagged_busy_is_shown_but_withholds_the_verdict(tmp_path: Path) -> None:
    write_sweep(tmp_path / "a", [[1000.0, 1001.0]] * 2 + [[999.0, 1000.0]])
    write_sweep(tmp_path / "b", [[600.0, 601.0], [1000.0, 1002.0], [998.0, 1000.0]], busy=[5, 0, 0])
    table, _ = compare(tmp_path / "a", tmp_path / "b", ["output_throughput"])
    row = table.iloc[0]
    assert row["verdict"] == "withheld: noisy" and row["noisy_runs"] == "0/1" and row["runs"] == "3/2"
    assert row["b"] == pytest.approx(1000.0)  # the clean runs' mean; the busy run is not in it


def test_busy_means_load_beyond_the_cores_the_job_left_free() -> None:
    from nanoexp.experiment.measure.repeats import busy_limit, noise_flags
    from nanoexp.experiment.schema import BUSY_CORES, NoiseConfig

    # experiments/verdicts: 0.38 other cores cost a job on both cores 40%
    both_cores = [{"process_cpu_cores": 2.0, "other_cpu_cores": 0.38}]
    assert busy_limit(both_cores, 2, BUSY_CORES) == pytest.approx(BUSY_CORES) and BUSY_CORES < 0.38
    squeezed = [{"process_cpu_cores": 1.24, "other_cpu_cores": 0.74}]  # the job got less than it wanted
    assert busy_limit(squeezed, 2, BUSY_CORES) == pytest.approx(BUSY_CORES)
    one_thread = [{"process_cpu_cores": 1.03}]  # OMP_NUM_THREADS=1 on 2 cores: one core free
    assert busy_limit(one_thread, 2, BUSY_CORES) == pytest.approx(1 + BUSY_CORES)
    gpu_job = [{"process_cpu_cores": 1.2, "other_cpu_cores": 0.6}]  # a GPU host's 16 cores
    assert busy_limit(gpu_job, 16, BUSY_CORES) == pytest.approx(14 + BUSY_CORES)
    cfg = NoiseConfig(min_duration_s=0)
    assert noise_flags({"cpu_count": 2}, both_cores, cfg)["noise_busy_repeats"] == 1
    assert noise_flags({"cpu_count": 16}, gpu_job, cfg)["noise_busy_repeats"] == 0
