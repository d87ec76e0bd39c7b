"""Qwen3-MoE against transformers' Qwen3MoeForCausalLM (float32, CPU): logits, and greedy tokens on every
engine path, under tensor parallelism (gloo) with the experts split (TP) or whole per rank (EP).

Routing ties: each shape's routers are scaled so that no token's k-th and (k+1)-th expert probabilities
are within float32 rounding of each other, so torch.topk picks the same experts here as in transformers
(test_routing_has_no_near_ties checks the prompts used)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from checkpoints import random_prompts
from helpers import prefill_logits, quick_first, staggered_run
from moe_checkpoints import MOE_SHAPES, moe_config

from nanoexp import LLM, SamplingParams
from nanoexp.config import KnobError
from nanoexp.config.parallel import check_split
from nanoexp.runner.step_input import StepInput

LENGTHS = [1, 2, 15, 16, 17, 63, 129]
CPU = dict(device="cpu", dtype="float32")


def assert_matches(moe_checkpoints, name, outs, prompts, max_tokens):
    for prompt, out in zip(prompts, outs, strict=True):
        want = moe_checkpoints.reference(name, prompt, max_tokens)
        assert out["token_ids"] == want, f"prompt length {len(prompt)}"


def generate(path, prompts, max_tokens=8, **kwargs):
    with LLM(path, **(CPU | kwargs)) as llm:
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        return llm.generate(prompts, params, use_tqdm=False)


@pytest.mark.parametrize(*quick_first("name", list(MOE_SHAPES)))
def test_prefill_logits_match_transformers(moe_checkpoints, name):
    path, hf_model = moe_checkpoints[name]
    prompt = random_prompts([40])[0]
    with torch.no_grad():
        ref = hf_model(torch.tensor([prompt])).logits[0]
    with LLM(path, num_kv_blocks=16, kv_block_size=16, **CPU) as llm:
        ours = prefill_logits(llm, StepInput(True, prompt, [40], [40], [[0, 1, 2]], []))
    assert ((ours - ref).norm() / ref.norm()) < 1e-5


@pytest.mark.parametrize("name", list(MOE_SHAPES))
def test_routing_has_no_near_ties(moe_checkpoints, name):
    """For every token the prompts route, the router logits of its k-th and (k+1)-th experts differ by far
    more than the float32 noise between our logits and transformers' (~1e-6)."""
    hf_model = moe_checkpoints[name][1]
    gaps = []

    def record(module, args, output):
        logits = output[0].sort(dim=-1, descending=True).values
        gaps.append((logits[:, module.top_k - 1] - logits[:, module.top_k]).min().item())

    routers = [m for n, m in hf_model.named_modules() if n.endswith("mlp.gate")]
    hooks = [r.register_forward_hook(record) for r in routers]
    with torch.no_grad():
        for prompt in random_prompts(LENGTHS, seed=1) + random_prompts([40]):
            hf_model(torch.tensor([prompt]))
    for hook in hooks:
        hook.remove()
    assert min(gaps) > 1e-4


@pytest.mark.parametrize(*quick_first("name", list(MOE_SHAPES)))
def test_greedy_batch_matches_transformers(moe_checkpoints, name):
    prompts = random_prompts(LENGTHS, seed=1)
    outs = generate(moe_checkpoints[name][0], prompts, kv_block_size=16, enable_prefix_caching=False)
    assert_matches(moe_checkpoints, name, outs, prompts, 8)


@pytest.mark.parametrize(
    *quick_first(
        "name,kwargs",
        [
            ("moe_e8_top2", dict(kv_block_size=1, num_kv_blocks=2000)),
            ("moe_e16_top4_unnormed", dict(kv_block_size=256)),
            ("moe_sparse_step2", dict(max_num_batched_tokens=24)),  # chunked prefill
        ],
        quick=2,
    ),
    ids=["block1", "block256", "chunked"],
)
def test_engine_paths_match_transformers(moe_checkpoints, name, kwargs):
    prompts = random_prompts([17, 63, 129, 40], seed=2)
    outs = generate(moe_checkpoints[name][0], prompts, max_tokens=10, **kwargs)
    assert_matches(moe_checkpoints, name, outs, prompts, 10)


def test_preemption_under_tiny_kv_cache(moe_checkpoints):
    name = "moe_e8_top2"
    prompts = random_prompts([60, 70, 80, 50], seed=7)
    outs = generate(moe_checkpoints[name][0], prompts, 24, kv_block_size=16, num_kv_blocks=14)
    assert_matches(moe_checkpoints, name, outs, prompts, 24)
    assert sum(out.num_preemptions for out in outs) > 0


def test_prefix_cache_hits_and_matches(moe_checkpoints):
    name = "moe_sparse_step2"
    shared = random_prompts([48], seed=3)[0]
    prompts = [shared + tail for tail in random_prompts([5, 20, 1], seed=4)]
    with LLM(moe_checkpoints[name][0], kv_block_size=16, enable_prefix_caching=True, **CPU) as llm:
        params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
        first = llm.generate(prompts[:1], params, use_tqdm=False)
        rest = llm.generate(prompts[1:], params, use_tqdm=False)
    assert_matches(moe_checkpoints, name, first + rest, prompts, 8)
    assert all(out.num_cached_tokens == 48 for out in rest)


@pytest.mark.parametrize(*quick_first("batching", ["mixed", "prefill_first"]))
def test_staggered_arrivals_match_transformers(moe_checkpoints, batching):
    name = "moe_e16_top4_unnormed"
    shared = random_prompts([12], seed=5)[0]
    prompts = [shared + tail for tail in random_prompts([3, 9, 14, 2, 17, 5], seed=6)]
    engine = dict(
        kv_block_size=4,
        num_kv_blocks=12,
        max_num_seqs=4,
        max_num_batched_tokens=32,
        batching=batching,
    )
    with LLM(moe_checkpoints[name][0], enable_prefix_caching=True, **(CPU | engine)) as llm:
        outputs, seen = staggered_run(llm, prompts, max_tokens=16)
    for prompt, tokens in zip(prompts, outputs, strict=True):
        assert tokens == moe_checkpoints.reference(name, prompt, 16), f"prompt length {len(prompt)}"
    assert (seen["mixed"] > 0) == (batching == "mixed")
    assert seen["preemptions"] > 0 and seen["prefix_hits"] > 0, seen


TP_ENGINE = dict(kv_block_size=4, num_kv_blocks=64, max_num_seqs=4, max_num_batched_tokens=64)


@pytest.mark.slow  # tensor-parallel worker processes
@pytest.mark.parametrize(
    "tp,expert_parallel,name",
    [
        (2, False, "moe_e8_top2"),
        (2, True, "moe_e16_top4_unnormed"),
        pytest.param(4, False, "moe_sparse_step2", marks=pytest.mark.slow),
        pytest.param(4, True, "moe_e8_top2", marks=pytest.mark.slow),
        pytest.param(4, True, "moe_sparse_step2", marks=pytest.mark.slow),
        pytest.param(2, True, "moe_e8_top2", marks=pytest.mark.slow),
    ],
)
def test_tensor_and_expert_parallel_match_transformers(moe_checkpoints, tp, expert_parallel, name):
    prompts = random_prompts([3, 17, 40], seed=7)
    kwargs = TP_ENGINE | dict(tensor_parallel_size=tp, expert_parallel=expert_parallel)
    with LLM(moe_checkpoints[name][0], enable_prefix_caching=True, **(CPU | kwargs)) as llm:
        params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
        outs = llm.generate(prompts, params, use_tqdm=False)
        assert llm.stats()["tensor_parallel_size"] == tp
    assert_matches(moe_checkpoints, name, outs, prompts, 8)


@pytest.mark.parametrize(
    "changes,tp,expert_parallel,allowed",
    [
        (
            {"num_experts": 6},
            4,
            True,
            "one of 1, 2 with parallel.expert_parallel=True (num_experts=6 is not divisible)",
        ),
        (
            {"moe_intermediate_size": 20},
            8,
            False,
            "one of 1, 2, 4 with parallel.expert_parallel=False (moe_intermediate_size=20 is not divisible)",
        ),
    ],
)
def test_indivisible_expert_sizes_name_the_knob(changes, tp, expert_parallel, allowed):
    arch = moe_config("moe_e16_top4_unnormed").to_dict()  # says num_local_experts, as transformers writes
    arch = {k: v for k, v in arch.items() if k != "num_local_experts"} | {"num_experts": 16} | changes
    with pytest.raises(KnobError) as err:
        check_split(arch, tp, expert_parallel)
    assert str(err.value) == f"parallel.tensor_parallel_size={tp} is invalid: must be {allowed}"


def expert_shapes(runner) -> tuple:
    experts = runner.model.model.layers[0].mlp.experts
    return tuple(experts.w13.shape), tuple(experts.w2.shape)


@pytest.mark.slow  # tensor-parallel worker processes
@pytest.mark.parametrize(
    "ep,want", [(True, ((8, 96, 64), (8, 64, 48))), (False, ((16, 48, 64), (16, 64, 24)))]
)
def test_expert_parallel_holds_whole_experts_per_rank(moe_checkpoints, ep, want):
    """At 2 ranks, 16 experts of intermediate size 48: 8 whole experts per rank (EP), or half of each."""
    path = moe_checkpoints["moe_e16_top4_unnormed"][0]
    with LLM(path, tensor_parallel_size=2, expert_parallel=ep, **(CPU | TP_ENGINE)) as llm:
        assert llm.engine.executor.call(expert_shapes) == want  # rank 0's


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"num_experts_per_tok": 9}, "num_experts_per_tok=9 is invalid: must be <= num_experts=8"),
        ({"moe_intermediate_size": 0}, "moe_intermediate_size=0 is invalid: must be an integer >= 1"),
        ({"mlp_only_layers": [2]}, r"mlp_only_layers=\[2\] is invalid: must be layer indices in \[0, 2\)"),
    ],
)
def test_bad_moe_config_is_one_line_naming_the_key(changes, message):
    arch = {k: v for k, v in moe_config("moe_e8_top2").to_dict().items() if k != "num_local_experts"}
    arch |= {"num_experts": 8, "model_type": "qwen3_moe"} | changes
    with pytest.raises(ValueError, match=f"^hf_config.{message}$"):  # run.py: model.arch.<key>
        LLM("moe", load_format="dummy", hf_config=arch, **CPU)


def test_checkpoint_missing_an_expert_tensor_names_it(moe_checkpoints, tmp_path):
    from safetensors.torch import load_file, save_file

    source = moe_checkpoints["moe_e8_top2"][0]
    for name in ("config.json", "generation_config.json"):
        if (Path(source) / name).exists():
            shutil.copy(Path(source) / name, tmp_path / name)
    tensors = load_file(Path(source) / "model.safetensors")
    del tensors["model.layers.1.mlp.experts.5.up_proj.weight"]
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(
        ValueError, match=r"missing 1 tensor\(s\), e.g. \['model.layers.1.mlp.experts.5.up_proj.weight'\]"
    ):
        LLM(str(tmp_path), **CPU)


@pytest.mark.slow  # a whole MoE engine under the Triton interpreter (tests/kernels/test_triton_moe.py)
def test_triton_moe_path_in_the_engine_matches_transformers(moe_checkpoints, monkeypatch):
    """The GPU's MoE path (routing kernel, the decode path for decode steps, one-kernel grouping and grouped
    GEMMs for prefills, the load count) through the engine on CPU, in the Triton interpreter."""
    from nanoexp.kernels.triton_moe import make_triton_moe
    from nanoexp.runner import model_setup

    monkeypatch.setattr(model_setup, "make_moe_kernel", make_triton_moe)
    name = "moe_e8_top2"
    prompts = random_prompts([3, 17, 40], seed=8)
    with LLM(moe_checkpoints[name][0], kv_block_size=16, **CPU) as llm:
        assert llm.stats()["moe_kernel"] == "triton: grouping in one kernel (self-checked)"
        engine = llm.engine
        for prompt in prompts:
            engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
        outputs, steps = {}, []
        while engine.has_unfinished():
            finished, stats = engine.step()
            steps.append(stats)
            outputs.update({out.request_id: out.token_ids for out in finished})
    for prompt, tokens in zip(prompts, [outputs[i] for i in sorted(outputs)], strict=True):
        assert tokens == moe_checkpoints.reference(name, prompt, 6), f"prompt length {len(prompt)}"
    assert all((s.expert_load.sum(axis=1) == s.num_tokens * 2).all() for s in steps)
