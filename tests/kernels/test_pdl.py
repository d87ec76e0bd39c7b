"""engine.pdl (programmatic dependent launch): the knob, where it may be on, and on a Hopper GPU
that it changes no token (every decode-step kernel waits for its predecessor first)."""

from __future__ import annotations

import pytest
import torch
from checkpoints import random_prompts

from nanoexp import LLM, SamplingParams
from nanoexp.config import ExecutionConfig, KnobError
from nanoexp.kernels import pdl

HOPPER = torch.cuda.is_available() and pdl.supported(torch.device("cuda"))


@pytest.fixture(autouse=True)
def pdl_off_afterwards():
    yield
    pdl.configure("off", torch.device("cpu"), has_triton=False)


def test_pdl_knob_names_its_choices():
    with pytest.raises(KnobError, match="engine.pdl='yes' is invalid"):
        ExecutionConfig(pdl="yes")


def test_pdl_is_off_where_it_cannot_run():
    cpu = torch.device("cpu")
    assert pdl.configure("auto", cpu, has_triton=True) is False
    assert pdl.launch_options() == {"PDL": False}
    with pytest.raises(ValueError, match="engine.pdl='on' needs Triton and a CUDA GPU of compute"):
        pdl.configure("on", cpu, has_triton=True)
    with pytest.raises(KnobError, match="engine.pdl='prefetch' is invalid"):
        ExecutionConfig(pdl="prefetch")


def test_only_decode_graph_launches_use_pdl(monkeypatch):
    monkeypatch.setattr(pdl, "_enabled", True)
    assert pdl.launch_options() == {"PDL": False}
    with pdl.graph_launches():
        assert pdl.launch_options() == {"PDL": True, "launch_pdl": True}
    assert pdl.launch_options() == {"PDL": False}


def test_engine_reports_pdl_off_on_cpu(checkpoints):
    with LLM(checkpoints["qwen3_gqa4"][0], device="cpu", dtype="float32", max_model_len=128) as llm:
        assert llm.stats()["pdl"] is False


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="needs a CUDA GPU of compute capability 9.0+")
@pytest.mark.parametrize("eager", [False, True], ids=["graphs", "eager"])
def test_pdl_changes_no_token_in_bf16(checkpoints, eager):
    """bf16 with the skinny GEMM, fused q/k kernel and split-K decode launched early in the decode
    graphs at exit; eager: no PDL at all. Bit for bit the tokens without PDL, greedy and seeded."""
    prompts = random_prompts([1, 7, 33, 130, 257], seed=21)
    params = [
        SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
        SamplingParams(temperature=0.8, seed=5, max_tokens=24, ignore_eos=True),
    ]
    outs = {}
    for choice in ("off", "on"):
        with LLM(
            checkpoints["qwen3_gqa4"][0],
            device="cuda",
            dtype="bfloat16",
            pdl=choice,
            enforce_eager=eager,
            gemm_backend="triton",
            attention_backend="triton",
            kv_block_size=16,
            max_model_len=512,
        ) as llm:
            assert llm.stats()["pdl"] is (choice != "off")
            outs[choice] = [[o.token_ids for o in llm.generate(prompts, p, use_tqdm=False)] for p in params]
    assert outs["on"] == outs["off"]
