"""The TP scaling study's CPU-checkable parts: GPU claiming per job, the report, the parity check."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nanoexp.experiment import gpus

ROOT = Path(__file__).resolve().parents[1]


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "experiments" / "tp_scaling" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def four_gpus(monkeypatch):
    monkeypatch.setattr(gpus, "physical_gpus", lambda: ["0", "1", "2", "3"])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7")  # submitit's gpus_per_node=8


def test_visible_gpus_drop_indices_the_machine_lacks(four_gpus):
    assert gpus.visible_gpus() == ["0", "1", "2", "3"]


def test_no_gpus_means_no_claim(monkeypatch):
    monkeypatch.setattr(gpus, "physical_gpus", lambda: [])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert gpus.claim(2, 1) == []
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_gpus_needed_covers_the_ranks():
    assert gpus.gpus_needed(1, 2) == 2 and gpus.gpus_needed(2, 1) == 2 and gpus.gpus_needed(0, 4) == 0


def test_locked_claims_never_share_a_gpu(four_gpus, tmp_path, monkeypatch):
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert gpus.try_take(["0", "1", "2", "3"], 1, tmp_path) == ["0"]
        for lock in tmp_path.glob("*-gpu*"):
            lock.write_text(str(other.pid))  # as if job 0 (still running) held GPU 0
        assert gpus.claim(2, 1, tmp_path) == ["2", "3"]
        for lock in tmp_path.glob("*-gpu[23]"):
            lock.write_text(str(other.pid))
        assert gpus.try_take(["0", "1", "2", "3"], 2, tmp_path) == []  # only GPU 1 is free
    finally:
        other.kill()
        other.wait()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")  # undo this process's narrowing
    assert gpus.claim(2, 2, tmp_path) == ["0", "1"]  # its holder exited: free again
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"


def fake_results(root: Path, name: str, **fields) -> None:
    config = {
        "model": {"name": fields["model"]}, "parallel": {"tensor_parallel_size": fields["tp"]},
        "workload": {"name": fields["workload"], "batch_size": fields.get("batch", 8)},
        "launch": {"gpus_per_job": fields.get("gpus_per_job", 0)},
        "resolved": {
            "cuda_visible_devices": fields.get("visible"), "gpus_claimed_at": fields.get("claimed_at"),
        },
    }
    kept = ("output_throughput", "median_tpot_ms", "device", "error")
    summary = {k: fields[k] for k in kept if k in fields}
    (root / name).mkdir(parents=True)
    status = "failed" if "error" in fields else "ok"
    job = {"job_num": fields.get("job_num", 0)}
    (root / name / "results.json").write_text(json.dumps({"status": status, "job": job, "config": config,
                                                          "summary": summary}))


def test_report_tables_and_plot(tmp_path):
    report = load_script("report")
    bench = dict(model="qwen3_0_6b", workload="nanovllm_bench")
    fake_results(tmp_path, "t/0", tp=1, output_throughput=1000.0, **bench)
    fake_results(tmp_path, "t/1", tp=2, output_throughput=1500.0, **bench)
    fake_results(tmp_path, "t/2", tp=4, error="CUDA out of memory", **bench)
    fake_results(tmp_path, "l/0", model="qwen3_0_6b", tp=2, workload="latency", batch=64, median_tpot_ms=3.25)
    # jobs 0 and 1 ran at once on GPU 0 (claimed at time 0, finished now); job 2 waited for them
    for job, visible, claimed in ((0, "0", 0.0), (1, "0,1", 0.0), (2, "1", time.time() + 60)):
        fake_results(tmp_path, f"g/{job}", model="qwen3_0_6b", tp=1, workload="smoke", gpus_per_job=1,
                     visible=visible, device="cuda", job_num=job, claimed_at=claimed)
    rows = report.load_rows(tmp_path)
    text = report.markdown(rows, ["qwen3_0_6b", "qwen3_8b"], [1, 2, 4, 8])
    assert "| qwen3_0_6b | 1,000 (1.00x) | 1,500 (1.50x) | failed: CUDA out of memory | not run |" in text
    assert "| qwen3_8b | not run | not run | not run | not run |" in text
    assert "| qwen3_0_6b | 64 | not run | 3.25 | not run | not run |" in text
    assert "GPUs held by two jobs at once: GPU 0: jobs 0 and 1\n" in text
    report.plot(rows, ["qwen3_0_6b", "qwen3_8b"], [1, 2, 4, 8], tmp_path / "plot.png")
    assert (tmp_path / "plot.png").stat().st_size > 1000


def test_parity_checks_a_divergence_against_tp1_top3(tmp_path):
    """A made-up TP=N output diverging at token 2: the check consults TP=1's logits there."""
    parity = load_script("parity")
    parity.save_checkpoint("qwen3_tiny", "float32", tmp_path)
    args = type("Args", (), {"device": "cpu", "dtype": "float32", "max_tokens": 4})()
    prompts = parity.make_prompts(2, 1024)
    ref = parity.generate(str(tmp_path), 1, prompts, args)
    with parity.LLM(str(tmp_path), tensor_parallel_size=1, **parity.engine_kwargs(args)) as llm:
        top = parity.top_k_at(llm, prompts[0] + ref[0][:2])
    assert top[0] == ref[0][2]
    for token, in_top in ((top[1], 1), (next(t for t in range(1024) if t not in top), 0)):
        got = [ref[0][:2] + [token, 0], ref[1]]
        result = parity.compare(str(tmp_path), prompts, ref, got, args)
        assert result["identical"] == 1 and result["first_divergence_in_top3"] == in_top
        assert result["passed"] == bool(in_top)
