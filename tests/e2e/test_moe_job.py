"""A qwen3_moe_tiny job through run.py: the expert-load columns of steps.csv, the summary's per-layer
imbalance and the heatmap, with counts equal to transformers' router choices on the same tokens."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

ROOT = Path(__file__).resolve().parents[2]
PROMPT_LENGTHS = (5, 11, 23)  # distinct: outputs.jsonl names a request's prompt by its length
OUTPUT_LEN = 6


def run_py(tmp_path: Path, *overrides: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "HYDRA_FULL_ERROR"))}
    env |= {"HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT), "WANDB_MODE": "offline"}
    cmd = [sys.executable, "run.py", f"hydra.run.dir={tmp_path / 'job'}", *overrides]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


def tiny_moe_checkpoint(path: Path) -> Qwen3MoeForCausalLM:
    """conf/model/qwen3_moe_tiny.yaml's architecture with transformers' random weights, saved to `path`."""
    arch = OmegaConf.to_container(OmegaConf.load(ROOT / "conf/model/qwen3_moe_tiny.yaml").arch)
    arch.pop("model_type")
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**arch)).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.normal_(0.0, 1.0)  # decisive routing: no near-ties between our logits and theirs
    model.save_pretrained(path)
    return model


def transformers_routing(model, sequences: list[list[int]]) -> np.ndarray:
    """[moe layers, experts]: how often transformers' routers pick each expert for these tokens."""
    routers = [m for n, m in model.named_modules() if n.endswith("mlp.gate")]
    counts = np.zeros((len(routers), model.config.num_experts), dtype=np.int64)

    def counter(layer):
        def hook(module, args, output):
            ids = output[2].flatten().numpy()
            np.add.at(counts[layer], ids, 1)

        return hook

    hooks = [r.register_forward_hook(counter(i)) for i, r in enumerate(routers)]
    with torch.no_grad():
        for seq in sequences:
            model(torch.tensor([seq]))
    for h in hooks:
        h.remove()
    return counts


@pytest.mark.slow
def test_moe_job_counts_expert_load_as_transformers_routes(tmp_path):
    model = tiny_moe_checkpoint(tmp_path / "ckpt")
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 1000, n).tolist() for n in PROMPT_LENGTHS]
    prompts_file = tmp_path / "prompts.jsonl"
    prompts_file.write_text("".join(json.dumps({"prompt_token_ids": p}) + "\n" for p in prompts))
    run_py(
        tmp_path,
        "model=qwen3_moe_tiny",
        f"model.path={tmp_path / 'ckpt'}",
        "model.load_format=safetensors",
        "workload=prompts_file",
        f"workload.path={prompts_file}",
        f"workload.output_len={OUTPUT_LEN}",
        "workload.ignore_eos=true",
        "cache=no_prefix",  # every prompt token is computed (and routed) in the timed steps
        "sampler=greedy",
        "logger=none",
    )
    job = tmp_path / "job"
    by_length = {len(p): p for p in prompts}
    outputs = [json.loads(line) for line in (job / "outputs.jsonl").read_text().splitlines()]
    fed = [by_length[o["prompt_len"]] + o["output_token_ids"][:-1] for o in outputs]  # the last is never fed
    want = transformers_routing(model, fed)

    with open(job / "expert_load.csv") as f:
        got = np.array([row[1:] for row in csv.reader(f)][1:], dtype=np.int64)
    np.testing.assert_array_equal(got, want)

    steps = list(csv.DictReader(open(job / "steps.csv")))
    assert steps and all(row["expert_load_max"] for row in steps)
    for row in steps:  # every layer routes each token to top_k experts: the mean is the same in all
        assert float(row["expert_load_mean"]) == pytest.approx(int(row["num_tokens"]) * 2 / 8)
        assert int(row["expert_load_max"]) <= int(row["num_tokens"])
    assert sum(int(row["num_tokens"]) for row in steps) == sum(map(len, fed))

    summary = json.loads((job / "results.json").read_text())["summary"]
    mean = want.mean(axis=1)
    assert summary["expert_load_imbalance_per_layer"] == pytest.approx(
        list(want.max(axis=1) / mean), abs=1e-4
    )
    assert summary["expert_load_tokens_routed"] == want.sum()
    assert (job / summary["expert_load_heatmap"]).read_bytes().startswith(b"\x89PNG")


@pytest.mark.slow
def test_moe_job_through_transformers(tmp_path):
    """engine=hf runs the same MoE architecture through transformers (no expert-load counts there)."""
    run_py(tmp_path, "experiment=tiny_smoke", "model=qwen3_moe_tiny", "engine=hf")
    summary = json.loads((tmp_path / "job" / "results.json").read_text())["summary"]
    assert summary["engine_kind"] == "hf" and summary["total_output_tokens"] > 0
    assert "expert_load_heatmap" not in summary
