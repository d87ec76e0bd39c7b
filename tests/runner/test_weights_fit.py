"""A model whose weights cannot fit the GPU's free memory: one line before anything is allocated."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from nanoexp.config import EngineConfig
from nanoexp.loader import load_hf_config
from nanoexp.models.registry import model_class
from nanoexp.runner.model_setup import check_weights_fit

ROOT = Path(__file__).resolve().parents[2]


def config_for(model: str, **kwargs) -> EngineConfig:
    arch = OmegaConf.to_container(OmegaConf.load(ROOT / f"conf/model/{model}.yaml").arch)
    return EngineConfig.from_kwargs(None, load_format="dummy", hf_config=arch, **kwargs)


# fp8 weights are offered to every model (a MoE model's experts included) that is not fp8 already
@pytest.mark.parametrize(
    "model,dtype,tp,message",
    [
        (
            "qwen3_30b_a3b",
            torch.bfloat16,
            1,
            "model Qwen3MoeForCausalLM does not fit: its bfloat16 weights take 56.9 GiB "
            "on each of 1 rank(s), "
            "the GPU has 40.0 GiB free; would fit: parallel.tensor_parallel_size=2 or model.quantization=fp8 "
            "(about half the bytes of bf16)",
        ),
        (
            "qwen3_30b_a3b",
            torch.float32,
            1,
            "model Qwen3MoeForCausalLM does not fit: its float32 weights take 113.7 GiB "
            "on each of 1 rank(s), "
            "the GPU has 40.0 GiB free; would fit: parallel.tensor_parallel_size=4 or model.dtype=bfloat16 "
            "(half the bytes) or model.quantization=fp8 (about half the bytes of bf16)",
        ),
        (
            "qwen3_32b",
            torch.bfloat16,
            1,
            "model Qwen3ForCausalLM does not fit: its bfloat16 weights take 61.0 GiB "
            "on each of 1 rank(s), "
            "the GPU has 40.0 GiB free; would fit: parallel.tensor_parallel_size=2 or model.quantization=fp8 "
            "(about half the bytes of bf16)",
        ),
    ],
)
def test_weights_that_cannot_fit_are_one_line(monkeypatch, model, dtype, tp, message):
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (40 * 2**30, 80 * 2**30))
    config = config_for(model, tensor_parallel_size=tp)
    hf_config = load_hf_config(None, config.model.arch)
    with pytest.raises(ValueError) as err:
        check_weights_fit(config, hf_config, model_class(hf_config), dtype, torch.device("cuda", 0), 4096)
    assert str(err.value) == message


def test_weights_that_fit_pass(monkeypatch):
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (70 * 2**30, 80 * 2**30))
    config = config_for("qwen3_30b_a3b")
    hf_config = load_hf_config(None, config.model.arch)
    check_weights_fit(
        config, hf_config, model_class(hf_config), torch.bfloat16, torch.device("cuda", 0), 4096
    )


def test_fp8_experts_make_qwen3_30b_a3b_fit_one_40_gib_gpu(monkeypatch):
    """In fp8 its experts take a byte a weight: the 56.9 GiB of bf16 weights become about 29."""
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (40 * 2**30, 80 * 2**30))
    config = config_for("qwen3_30b_a3b", quantization="fp8")
    hf_config = load_hf_config(None, config.model.arch)
    check_weights_fit(
        config, hf_config, model_class(hf_config), torch.bfloat16, torch.device("cuda", 0), 4096
    )
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (25 * 2**30, 80 * 2**30))
    with pytest.raises(
        ValueError, match=r"its fp8 \(bfloat16 elsewhere\) weights take 29\.0 GiB on each of 1 rank"
    ):
        check_weights_fit(
            config, hf_config, model_class(hf_config), torch.bfloat16, torch.device("cuda", 0), 4096
        )
