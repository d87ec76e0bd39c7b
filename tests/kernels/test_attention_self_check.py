"""The attention self-check: `auto` takes a backend only if it agrees with the torch reference.

On CPU, `auto` has no candidate but torch; the tests inject candidates through
`select.auto_candidates`. On a CUDA device the same checks run on the real candidates."""

from __future__ import annotations

import logging
import re

import pytest
import torch
from checkpoints import random_prompts

from nanoexp import LLM, SamplingParams
from nanoexp.kernels import select, self_check
from nanoexp.kernels.torch_ref import TorchAttentionBackend

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class PerturbedBackend(TorchAttentionBackend):
    """The reference with a small bias on every output: wrong, but plausibly so."""

    name = "perturbed"

    def decode(self, q, k_cache, v_cache, md, scale, *scales):
        return super().decode(q, k_cache, v_cache, md, scale, *scales) + 0.05

    def prefill(self, q, k, v, k_cache, v_cache, md, scale, *scales):
        return super().prefill(q, k, v, k_cache, v_cache, md, scale, *scales) + 0.05


class RaisingBackend(TorchAttentionBackend):
    name = "raising"

    def decode(self, q, k_cache, v_cache, md, scale, *scales):
        raise RuntimeError("no kernel image is available for execution on the device\nmore detail")


class LossyStoreBackend(TorchAttentionBackend):
    """Attends correctly but drops the last new token when storing K/V."""

    name = "lossy_store"

    def store_kv(self, k, v, k_cache, v_cache, slot_mapping, *scales):
        super().store_kv(k[:-1], v[:-1], k_cache, v_cache, slot_mapping[:-1], *scales)


class ReferenceCopy(TorchAttentionBackend):
    name = "reference_copy"


@pytest.fixture(autouse=True)
def fresh_results(monkeypatch):
    monkeypatch.setattr(self_check, "_results", {})


def inject(monkeypatch, *backends):
    candidates = [(cls.name, cls) for cls in backends]
    monkeypatch.setattr(select, "auto_candidates", lambda *_: candidates)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_size", [1, 16, 256])
def test_the_reference_passes_its_own_check(dtype, block_size):
    result = self_check.check_backend(ReferenceCopy(), DEVICE, dtype, 64, block_size)
    assert result.ok, result.reason
    assert "<= tolerance" in result.reason


@pytest.mark.parametrize(
    ("wrong", "reason"),
    [
        (PerturbedBackend, r"max error 5\.\d+e-02 > tolerance 2e-03"),
        (RaisingBackend, r"raised RuntimeError: no kernel image is available for execution on the device$"),
        (LossyStoreBackend, "store_kv wrote different K/V"),
    ],
)
def test_auto_rejects_a_wrong_backend_with_one_warning(monkeypatch, caplog, wrong, reason):
    inject(monkeypatch, wrong)
    with caplog.at_level(logging.WARNING, logger=select.__name__):
        backend = select.make_attention_backend("auto", DEVICE, 16, torch.float32, 32)
    assert type(backend) is TorchAttentionBackend
    [record] = caplog.records
    message = record.getMessage()
    assert "\n" not in message and f"not using {wrong.name}" in message
    assert re.search(reason, message), message
    assert backend.selection.startswith(f"auto: {wrong.name} rejected (")
    assert backend.selection.endswith("; torch: reference")


def test_auto_falls_back_to_the_next_candidate_that_passes(monkeypatch, caplog):
    inject(monkeypatch, PerturbedBackend, ReferenceCopy)
    with caplog.at_level(logging.WARNING, logger=select.__name__):
        backend = select.make_attention_backend("auto", DEVICE, 16, torch.float32, 32)
    assert type(backend) is ReferenceCopy
    assert len(caplog.records) == 1
    assert "perturbed rejected" in backend.selection
    assert "reference_copy: passed self-check" in backend.selection


def test_a_backend_that_cannot_be_built_is_rejected(monkeypatch, caplog):
    def unbuildable():
        raise ImportError("flash_attn_2_cuda: undefined symbol")

    monkeypatch.setattr(select, "auto_candidates", lambda *_: [("flash_attn", unbuildable)])
    with caplog.at_level(logging.WARNING, logger=select.__name__):
        backend = select.make_attention_backend("auto", DEVICE, 256, torch.float32, 32)
    assert type(backend) is TorchAttentionBackend
    assert "raised ImportError: flash_attn_2_cuda: undefined symbol" in caplog.records[0].getMessage()


def test_the_check_runs_once_per_key(monkeypatch):
    calls = []
    real = self_check._run_check
    monkeypatch.setattr(self_check, "_run_check", lambda *a: calls.append(a[2:5]) or real(*a))
    for _ in range(3):
        self_check.check_backend(ReferenceCopy(), DEVICE, torch.float32, 32, 16)
    self_check.check_backend(ReferenceCopy(), DEVICE, torch.float32, 32, 8)
    assert calls == [(torch.float32, 32, 16), (torch.float32, 32, 8)]


def test_explicit_and_cpu_choices_are_not_self_checked(monkeypatch):
    monkeypatch.setattr(self_check, "_run_check", pytest.fail)
    cpu = torch.device("cpu")
    assert select.auto_candidates(cpu, 256, torch.bfloat16) == []
    auto = select.make_attention_backend("auto", cpu, 256)
    assert auto.name == "torch" and auto.selection == "auto: torch: reference"
    explicit = select.make_attention_backend("torch", cpu, 16)
    assert explicit.selection == "torch: requested explicitly (not self-checked)"


def test_auto_on_cuda_prefers_triton_until_flash_attn_is_measured():
    assert select.AUTO_CUDA_ORDER == ("triton", "flash_attn")


def test_engine_runs_on_the_reference_when_the_candidate_is_wrong(
    monkeypatch, caplog, checkpoints, reference_outputs
):
    inject(monkeypatch, PerturbedBackend)
    name = "qwen3_gqa2_tied"
    prompts = random_prompts([5, 19], seed=3)
    with caplog.at_level(logging.WARNING, logger=select.__name__):
        with LLM(
            checkpoints[name][0],
            device="cpu",
            dtype="float32",
            attention_backend="auto",
            kv_block_size=16,
            num_kv_blocks=64,
            max_model_len=128,
        ) as llm:
            outs = llm.generate(
                prompts, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True), use_tqdm=False
            )
            stats = llm.stats()
    assert stats["attention_backend"] == "torch"
    assert sum("not using perturbed" in r.getMessage() for r in caplog.records) == 1
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.token_ids == reference_outputs(name, prompt, 6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the interpreter trips numpy deprecations
def test_the_triton_backend_passes(dtype):
    """On CPU through the Triton interpreter (which mishandles bf16 dots, so fp32/fp16 here)."""
    pytest.importorskip("triton")
    from nanoexp.kernels.triton_backend import TritonAttentionBackend

    result = self_check.check_backend(TritonAttentionBackend(), DEVICE, dtype, 32, 16)
    assert result.ok, result.reason


def test_auto_skips_flash_attn_where_it_does_not_apply(monkeypatch):
    """Only listing candidates (nothing is built), so a CUDA device object is fine without CUDA."""
    monkeypatch.setattr(select, "flash_attn_available", lambda: True)
    cuda = torch.device("cuda")
    names = lambda block, dtype: [n for n, _ in select.auto_candidates(cuda, block, dtype)]  # noqa: E731
    assert "flash_attn" in names(256, torch.bfloat16)
    assert "flash_attn" not in names(16, torch.bfloat16)
    assert "flash_attn" not in names(256, torch.float32)
