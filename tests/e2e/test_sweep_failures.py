"""The sweep report lists every job: ok, failed (results.json says so) or vanished (a dir without
results.json, or an expected job without a dir), whatever the launcher, even when it aborts."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml
from helpers import ROOT, job_env
from hydra.experimental.callback import Callback
from omegaconf import OmegaConf

from nanoexp.experiment.launch.sweep_callback import wait_for_local_jobs
from nanoexp.experiment.report.sweep_report import expected_jobs, write_report


def fake_job(sweep: Path, num: int, block_size: int, status: str | None) -> None:
    job_dir = sweep / f"{num}_cache.block_size={block_size}"
    (job_dir / ".hydra").mkdir(parents=True)
    overrides = [f"cache.block_size={block_size}"]
    (job_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    if status is None:
        return  # the job died before writing results.json
    summary = {"output_throughput": 10.0 * (num + 1)} if status == "ok" else {"error": "boom"}
    job = {"job_num": num, "overrides": overrides}
    (job_dir / "results.json").write_text(json.dumps({"status": status, "job": job, "summary": summary}))


def read_rows(sweep: Path) -> dict[str, dict]:
    with (sweep / "sweep_summary.csv").open() as f:
        return {r["job_num"]: r for r in csv.DictReader(f)}


def test_report_lists_ok_failed_dead_and_missing_jobs(tmp_path):
    sweep = tmp_path / "sweep"
    fake_job(sweep, 0, 16, "ok")
    fake_job(sweep, 1, 32, "failed")
    fake_job(sweep, 2, 64, None)
    (sweep / ".submitit").mkdir()  # launcher's own dirs are not jobs
    expected = [[f"cache.block_size={b}"] for b in (16, 32, 64, 128)]
    table = write_report(sweep, expected)
    assert list(table["status"]) == ["ok", "failed", "vanished", "vanished"]
    rows = read_rows(sweep)
    assert rows["1"]["error"] == "boom" and "results.json" in rows["2"]["error"]
    assert rows["3"]["param:cache.block_size"] == "128" and "never started" in rows["3"]["error"]
    assert rows["2"]["param:cache.block_size"] == "64"
    markdown = (sweep / "sweep_summary.md").read_text()
    assert markdown.count("vanished") == 2 and "failed" in markdown


def test_corrupt_results_json_is_listed_not_fatal(tmp_path):
    sweep = tmp_path / "sweep"
    fake_job(sweep, 0, 16, "ok")
    fake_job(sweep, 1, 32, "ok")
    (sweep / "1_cache.block_size=32" / "results.json").write_text('{"status": "o')
    table = write_report(sweep)
    assert list(table["status"]) == ["ok", "vanished"]


def test_jobs_whose_dir_nests_under_a_path_override_are_found(tmp_path):
    sweep = tmp_path / "sweep"
    job_dir = sweep / "0_workload.path=data" / "prompts.jsonl"  # for workload.path=data/prompts.jsonl
    job_dir.mkdir(parents=True)
    job = {"job_num": 0, "overrides": ["workload.path=data/prompts.jsonl"]}
    summary = {"output_throughput": 5.0}
    (job_dir / "results.json").write_text(json.dumps({"status": "ok", "job": job, "summary": summary}))
    table = write_report(sweep, [job["overrides"]])
    assert list(table["status"]) == ["ok"]


def test_expected_jobs_of_the_basic_sweeper():
    config = OmegaConf.create(
        {
            "hydra": {
                "sweeper": {
                    "_target_": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper",
                    "params": None,
                },
                "overrides": {"task": ["cache.block_size=16,32", "sampler=greedy,top_p", "model=qwen3_tiny"]},
            }
        }
    )
    jobs = expected_jobs(config)
    assert len(jobs) == 4 and all("model=qwen3_tiny" in j for j in jobs)
    config.hydra.sweeper._target_ = "some.other.Sweeper"
    assert expected_jobs(config) is None


class KillJobOne(Callback):
    """Test-only: job 1 of a sweep dies as if killed (no results.json, no exit code of its own)."""

    def on_job_start(self, config, **kwargs) -> None:
        if config.hydra.job.get("num") == 1:
            os.kill(os.getpid(), signal.SIGKILL)


def test_submitit_sweep_with_a_killed_job_still_reports(tmp_path):
    env = job_env(tmp_path / "home")
    sweep = tmp_path / "sweep"
    cmd = [
        sys.executable,
        "run.py",
        "-m",
        f"hydra.sweep.dir={sweep}",
        "hydra/launcher=local",
        "+hydra.callbacks.kill._target_=tests.e2e.test_sweep_failures.KillJobOne",
        "model=qwen3_tiny",
        "cache.cpu_kv_cache_gib=0.05",
        "logger=none",
        "workload.num_requests=2",
        "workload.output_len=4",
        "cache.block_size=16,32,64",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    rows = read_rows(sweep)
    statuses = {r["param:cache.block_size"]: r["status"] for r in rows.values()}
    assert statuses == {"16": "ok", "32": "vanished", "64": "ok"}, proc.stderr[-3000:]
    assert "1 of 3 jobs failed or vanished" in proc.stderr


def test_after_an_abort_running_local_jobs_are_awaited_then_terminated(tmp_path):
    quick = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    stuck = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    for proc in (quick, stuck):
        (tmp_path / ".submitit" / str(proc.pid)).mkdir(parents=True)
    start = time.monotonic()
    wait_for_local_jobs(tmp_path, wait_s=3.0)
    assert 2.5 < time.monotonic() - start < 10
    assert stuck.wait(timeout=5) == -signal.SIGTERM
