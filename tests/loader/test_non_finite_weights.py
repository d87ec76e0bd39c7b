"""A checkpoint holding NaN or inf is one error line naming the tensor and its file, through the API and
through run.py; it never runs "ok" on garbage."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from checkpoints import SHAPES, build_checkpoint
from safetensors.torch import load_file, save_file

from nanoexp import LLM
from nanoexp.loader import CheckpointError

ROOT = Path(__file__).resolve().parents[2]
TENSOR = "model.layers.1.mlp.down_proj.weight"


def spoil(path: Path, name: str, value: float, index: int = 3) -> Path:
    file = path / "model.safetensors"
    tensors = load_file(file)
    tensors[name].view(-1)[index] = value
    save_file(tensors, file, metadata={"format": "pt"})
    return file


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_weight_is_one_line_naming_tensor_and_file(tmp_path: Path, value: float) -> None:
    build_checkpoint(tmp_path, *SHAPES["qwen3_gqa1"])
    file = spoil(tmp_path, TENSOR, value)
    with pytest.raises(CheckpointError) as info:
        LLM(str(tmp_path), kv_block_size=16).close()
    message = str(info.value)
    assert "\n" not in message and TENSOR in message and str(file) in message
    assert ("1 NaN" if value != value else "1 inf") in message


def test_a_fused_part_is_named_not_the_fused_parameter(tmp_path: Path) -> None:
    build_checkpoint(tmp_path, *SHAPES["qwen3_gqa2_tied"])
    spoil(tmp_path, "model.layers.0.self_attn.v_proj.weight", float("nan"))
    with pytest.raises(CheckpointError, match=r"model\.layers\.0\.self_attn\.v_proj\.weight in .*1 NaN"):
        LLM(str(tmp_path), kv_block_size=16).close()


def test_a_value_that_overflows_the_model_dtype_is_named(tmp_path: Path) -> None:
    build_checkpoint(tmp_path, *SHAPES["qwen3_gqa1"])
    spoil(tmp_path, TENSOR, 1e6)  # finite in float32, inf in float16
    with pytest.raises(CheckpointError, match=rf"{TENSOR} in .*overflow float16"):
        LLM(str(tmp_path), kv_block_size=16, dtype="float16").close()
    LLM(str(tmp_path), kv_block_size=16, dtype="float32").close()  # fits a wider dtype


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_the_probe_of_each_dtype_sees_nan_and_inf(dtype: torch.dtype, bad: float) -> None:
    from nanoexp.loader import finite_probe

    t = torch.randn(300, 70).to(dtype) + 100  # float16: a sum of 2.1e6, beyond its range
    assert finite_probe(t).isfinite()
    t[123 % 300, 45] = bad
    assert not finite_probe(t).isfinite()


def test_a_sum_that_overflows_float32_is_no_false_alarm(tmp_path: Path) -> None:
    from nanoexp.loader import check_loaded_finite

    weight = torch.full((4, 4), 3e38)  # finite, but its sum is inf
    save_file({"w": weight}, tmp_path / "m.safetensors")
    check_loaded_finite(
        {"w": torch.nn.Parameter(weight.clone())}, {"w": [("w", str(tmp_path / "m.safetensors"))]}
    )


def test_finite_weights_load_and_the_check_reads_no_file_again(tmp_path: Path, monkeypatch) -> None:
    build_checkpoint(tmp_path, *SHAPES["qwen3_gqa1"])
    from nanoexp import loader

    monkeypatch.setattr(loader, "non_finite_message", lambda *a: pytest.fail("slow path on finite weights"))
    with LLM(str(tmp_path), kv_block_size=16) as llm:
        assert llm.generate([[1, 2, 3]], use_tqdm=False)[0].token_ids


@pytest.mark.slow  # a run.py job
@pytest.mark.parametrize("engine", ["nanoexp", "hf"])
def test_run_py_fails_on_a_nan_checkpoint_instead_of_reporting_ok(tmp_path: Path, engine: str) -> None:
    ckpt = tmp_path / "ckpt"
    build_checkpoint(ckpt, *SHAPES["qwen3_gqa1"], vocab=509)
    file = spoil(ckpt, TENSOR, float("nan"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "HYDRA_FULL_ERROR"))}
    cmd = [sys.executable, "run.py", f"hydra.run.dir={tmp_path / 'job'}", "model=qwen3_tiny", "logger=none"]
    cmd += [
        f"model.path={ckpt}",
        "model.load_format=safetensors",
        "cache.cpu_kv_cache_gib=0.05",
        f"engine={engine}",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=env | {"PYTHONPATH": str(ROOT)}, capture_output=True, text=True)
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("nanoexp: error:")]
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr[-3000:]
    assert (
        TENSOR in lines[0]
        and (str(file) if engine == "nanoexp" else str(ckpt)) in lines[0]
        and "NaN" in lines[0]
    )
    assert '"status": "failed"' in (tmp_path / "job" / "results.json").read_text()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_the_check_catches_nan_and_inf_on_the_device(monkeypatch, dtype: torch.dtype) -> None:
    from nanoexp import loader
    from nanoexp.loader import check_loaded_finite

    monkeypatch.setattr(loader, "non_finite_message", lambda param, *a: f"bad {param}")
    params = {f"p{i}": torch.nn.Parameter(torch.randn(1000, 64, device="cuda").to(dtype)) for i in range(4)}
    params["p1"].data.fill_(60.0)  # sums to 3.8e6: beyond float16's range, which its probe never sums
    sources = {name: [(name, "f.safetensors")] for name in params}
    check_loaded_finite(params, sources)  # finite: passes
    for bad in (float("nan"), float("inf"), -float("inf")):
        params["p2"].data[7, 3] = bad
        with pytest.raises(CheckpointError, match="bad p2"):
            check_loaded_finite(params, sources)
        params["p2"].data[7, 3] = 0.0
