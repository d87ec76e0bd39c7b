"""A ShareGPT-format dataset through run.py: prompts tokenized with the checkpoint's tokenizer, outputs
generated to the answer's token count; a checkpoint without a tokenizer is one line and exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import SHAPES, build_checkpoint
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

ROOT = Path(__file__).resolve().parents[2]
COMMON = ["cache.cpu_kv_cache_gib=0.05", "logger=none", "metrics.kv_quality.num_requests=0"]


def run_job(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "HYDRA_FULL_ERROR"))}
    env |= {"HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "run.py", f"hydra.run.dir={tmp_path / 'run'}", *COMMON, *overrides]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def write_dataset(path: Path) -> dict[str, tuple[int, int]]:
    """Five conversations of w<i> words; returns origin -> (prompt tokens, answer tokens)."""
    data, lengths = [], {}
    for i in range(5):
        prompt, answer = (
            " ".join(f"w{i + j}" for j in range(5 + i)),
            " ".join(f"w{j}" for j in range(4 + 2 * i)),
        )
        data.append({"conversations": [{"from": "human", "value": prompt}, {"from": "gpt", "value": answer}]})
        lengths[f"{path.name}#{i}"] = (5 + i, 4 + 2 * i)
    path.write_text(json.dumps(data))
    return lengths


@pytest.mark.slow
def test_sharegpt_job_uses_the_checkpoint_tokenizer(tmp_path: Path) -> None:
    checkpoint = tmp_path / "ckpt"
    build_checkpoint(checkpoint, *SHAPES["qwen3_gqa1"])
    raw = Tokenizer(models.WordLevel({f"w{i}": i for i in range(384)}, unk_token="w0"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=raw).save_pretrained(checkpoint)
    lengths = write_dataset(tmp_path / "sharegpt.json")
    model = ["model=qwen3_tiny", f"model.path={checkpoint}", "model.load_format=safetensors"]
    data = ["workload=sharegpt", f"workload.path={tmp_path / 'sharegpt.json'}", "workload.num_requests=4"]
    proc = run_job(tmp_path, *model, *data, "workload.seed=3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = pd.read_csv(tmp_path / "run" / "requests.csv")
    assert len(rows) == 4 and rows["origin"].nunique() == 4
    for _, row in rows.iterrows():
        assert (row["prompt_len"], row["output_len"]) == lengths[row["origin"]]


def test_sharegpt_without_a_tokenizer_is_one_line(tmp_path: Path) -> None:
    write_dataset(tmp_path / "sharegpt.json")
    proc = run_job(
        tmp_path, "model=qwen3_tiny", "workload=sharegpt", f"workload.path={tmp_path / 'sharegpt.json'}"
    )
    assert proc.returncode == 2
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("nanoexp: error:")]
    assert "workload=sharegpt counts tokens with the checkpoint's tokenizer" in line
