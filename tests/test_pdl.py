"""engine.pdl (programmatic dependent launch): the knob, where it may be on, and on a Hopper GPU
that it changes no token (every decode-step kernel waits for its predecessor first)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from nanoexp import LLM, SamplingParams
from nanoexp.config import ExecutionConfig, KnobError
from nanoexp.kernels import pdl
from tests.conftest import random_prompts

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
    for choice in ("on", "prefetch"):
        with pytest.raises(ValueError, match=f"engine.pdl='{choice}' needs Triton and a CUDA GPU of compute"):
            pdl.configure(choice, cpu, has_triton=True)


@pytest.mark.parametrize(("choice", "value"), [("on", 1), ("prefetch", 2)])
def test_only_decode_graph_launches_use_pdl(monkeypatch, choice, value):
    monkeypatch.setattr(pdl, "_mode", pdl.MODES[choice])
    assert pdl.mode() == choice
    assert pdl.launch_options() == {"PDL": False}
    with pdl.graph_launches():
        assert pdl.launch_options() == {"PDL": value, "launch_pdl": True}
    assert pdl.launch_options() == {"PDL": False}


def test_engine_reports_pdl_off_on_cpu(checkpoints):
    with LLM(checkpoints["qwen3_gqa4"][0], device="cpu", dtype="float32", max_model_len=128) as llm:
        assert llm.stats()["pdl"] is False


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="needs a CUDA GPU of compute capability 9.0+")
@pytest.mark.parametrize("eager", [False, True], ids=["graphs", "eager"])
def test_pdl_changes_no_token_in_bf16(checkpoints, eager):
    """bf16 with the skinny GEMM, fused q/k kernel and split-K decode launched early in the decode
    graphs, at exit (on) or right after each kernel's wait with the GEMMs' weights prefetched
    (prefetch); eager: no PDL at all. Bit for bit the tokens without PDL, greedy and seeded."""
    prompts = random_prompts([1, 7, 33, 130, 257], seed=21)
    params = [SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
              SamplingParams(temperature=0.8, seed=5, max_tokens=24, ignore_eos=True)]
    outs = {}
    for choice in ("off", "on", "prefetch"):
        with LLM(checkpoints["qwen3_gqa4"][0], device="cuda", dtype="bfloat16", pdl=choice,
                 enforce_eager=eager, gemm_backend="triton", attention_backend="triton",
                 kvcache_block_size=16, max_model_len=512) as llm:
            assert llm.stats()["pdl"] is (choice != "off") and llm.stats()["pdl_mode"] == choice
            outs[choice] = [[o.token_ids for o in llm.generate(prompts, p, use_tqdm=False)] for p in params]
    assert outs["on"] == outs["off"] == outs["prefetch"]


PREFETCH_SASS = """
from nanoexp.kernels import triton_gemm
from nanoexp.kernels.offline_sass import compile_offline, sass

bf16 = ("x_ptr", "w_ptr", "bias_ptr", "y_ptr", "residual_ptr", "norm_w_ptr", "sum_ptr")
types = dict.fromkeys(bf16, "*bf16") | {"part_ptr": "*fp32", "ticket_ptr": "*i32", "eps": "fp32"}
constants = dict(HAS_BIAS=False, GATED=True, NORM=True, HAS_RESIDUAL=True, BLOCK_M=16, BLOCK_N=32,
                 BLOCK_K=256, SPLIT_K=2, PDL=2)
code = sass(compile_offline(triton_gemm._skinny_gemm_kernel, types, constants).asm["cubin"])
print(" ".join(w for _, line in code for w in ("UBLKPF.L2", "ACQBULK", "PREEXIT") if w in line))
"""


def test_prefetch_variant_compiles_for_hopper_and_prefetches_before_waiting():
    """No GPU needed: the skinny GEMM compiled for sm_90 with PDL == 2 issues its bulk L2 prefetches
    (UBLKPF, gate and up rows), then griddepcontrol.wait (ACQBULK), then launch_dependents (PREEXIT).
    In a subprocess: the compiler needs Triton's JIT, which the interpreter this suite turns on
    replaces."""
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", PREFETCH_SASS], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    marks = done.stdout.split()
    assert marks[:2] == ["UBLKPF.L2", "UBLKPF.L2"]
    assert marks.index("ACQBULK") < marks.index("PREEXIT")
