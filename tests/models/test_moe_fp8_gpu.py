"""Qwen3-MoE with fp8 weights on a CUDA device (the fp8 grouped expert GEMMs, the dense fp8 kernels, CUDA
graphs and step graphs) against transformers running the torch W8A8 reference (tests/fp8_checkpoints.py):
teacher-forced on our greedy tokens, the reference picks ours at most positions (GPU_MOE_AGREEMENT: a
router near-tie flipped by a last-bit difference makes the dense tests' top-3 rule too tight here), the
distance of our log-probs from the reference is held to half of what rounding activations to e4m3 moves
them by (GPU_KL_RATIO); and no timed step compiles a kernel."""

from __future__ import annotations

import random

import pytest
import torch
from fp8_checkpoints import (
    GPU_KL_RATIO,
    GPU_LENGTHS,
    GPU_MOE_AGREEMENT,
    GPU_PATHS,
    build_fp8_moe_checkpoint,
    kl_against_rounding,
    teacher_forced_agreement,
    w8a8_transformers_model,
)
from helpers import CompileLog

from nanoexp import LLM, SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

ENGINE = dict(kv_block_size=16, max_model_len=1024, max_num_seqs=16, dtype="float32")


@pytest.fixture(scope="module")
def fp8_moe_checkpoint(tmp_path_factory) -> str:
    # head_dim 64 (the GPU attention kernels' tested sizes); hidden 256: two K blocks; experts of 192 rows:
    # gate/up scales per row, the down projection's K ragged in its second block
    changes = dict(hidden_size=256, num_attention_heads=4, head_dim=64)
    return build_fp8_moe_checkpoint(tmp_path_factory.mktemp("fp8_moe"), **changes)


def prompts() -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(380) for _ in range(n)] for n in GPU_LENGTHS]


def generate(path: str, prompt_list, **kwargs) -> list:
    with LLM(path, **(ENGINE | kwargs)) as llm:
        stats = llm.stats()
        assert stats["weight_quantization"] == "fp8" and stats["moe_kernel"].startswith("triton"), stats
        params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
        return llm.generate(prompt_list, params, use_tqdm=False)


@pytest.mark.gpu_quick
@pytest.mark.parametrize("path_name", GPU_PATHS)
def test_gpu_fp8_moe_follows_the_w8a8_reference(fp8_moe_checkpoint, path_name):
    prompt_list = prompts()
    outs = generate(fp8_moe_checkpoint, prompt_list, **GPU_PATHS[path_name])
    agreement = teacher_forced_agreement(w8a8_transformers_model(fp8_moe_checkpoint), prompt_list, outs)
    assert agreement >= GPU_MOE_AGREEMENT["float32"], agreement


@pytest.mark.gpu_quick
@pytest.mark.parametrize("eager", [False, True], ids=["graphs", "eager"])
def test_gpu_fp8_moe_log_probs_stay_within_half_of_what_activation_rounding_moves(fp8_moe_checkpoint, eager):
    prompt_list = prompts()
    with LLM(fp8_moe_checkpoint, **(ENGINE | dict(enforce_eager=eager))) as llm:
        params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
        outs = llm.generate(prompt_list, params, use_tqdm=False)
        tokens = [o.token_ids for o in outs]
        ours, rounding = kl_against_rounding(fp8_moe_checkpoint, llm, prompt_list, tokens)
    assert 0 < rounding and ours <= GPU_KL_RATIO * rounding, (ours, rounding)


def test_gpu_fp8_moe_in_bfloat16_follows_the_w8a8_reference(fp8_moe_checkpoint):
    prompt_list = prompts()
    outs = generate(fp8_moe_checkpoint, prompt_list, dtype="bfloat16")
    agreement = teacher_forced_agreement(w8a8_transformers_model(fp8_moe_checkpoint), prompt_list, outs)
    assert agreement >= GPU_MOE_AGREEMENT["bfloat16"], agreement


def test_gpu_fp8_moe_expert_load_counts_only_real_tokens(fp8_moe_checkpoint):
    """Under graphs, with fp8 experts: each step's expert load sums to its tokens times top-k."""
    with LLM(fp8_moe_checkpoint, **ENGINE) as llm:
        engine = llm.engine
        for prompt in prompts()[:3]:
            engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
        steps = []
        while engine.has_unfinished():
            steps.append(engine.step()[1])
    assert all((s.expert_load.sum(axis=1) == s.num_tokens * 2).all() for s in steps)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_gpu_fp8_moe_no_timed_step_compiles(fp8_moe_checkpoint, dtype):
    """Decode batches of 1 to 32 and prefills up to 900 tokens (every MoE tile regime) after a warm-up
    request: no kernel compiles."""
    rng = random.Random(1)
    prompt_list = [[rng.randrange(380) for _ in range(rng.randint(5, 900))] for _ in range(32)]
    params = [
        SamplingParams(temperature=0, max_tokens=rng.randint(5, 40), ignore_eos=True) for _ in prompt_list
    ]
    with LLM(fp8_moe_checkpoint, **(ENGINE | dict(dtype=dtype, max_num_seqs=32))) as llm:
        llm.generate([prompt_list[0][:16]], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
        with CompileLog() as compiled:
            llm.generate(prompt_list, params, use_tqdm=False)
            torch.cuda.synchronize()
    assert compiled.names == [], (
        f"timed work compiled {len(compiled.names)} kernels: {sorted(set(compiled.names))}"
    )
