"""Qwen3-MoE with fp8 weights (CPU, float32): an FP8 MoE checkpoint in the published format (attention,
dense MLP and every expert's gate/up/down in block-scaled e4m3, the routers in bf16) loads, and its greedy
tokens equal transformers' Qwen3MoeForCausalLM running the torch W8A8 reference in each of those
projections, on every engine path and at TP=2 with the experts split (a 96-row shard: scales per row, the
down projection's first activation group straddling the ranks) or whole per rank (EP). Online
quantization (`quantization="fp8"`) of the same bf16 checkpoint, and of dummy weights, takes the same path."""

from __future__ import annotations

import os

import pytest
import torch
from fp8_checkpoints import (
    GREEDY,
    MAX_TOKENS,
    MOE_CHANGES,
    PROMPTS,
    assert_path_matches,
    build_fp8_moe_checkpoint,
    counting_producers,
    greedy_reference,
    kl_against_rounding,
    w8a8_transformers_model,
)
from moe_checkpoints import moe_config, recording_decode_calls
from safetensors.torch import load_file, save_file

from nanoexp import LLM, SamplingParams

BASE = dict(device="cpu", dtype="float32", max_num_seqs=4)
PATHS = {
    "plain": dict(kv_block_size=16, enable_prefix_caching=False),
    # prefix cache hits and preemption: a 14-block cache of 4-token blocks
    "prefix_cache_preemption": dict(kv_block_size=4, num_kv_blocks=14, max_num_batched_tokens=64),
    "chunked_prefill_mixed": dict(kv_block_size=16, max_num_batched_tokens=8, batching="mixed"),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("fp8_moe")
    fp8 = build_fp8_moe_checkpoint(root / "fp8", bf16_path=root / "bf16")
    return {"fp8": fp8, "bf16": str(root / "bf16")}


@pytest.fixture(scope="module")
def oracle(checkpoints):
    return w8a8_transformers_model(checkpoints["fp8"])


@pytest.fixture(scope="module")
def reference(oracle) -> list[list[int]]:
    return greedy_reference(oracle, PROMPTS, MAX_TOKENS)


def generate(path: str, **kwargs) -> list:
    with LLM(path, **{**BASE, **kwargs}) as llm:
        return llm.generate(PROMPTS, GREEDY, use_tqdm=False)


def test_log_probs_stay_within_a_tenth_of_what_activation_rounding_moves(checkpoints, reference):
    """Teacher-forced on the reference's tokens, the engine's distributions are held to a tenth of the
    distance that rounding activations to e4m3 puts between the reference and the same weights with
    unquantized activations. (Not float32-equal logits: a last-bit difference in summation order moves an
    activation's e4m3 rounding by a whole step now and then, about once in a million values.)"""
    with LLM(checkpoints["fp8"], **BASE) as llm:
        ours, rounding = kl_against_rounding(checkpoints["fp8"], llm, PROMPTS, reference)
    assert 0 < rounding and ours <= 0.1 * rounding, (ours, rounding)


def test_routing_has_no_near_ties(oracle, reference):
    """For every token of the prompts and their continuations, the router logits of its k-th and (k+1)-th
    experts differ by far more than the float32 noise between the engine's and the reference's."""
    gaps = []

    def record(module, args, output):
        logits = output[0].sort(dim=-1, descending=True).values
        gaps.append((logits[:, module.top_k - 1] - logits[:, module.top_k]).min().item())

    routers = [m for n, m in oracle.named_modules() if n.endswith("mlp.gate")]
    assert len(routers) == 2  # layers 0 and 2; layer 1 is dense
    hooks = [r.register_forward_hook(record) for r in routers]
    with torch.no_grad():
        for prompt, tokens in zip(PROMPTS, reference, strict=True):
            oracle(torch.tensor([prompt + tokens]))
    for hook in hooks:
        hook.remove()
    assert min(gaps) > 1e-3


@pytest.mark.parametrize("path_name", list(PATHS))
def test_fp8_moe_checkpoint_matches_the_w8a8_reference_on_every_path(checkpoints, reference, path_name):
    outs = generate(checkpoints["fp8"], **PATHS[path_name])
    assert_path_matches(outs, reference, path_name)


@pytest.mark.parametrize(
    "tp,expert_parallel",
    [
        (2, False),
        (2, True),
        # 48 rows a rank: rank 2's down K shard straddles two 128-groups; 2 whole experts a rank
        pytest.param(4, False, marks=pytest.mark.slow),
        pytest.param(4, True, marks=pytest.mark.slow),
    ],
    ids=["tp2", "ep2", "tp4", "ep4"],
)
def test_fp8_moe_checkpoint_under_tensor_and_expert_parallelism(checkpoints, reference, tp, expert_parallel):
    kwargs = PATHS["prefix_cache_preemption"] | dict(tensor_parallel_size=tp, expert_parallel=expert_parallel)
    with LLM(checkpoints["fp8"], **{**BASE, **kwargs}) as llm:
        outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
        assert llm.stats()["weight_quantization"] == "fp8"
    assert [o.token_ids for o in outs] == reference


def test_online_quantization_of_the_bf16_checkpoint_equals_the_fp8_checkpoint(checkpoints, reference):
    """The published rule applied at load to the same bf16 experts gives the checkpoint's bytes."""
    outs = generate(checkpoints["bf16"], quantization="fp8", **PATHS["prefix_cache_preemption"])
    assert [o.token_ids for o in outs] == reference


def test_bf16_expert_scales_are_accepted(tmp_path):
    """Some FP8 MoE checkpoints store weight_scale_inv in bf16."""
    path = build_fp8_moe_checkpoint(tmp_path / "ckpt", scale_dtype=torch.bfloat16)
    with LLM(path, **BASE) as llm:
        outs = llm.generate(PROMPTS[:2], GREEDY, use_tqdm=False)
    want = greedy_reference(w8a8_transformers_model(path), PROMPTS[:2], MAX_TOKENS)
    assert [o.token_ids for o in outs] == want


def test_fp8_moe_checkpoint_selects_fp8_and_keeps_the_routers_dense(checkpoints):
    with LLM(checkpoints["fp8"], **BASE) as llm:
        stats = llm.stats()
        model = llm.engine.executor.runner.model
    assert stats["weight_quantization"] == "fp8" and stats["moe_kernel"] == "torch"
    moe = model.model.layers[0].mlp
    experts = moe.experts
    assert moe.gate.weight.dtype == torch.float32 and moe.gate.fp8 is None
    assert experts.w13.dtype == experts.w2.dtype == torch.float8_e4m3fn
    # 8 experts: gate + up rows 2 x 192 (not a multiple of 128: a scale row each), K 192 -> 2 blocks;
    # down 192 rows, K 192
    assert tuple(experts.w13.shape) == (8, 384, 256) and tuple(experts.w13_scale_inv.shape) == (8, 384, 2)
    assert tuple(experts.w2.shape) == (8, 192, 256) and tuple(experts.w2_scale_inv.shape) == (8, 192, 2)
    assert model.model.layers[1].mlp.gate_up_proj.weight.dtype == torch.float8_e4m3fn  # the dense layer


def test_dummy_weights_quantize_the_experts(checkpoints):
    arch = {k: v for k, v in moe_config("moe_e8_top2", **MOE_CHANGES).to_dict().items()}
    arch = {k: v for k, v in arch.items() if k != "num_local_experts"} | {"num_experts": 8}
    with LLM("moe", load_format="dummy", hf_config=arch, quantization="fp8", **BASE) as llm:
        outs = llm.generate(PROMPTS[:2], GREEDY, use_tqdm=False)
        experts = llm.engine.executor.runner.model.model.layers[2].mlp.experts
        assert llm.stats()["weight_quantization"] == "fp8"
    assert experts.w2.dtype == torch.float8_e4m3fn and experts.w2_scale_inv.float().min() > 0
    assert all(len(o.token_ids) == MAX_TOKENS for o in outs)


def test_a_missing_expert_scale_is_named(checkpoints, tmp_path):
    path = build_fp8_moe_checkpoint(tmp_path / "ckpt")
    file = os.path.join(path, "model.safetensors")
    tensors = load_file(file)
    del tensors["model.layers.2.mlp.experts.3.down_proj.weight_scale_inv"]
    save_file(tensors, file, metadata={"format": "pt"})
    with pytest.raises(
        ValueError, match=r"missing 1 tensor\(s\), e.g. \['model.layers.2.mlp.experts.3.down_proj"
    ):
        LLM(path, **BASE)


@pytest.mark.slow  # a whole MoE engine under the Triton interpreter
def test_triton_fp8_experts_in_the_engine_match_the_reference(checkpoints, reference, monkeypatch):
    """The GPU's path (routing kernel; one-kernel grouping and the fp8 grouped GEMMs for prefills, the fp8
    decode path for the decode steps of 3 sequences) through the engine on CPU, in the Triton interpreter."""
    decode_calls = recording_decode_calls(monkeypatch)
    short = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)  # the interpreter is slow
    with LLM(checkpoints["fp8"], kv_block_size=16, **BASE) as llm:
        assert llm.stats()["moe_kernel"] == "triton: grouping in one kernel (self-checked)"
        outs = llm.generate(PROMPTS[:3], short, use_tqdm=False)
    assert [o.token_ids for o in outs] == [tokens[:5] for tokens in reference[:3]]
    assert decode_calls and set(decode_calls) == {3}


@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="Triton on the CPU needs the interpreter"
)
def test_triton_fp8_dense_layers_take_inputs_quantized_by_their_producers(
    checkpoints, reference, monkeypatch
):
    """The Triton fp8 GEMMs (experts on the reference): the norms before qkv_proj and the dense layer's
    gate_up_proj, and its SwiGLU, quantize for them; the MoE layers' norm output (router and experts)
    stays unquantized. The same greedy tokens."""
    calls = counting_producers(monkeypatch)
    short = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)  # the interpreter is slow
    with LLM(checkpoints["fp8"], gemm_backend="triton", enable_prefix_caching=False, **BASE) as llm:
        outs = llm.generate(PROMPTS[:2], short, use_tqdm=False)
    assert [o.token_ids for o in outs] == [tokens[:3] for tokens in reference[:2]]
    # per forward: 3 qkv norms + 1 dense gate_up norm, 1 SwiGLU (layer 1 of 3 is dense)
    assert calls["rms_norm_quantized"] == 4 * calls["silu_and_mul_quantized"] > 0
