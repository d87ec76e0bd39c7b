"""The q/k norm + RoPE + KV-store kernel and the SwiGLU kernel, against the torch
ops they replace. Without CUDA they run in the Triton CPU interpreter (see test_triton_kernels.py).

The interpreter casts fp32 -> bf16 by truncation (the GPU rounds to nearest even), so bf16 is
compared within one bf16 step; fp16 and fp32 casts are exact there and so are compared bitwise.
"""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from checkpoints import random_prompts  # noqa: E402
from helpers import DEVICE, quick_first  # noqa: E402

from nanoexp import LLM, SamplingParams  # noqa: E402
from nanoexp.kernels.torch_ref import TorchAttentionBackend, quantize_fp8  # noqa: E402
from nanoexp.kernels.triton_qk_norm_rope import qk_norm_rope_store as fused_op  # noqa: E402
from nanoexp.layers.rope import RotaryEmbedding, apply_rope, qk_norm_rope  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

NUM_BLOCKS, BLOCK_SIZE = 24, 16  # 384 slots: room for the 256-token case


def make_inputs(tokens, heads, kv_heads, head_dim, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    qkv = 3 * torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=gen)
    weights = [1 + 0.2 * torch.randn(head_dim, generator=gen) for _ in range(2)]
    positions = torch.randint(0, 1000, (tokens,), generator=gen)
    slots = torch.randperm(NUM_BLOCKS * BLOCK_SIZE, generator=gen)[:tokens]
    slots[1::3] = -1  # padding rows: q still produced, nothing stored
    cos_sin = RotaryEmbedding(head_dim, 1024, 10000.0).cos_sin
    to = dict(device=DEVICE)
    return (
        qkv.to(DEVICE, dtype),
        positions.to(**to),
        cos_sin.to(**to),
        [w.to(DEVICE, dtype) for w in weights],
        slots.to(**to),
    )


def reference(qkv, positions, cos_sin, weights, slots, heads, kv_heads, norm, cache_dtype):
    """The unfused torch path: qk_norm_rope (or apply_rope), then the reference store_kv."""
    head_dim = cos_sin.shape[1]
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q, k, v = q.view(-1, heads, head_dim), k.view(-1, kv_heads, head_dim), v.view(-1, kv_heads, head_dim)
    if norm:
        q, k = qk_norm_rope(positions, q, k, *weights, 1e-6, cos_sin)
    else:
        q, k = apply_rope(positions, q, k, cos_sin)
    k_cache, v_cache = poisoned_caches(kv_heads, head_dim, cache_dtype)
    TorchAttentionBackend().store_kv(k.to(cache_dtype), v.to(cache_dtype), k_cache, v_cache, slots)
    return q, k, k_cache, v_cache


def poisoned_caches(kv_heads, head_dim, dtype):
    cache = torch.full((NUM_BLOCKS, BLOCK_SIZE, kv_heads, head_dim), 7.5, device=DEVICE).to(dtype)
    return cache, cache.clone()


def run_fused(qkv, positions, cos_sin, weights, slots, heads, kv_heads, norm, cache_dtype, **kw):
    k_cache, v_cache = poisoned_caches(kv_heads, cos_sin.shape[1], cache_dtype)
    q_w, k_w = weights if norm else (None, None)
    kw.setdefault("heads_block", 8)  # fewer programs for the interpreter; tested separately
    q, k = fused_op(
        qkv, positions, cos_sin, q_w, k_w, 1e-6, heads, kv_heads, k_cache, v_cache, slots, write_k=True, **kw
    )
    return q, k, k_cache, v_cache


TOLERANCES = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (2**-5, 2**-6)}


def assert_same(got, want, dtype, exact):
    """Exact, or within the dtype's rounding: the norm's sum of squares is reduced in another
    order than torch's, which moves some roundings by one step."""
    assert got.dtype == want.dtype and got.shape == want.shape
    if exact:
        assert torch.equal(got, want)
        return
    atol, rtol = TOLERANCES[dtype]
    torch.testing.assert_close(got.float(), want.float(), atol=atol, rtol=rtol)
    if dtype == torch.float16:  # in fp32 one step of a head's rstd moves the whole head
        assert (got == want).float().mean() > 0.9


CASES = [  # tokens, heads, kv heads, head_dim, dtype
    (1, 16, 8, 128, torch.bfloat16),
    (7, 4, 2, 64, torch.float32),  # rows 1 and 4 are padding (slot -1)
    (33, 6, 2, 80, torch.float16),  # head_dim not a power of two
    (7, 5, 1, 96, torch.bfloat16),  # MQA, heads not a multiple of a power of two
    (16, 3, 1, 128, torch.float32),
]


@pytest.mark.parametrize("norm", [True, False], ids=["qwen3", "qwen2"])
@pytest.mark.parametrize(*quick_first("tokens, heads, kv_heads, head_dim, dtype", CASES, quick=2))
def test_fused_matches_torch_ops(tokens, heads, kv_heads, head_dim, dtype, norm):
    inputs = make_inputs(tokens, heads, kv_heads, head_dim, dtype, seed=tokens + head_dim)
    want = reference(*inputs, heads, kv_heads, norm, dtype)
    got = run_fused(*inputs, heads, kv_heads, norm, dtype)
    # RoPE alone is exact where the interpreter's casts are.
    exact = not norm and (dtype != torch.bfloat16 or DEVICE.type == "cuda")
    for g, w in zip(got[:3], want[:3]):  # q, k, k cache (poison kept at skipped slots)
        assert_same(g, w, dtype, exact)
    assert torch.equal(got[3], want[3])  # v is copied raw


@pytest.mark.parametrize("heads_block", [1, 2, 8])
def test_heads_per_program_does_not_change_results(heads_block):
    inputs = make_inputs(3, 6, 2, 80, torch.float16, seed=3)
    want = reference(*inputs, 6, 2, True, torch.float16)
    got = run_fused(*inputs, 6, 2, True, torch.float16, heads_block=heads_block)
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def test_fp8_cache_needs_scales():
    inputs = make_inputs(3, 4, 2, 64, torch.bfloat16)
    with pytest.raises(ValueError, match="k_scale and v_scale"):
        run_fused(*inputs, 4, 2, True, torch.float8_e4m3fn)


# The interpreter converts fp32 to e4m3 wrongly (31.25 -> 16, 100 -> 104; torch and the GPU give
# 32 and 96), so the values of the fp8 path are checked on the GPU only.
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_fp8_cache_stores_scaled_and_clamped_values(dtype):
    inputs = make_inputs(33, 16, 8, 128, dtype, seed=5)
    k_scale = torch.tensor([0.005], device=DEVICE)  # small: some values clamp at +-448
    v_scale = torch.tensor([0.5], device=DEVICE)
    q_ref, k_ref, _, _ = reference(*inputs, 16, 8, True, dtype)
    q, k, k_cache, v_cache = run_fused(
        *inputs, 16, 8, True, torch.float8_e4m3fn, k_scale=k_scale, v_scale=v_scale
    )
    slots = inputs[4]
    keep = slots >= 0
    v = inputs[0][:, -8 * 128 :].view(-1, 8, 128)
    stored_k = k_cache.view(-1, 8, 128)[slots[keep]].view(torch.uint8)
    stored_v = v_cache.view(-1, 8, 128)[slots[keep]].view(torch.uint8)
    assert torch.equal(stored_k, quantize_fp8(k[keep], k_scale).view(torch.uint8))
    assert torch.equal(stored_v, quantize_fp8(v[keep], v_scale).view(torch.uint8))
    assert (k_cache.view(-1, 8, 128)[slots[keep]].float().abs() == 448).any()
    assert_same(q, q_ref, dtype, exact=False)
    assert_same(k, k_ref, dtype, exact=False)


@pytest.mark.slow  # a whole engine under the Triton interpreter; the kernel tests above cover the kernel
def test_fused_path_in_the_engine_matches_transformers(checkpoints, reference_outputs):
    """Prefill without and with a cached prefix and decode, all through the fused op."""
    name = "qwen3_gqa4"
    shared = random_prompts([17], seed=21)[0]
    prompts = [shared + [5], shared + [6, 7]]
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    with LLM(
        checkpoints[name][0],
        attention_backend="triton",
        kv_block_size=16,
        num_kv_blocks=8,
        max_num_seqs=2,
        enable_prefix_caching=True,
    ) as llm:
        backend = llm.engine.executor.runner.backend
        backend.fuse_qk_norm_rope = True
        calls = count_calls(backend)
        outs = llm.generate(prompts[:1], params, use_tqdm=False)
        outs += llm.generate(prompts[1:], params, use_tqdm=False)  # reuses the cached prefix
    assert calls["fused"] > 0 and calls["store_kv"] == 0
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.token_ids == reference_outputs(name, prompt, 3), len(prompt)


def count_calls(backend) -> dict[str, int]:
    calls = {"fused": 0, "store_kv": 0}
    fused, store = backend.qk_norm_rope_store, backend.store_kv

    def counted_fused(*args):
        calls["fused"] += 1
        return fused(*args)

    def counted_store(*args):
        calls["store_kv"] += 1
        return store(*args)

    backend.qk_norm_rope_store, backend.store_kv = counted_fused, counted_store
    return calls


def test_backend_fuses_on_cuda_only_by_default():
    from nanoexp.kernels.triton_backend import TritonAttentionBackend

    inputs = make_inputs(2, 4, 2, 32, torch.float32)
    k_cache, v_cache = poisoned_caches(2, 32, torch.float32)
    args = (*inputs[:3], None, 4, 2, k_cache, v_cache, inputs[4], False)
    result = TritonAttentionBackend().qk_norm_rope_store(*args)
    assert (result is None) == (DEVICE.type == "cpu")
    assert TorchAttentionBackend().qk_norm_rope_store(*args) is None


# ---------------------------------------------------------------- GPU

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("tokens", [1, 16, 256])
def test_gpu_fused_matches_compiled_torch_ops_bf16(tokens):
    """Against the eager torch ops in bf16: the GPU rounds like torch, so most elements match."""
    inputs = make_inputs(tokens, 16, 8, 128, torch.bfloat16, seed=tokens)
    want = reference(*inputs, 16, 8, True, torch.bfloat16)
    got = run_fused(*inputs, 16, 8, True, torch.bfloat16)
    for g, w in zip(got, want):
        assert_same(g, w, torch.bfloat16, exact=False)


# ---------------------------------------------------------------- SwiGLU


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("rows", "width"), [(1, 64), (5, 1500), (3, 2100)])
def test_swiglu_kernel_matches_torch_op(rows, width, dtype):
    """Widths that are not a multiple of the kernel's block (masked tail) and a second block."""
    from nanoexp.kernels.triton_swiglu import silu_and_mul as kernel
    from nanoexp.layers.activation import silu_and_mul

    x = 3 * torch.randn(rows, 2 * width, generator=torch.Generator().manual_seed(rows)).to(DEVICE, dtype)
    out, ref = kernel(x), silu_and_mul(x)
    assert out.shape == (rows, width) and out.dtype == dtype
    step = 2.0**-7 if dtype == torch.bfloat16 else 2.0**-10  # the interpreter truncates bf16 casts
    torch.testing.assert_close(out.float(), ref.float(), rtol=2 * step, atol=1e-3)


def test_swiglu_kernel_is_bound_on_cuda_in_16_bit_only():
    from nanoexp.runner.model_setup import swiglu_kernel

    assert swiglu_kernel(torch.device("cpu"), torch.bfloat16) is None
    if torch.cuda.is_available():
        assert swiglu_kernel(torch.device("cuda"), torch.bfloat16) is not None
        assert swiglu_kernel(torch.device("cuda"), torch.float32) is None


@pytest.mark.gpu
@needs_cuda
def test_gpu_swiglu_kernel_matches_eager_torch_at_qwen3_width():
    from nanoexp.kernels.triton_swiglu import silu_and_mul as kernel
    from nanoexp.layers.activation import silu_and_mul

    x = 3 * torch.randn(4096, 2 * 3072, device="cuda", dtype=torch.bfloat16)
    out, ref = kernel(x).float(), silu_and_mul(x).float()
    torch.testing.assert_close(out, ref, rtol=2**-7, atol=1e-3)
    assert (out == ref).float().mean() > 0.99
