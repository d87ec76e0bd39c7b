"""On a CUDA device with flash_attn installed: the flash_attn backend against the torch reference
(kernel level) and the engine on attention_backend=flash_attn against transformers.

flash-attn runs fp16/bf16 only and pages of 256*k tokens; the lean build of
experiments/kernels/build_flash_attn.sh has head dim 128 only, so the checkpoint here is a tiny
random Qwen3 with head_dim 128. Greedy tokens follow the bf16 policy of tests/engine/test_gpu_engine.py."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from checkpoints import build_checkpoint, random_prompts
from helpers import assert_follows_transformers

from nanoexp import LLM, SamplingParams
from nanoexp.kernels import self_check
from nanoexp.kernels.select import make_attention_backend

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(importlib.util.find_spec("flash_attn") is None, reason="needs flash_attn"),
]

DEVICE = torch.device("cuda")
HEAD_DIM, BLOCK = 128, 256


def flash_backend():
    from nanoexp.kernels.flash_attn_backend import FlashAttnBackend

    return FlashAttnBackend(BLOCK)


# ---------------------------------------------------------------- kernels against the reference

DECODE = [
    ([1, 2, 255, 256, 257, 1000, 3000], [1] * 7, False),
    ([4097], [1], False),
]
PREFILL = [
    ([300, 40, 1], [300, 40, 1], True),  # no cached prefix
    ([512 + 30, 256, 700, 9], [30, 1, 200, 9], True),  # after a cached prefix, one without
    ([2000, 513], [257, 513], True),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("heads", [(16, 8), (32, 8), (8, 8)], ids=["gqa2", "gqa4", "mha"])
@pytest.mark.parametrize("cases", [DECODE, PREFILL], ids=["decode", "prefill"])
def test_flash_attn_matches_the_reference(dtype, heads, cases):
    error = self_check.max_error(flash_backend(), DEVICE, dtype, HEAD_DIM, BLOCK, cases, heads, seed=7)
    assert error <= self_check.TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_flash_attn_passes_the_self_check(dtype):
    result = self_check.check_backend(flash_backend(), DEVICE, dtype, HEAD_DIM, BLOCK)
    assert result.ok, result.reason


def test_auto_on_cuda_takes_a_self_checked_backend():
    backend = make_attention_backend("auto", DEVICE, BLOCK, torch.bfloat16, HEAD_DIM)
    assert backend.name == "triton"  # AUTO_CUDA_ORDER until flash_attn is measured
    assert backend.selection.startswith("auto: triton: passed self-check")


def test_explicit_flash_attn_rejects_small_pages():
    with pytest.raises(ValueError, match="divisible by 256"):
        make_attention_backend("flash_attn", DEVICE, 16)


# ---------------------------------------------------------------- engine against transformers


@pytest.fixture(scope="module")
def hd128(tmp_path_factory):
    """A tiny random Qwen3 with head_dim 128 (4 heads, 2 KV heads): (directory, transformers model)."""
    path = tmp_path_factory.mktemp("qwen3_hd128")
    return str(path), build_checkpoint(path, "qwen3", 4, 2, HEAD_DIM, 128, False)


LENGTHS = [1, 2, 15, 255, 256, 257, 300, 40, 600]
PATHS = {
    "plain": dict(enable_prefix_caching=False),
    "prefix_cache": dict(enable_prefix_caching=True),
    "chunked": dict(max_num_batched_tokens=100),
    "preemption": dict(num_kv_blocks=10),
    "async": dict(async_scheduling=True),
}


def engine_outputs(path, prompts, max_tokens, later=(), **kwargs):
    """Greedy outputs of `prompts`, then of `later` (a second batch, which can hit the prefix cache)."""
    args = dict(
        kv_block_size=BLOCK,
        attention_backend="flash_attn",
        max_model_len=1024,
        max_num_seqs=16,
        num_kv_blocks=64,
        max_num_batched_tokens=2048,
    )
    args.update(kwargs)
    with LLM(path, device="cuda", **args) as llm:
        assert llm.stats()["attention_backend"] == args["attention_backend"]
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        outs = llm.generate(prompts, params, use_tqdm=False)
        return outs + (llm.generate(list(later), params, use_tqdm=False) if later else [])


@pytest.mark.parametrize("eager", [False, True], ids=["graphs", "eager"])
@pytest.mark.parametrize("path_name", list(PATHS))
def test_greedy_follows_transformers(hd128, path_name, eager):
    path, hf_model = hd128
    shared = random_prompts([300], seed=31)[0]  # longer than a page: the prefix cache holds a block
    prompts = random_prompts(LENGTHS, seed=32) + [shared + [7]]
    later = [shared + [8, 9]]
    outs = engine_outputs(path, prompts, 16, later, dtype="float16", enforce_eager=eager, **PATHS[path_name])
    assert_follows_transformers(hf_model, prompts + later, outs)
    if path_name == "preemption":
        assert sum(o.num_preemptions for o in outs) > 0
    if path_name == "prefix_cache":
        assert outs[-1].num_cached_tokens >= BLOCK


@pytest.mark.parametrize("eager", [False, True], ids=["graphs", "eager"])
def test_bfloat16_greedy_follows_transformers(hd128, eager):
    path, hf_model = hd128
    prompts = random_prompts(LENGTHS, seed=33)
    outs = engine_outputs(path, prompts, 16, dtype="bfloat16", enforce_eager=eager)
    ref = engine_outputs(path, prompts, 16, dtype="bfloat16", enforce_eager=True, attention_backend="torch")
    # bf16 rounding flips near-ties of a random tiny model: as exact as the reference kernel, not 50%
    exact = assert_follows_transformers(hf_model, prompts, outs, min_exact=0.0)
    exact_ref = assert_follows_transformers(hf_model, prompts, ref, min_exact=0.0)
    assert exact >= exact_ref - 1, f"flash_attn {exact} exact, torch reference {exact_ref}"


def test_same_tokens_as_the_torch_reference_backend(hd128):
    """fp16, eager: flash_attn and the torch backend see identical inputs at every step until their
    first differing token, so most prompts match exactly; where they differ, both are top-3 picks."""
    path, hf_model = hd128
    prompts = random_prompts(LENGTHS, seed=34)
    flash = engine_outputs(path, prompts, 16, dtype="float16", enforce_eager=True)
    ref = engine_outputs(path, prompts, 16, dtype="float16", enforce_eager=True, attention_backend="torch")
    same = sum(f.token_ids == r.token_ids for f, r in zip(flash, ref, strict=True))
    assert same >= 0.75 * len(prompts), f"{same} of {len(prompts)} identical"
    assert_follows_transformers(hf_model, prompts, ref)
