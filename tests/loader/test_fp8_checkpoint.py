"""FP8 checkpoints (block-scaled e4m3, 128 x 128 scale blocks) and online fp8 quantization: the engine's
greedy tokens equal transformers running the torch W8A8 reference on every engine path, at TP=2 and 4
where shards (96 and 48 rows, 192 and 96 columns) are not multiples of 128 and scale blocks straddle ranks."""

from __future__ import annotations

import json
import os

import pytest
import torch
from fp8_checkpoints import (
    GREEDY,
    MAX_TOKENS,
    PROMPTS,
    assert_path_matches,
    build_fp8_checkpoint,
    counting_producers,
    greedy_reference,
    w8a8_transformers_model,
)
from helpers import quick_first

from nanoexp.config import SamplingParams
from nanoexp.config.checkpoint_files import CheckpointError
from nanoexp.engine.llm import LLM

BASE = dict(device="cpu", dtype="float32", max_num_seqs=4, gemm_backend="torch")
PATHS = {
    # prefix cache hits and preemption: a 14-block cache of 4-token blocks
    "prefix_cache_preemption": dict(kv_block_size=4, num_kv_blocks=14, max_num_batched_tokens=64),
    "chunked_prefill_mixed": dict(kv_block_size=16, max_num_batched_tokens=8, batching="mixed"),
    "prefill_first_block_8": dict(kv_block_size=8, batching="prefill_first", enable_prefix_caching=False),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("fp8")
    fp8 = build_fp8_checkpoint(root / "fp8", bf16_path=root / "bf16")
    bf16_scales = build_fp8_checkpoint(root / "fp8_bf16_scales", scale_dtype=torch.bfloat16)
    return {"fp8": fp8, "bf16": str(root / "bf16"), "fp8_bf16_scales": bf16_scales}


@pytest.fixture(scope="module")
def reference(checkpoints) -> list[list[int]]:
    return greedy_reference(w8a8_transformers_model(checkpoints["fp8"]), PROMPTS, MAX_TOKENS)


def generate(path: str, **kwargs) -> list:
    with LLM(path, **{**BASE, **kwargs}) as llm:
        return llm.generate(PROMPTS, GREEDY, use_tqdm=False)


@pytest.mark.parametrize(*quick_first("path_name", list(PATHS)))
def test_fp8_checkpoint_matches_the_w8a8_reference_on_every_path(checkpoints, reference, path_name):
    outs = generate(checkpoints["fp8"], **PATHS[path_name])
    assert_path_matches(outs, reference, path_name)


@pytest.mark.slow
@pytest.mark.parametrize("tp", [2, 4])
def test_fp8_checkpoint_under_tp_with_straddling_scale_blocks(checkpoints, reference, tp):
    outs = generate(checkpoints["fp8"], tensor_parallel_size=tp, **PATHS["prefix_cache_preemption"])
    assert [o.token_ids for o in outs] == reference


INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@pytest.mark.skipif(not INTERPRETED, reason="the Triton kernels on the CPU need the interpreter")
def test_triton_kernels_with_quantizing_producers_match_the_w8a8_reference(
    checkpoints, reference, monkeypatch
):
    """The Triton fp8 GEMMs (interpreted), their inputs quantized by the add + RMSNorm and SwiGLU kernels
    before them: the same greedy tokens."""
    calls = counting_producers(monkeypatch)
    short = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)  # the interpreter is slow
    with LLM(
        checkpoints["fp8"], **{**BASE, "gemm_backend": "triton", **PATHS["prefill_first_block_8"]}
    ) as llm:
        outs = llm.generate(PROMPTS[:2], short, use_tqdm=False)
    assert [o.token_ids for o in outs] == [tokens[:4] for tokens in reference[:2]]
    assert calls["rms_norm_quantized"] > 0 and calls["silu_and_mul_quantized"] > 0


@pytest.mark.slow
@pytest.mark.skipif(not INTERPRETED, reason="the Triton kernels on the CPU need the interpreter")
def test_triton_kernels_under_tp_quantize_straddling_groups_themselves(checkpoints, reference):
    """TP=2: down_proj's K shard of rank 1 starts inside a 128-group (its amax all-reduced over the ranks),
    so SwiGLU hands it unquantized values; the norms still quantize for qkv_proj and gate_up_proj."""
    short = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)  # the interpreter is slow
    with LLM(checkpoints["fp8"], **{**BASE, "gemm_backend": "triton", "tensor_parallel_size": 2}) as llm:
        outs = llm.generate(PROMPTS[:2], short, use_tqdm=False)
    assert [o.token_ids for o in outs] == [tokens[:4] for tokens in reference[:2]]


def test_bf16_scales_are_accepted(checkpoints):
    with LLM(checkpoints["fp8_bf16_scales"], **BASE) as llm:
        outs = llm.generate(PROMPTS[:2], GREEDY, use_tqdm=False)
    want = greedy_reference(w8a8_transformers_model(checkpoints["fp8_bf16_scales"]), PROMPTS[:2], MAX_TOKENS)
    assert [o.token_ids for o in outs] == want


def test_online_quantization_of_the_bf16_checkpoint_equals_the_fp8_checkpoint(checkpoints, reference):
    """The published rule applied at load to the same bf16 weights gives the checkpoint's bytes."""
    outs = generate(checkpoints["bf16"], quantization="fp8", **PATHS["prefix_cache_preemption"])
    assert [o.token_ids for o in outs] == reference


@pytest.mark.slow
def test_online_quantization_under_tp(checkpoints, reference):
    outs = generate(checkpoints["bf16"], quantization="fp8", tensor_parallel_size=2)
    assert [o.token_ids for o in outs] == reference


def test_fp8_checkpoint_selects_fp8_by_itself(checkpoints):
    with LLM(checkpoints["fp8"], **BASE) as llm:
        model = llm.engine.executor.runner.model
        qkv = model.model.layers[0].self_attn.qkv_proj
        assert qkv.weight.dtype == torch.float8_e4m3fn and qkv.weight_scale_inv.dtype == torch.float32
        # q 192 + k 96 + v 96 rows (not multiples of 128: a scale row per output row), K 192 -> 2 blocks
        assert list(qkv.weight_scale_inv.shape) == [384, 2] and list(qkv.weight.shape) == [384, 256]
        assert model.lm_head.weight.dtype == torch.float32 and model.model.norm.weight.dtype == torch.float32


def rewrite_quantization_config(path: str, **changes) -> None:
    file = os.path.join(path, "config.json")
    with open(file) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = {**cfg["quantization_config"], **changes}
    with open(file, "w") as f:
        json.dump(cfg, f)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"quant_method": "awq"},
            "quantization_config quant_method='awq' is not supported; supported: 'fp8' with",
        ),
        ({"weight_block_size": [64, 64]}, "quantization_config weight_block_size=[64, 64] is not supported"),
        ({"activation_scheme": "static"}, "quantization_config activation_scheme='static' is not supported"),
    ],
)
def test_unsupported_quantization_is_one_line_naming_it(tmp_path, changes, message):
    path = build_fp8_checkpoint(tmp_path / "ckpt", layers=1)
    rewrite_quantization_config(path, **changes)
    with pytest.raises(CheckpointError) as err:
        LLM(path, **BASE)
    text = str(err.value)
    assert message in text and "config.json" in text and "\n" not in text


def test_missing_scales_are_an_error(tmp_path):
    from safetensors.torch import load_file, save_file

    path = build_fp8_checkpoint(tmp_path / "ckpt", layers=1)
    file = os.path.join(path, "model.safetensors")
    tensors = load_file(file)
    del tensors["model.layers.0.mlp.down_proj.weight_scale_inv"]
    save_file(tensors, file, metadata={"format": "pt"})
    with pytest.raises(ValueError, match="missing 1 tensor"):
        LLM(path, **BASE)


def test_fp8_weights_in_an_unquantized_model_are_refused(tmp_path):
    path = build_fp8_checkpoint(tmp_path / "ckpt", layers=1)
    file = os.path.join(path, "config.json")
    with open(file) as f:
        cfg = json.load(f)
    del cfg["quantization_config"]
    with open(file, "w") as f:
        json.dump(cfg, f)
    with pytest.raises(CheckpointError, match="has dtype F8_E4M3; this tensor is one of F32, F16, BF16"):
        LLM(path, **BASE)
