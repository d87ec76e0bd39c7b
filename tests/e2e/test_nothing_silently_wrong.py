"""Jobs through `python run.py` whose results could rest on garbage, or whose errors could point at the
wrong place: a checkpoint that disagrees with model.arch, prompts files and their lines, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import SHAPES, build_checkpoint

ROOT = Path(__file__).resolve().parents[2]
TINY = ["model=qwen3_tiny", "logger=none", "cache.cpu_kv_cache_gb=0.05", "engine.use_tqdm=false"]


def run_py(tmp_path: Path, *overrides: str, multirun: bool = False) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "HYDRA_FULL_ERROR"))}
    env |= {"HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}
    where = f"hydra.sweep.dir={tmp_path / 'sweep'}" if multirun else f"hydra.run.dir={tmp_path / 'job'}"
    cmd = [sys.executable, "run.py", *(["-m"] if multirun else []), where, *overrides]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def error_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [ln for ln in proc.stderr.splitlines() if ln.startswith("nanoexp: error:")]


def results(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "job" / "results.json").read_text())


def test_the_checkpoints_vocabulary_wins_over_model_arch_in_the_workload(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    build_checkpoint(ckpt, *SHAPES["qwen3_gqa1"], vocab=509)
    proc = run_py(tmp_path, *TINY, f"model.path={ckpt}", "model.load_format=safetensors")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = results(tmp_path)["summary"]
    assert summary["arch_mismatches"] >= 2  # vocab_size and the rest of the shape
    assert "vocab_size: config.json=509 model.arch=1024" in (tmp_path / "job" / "run.log").read_text()
    with (tmp_path / "job" / "requests.csv").open() as f:
        assert len(f.readlines()) == 1 + summary["completed"]
