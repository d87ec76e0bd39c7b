"""Decode straight from the fused qkv projection (`engine.fuse_decode`): the split-K decode kernels
norm and rope their queries and store the new token's K/V themselves. Against the two launches
it replaces (the fused q/k norm + RoPE + store kernel, then decode) on every kernel variant. On
the CPU both run in the Triton interpreter with the same arithmetic, so they must agree bit for
bit; on the GPU the norm's sums run in another order, so within one rounding step.
"""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from nanoexp import LLM, SamplingParams  # noqa: E402
from nanoexp.kernels.base import FP8_DTYPE, key_major_values  # noqa: E402
from nanoexp.kernels.triton_attention import FromQkv, paged_decode, qkv_queries  # noqa: E402
from nanoexp.kernels.triton_fused import qk_norm_rope_store  # noqa: E402
from nanoexp.layers.rope import RotaryEmbedding  # noqa: E402
from tests.conftest import random_prompts  # noqa: E402
from tests.test_triton_kernels import DEVICE, cdiv, make_block_tables  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

EPS = 1e-6


def decode_case(ctx_lens, heads, kv_heads, head_dim, block_size, dtype, cache_dtype, norm, seed=0):
    """Random qkv rows of one decode step (the new token at context_lens - 1), caches of earlier
    tokens, and the arguments both paths share."""
    gen = torch.Generator().manual_seed(seed)
    num_blocks = sum(cdiv(n, block_size) for n in ctx_lens) + 3
    shape = (num_blocks, block_size, kv_heads, head_dim)
    k_cache, v_cache = (torch.randn(shape, generator=gen).to(DEVICE, cache_dtype) for _ in range(2))
    table = make_block_tables([max(n, 1) for n in ctx_lens], block_size, num_blocks, gen)
    positions = torch.tensor([max(n - 1, 0) for n in ctx_lens], device=DEVICE)
    slots = [
        int(table[i, p // block_size]) * block_size + p % block_size for i, p in enumerate(positions.tolist())
    ]
    slots = torch.tensor([s if n else -1 for s, n in zip(slots, ctx_lens)], device=DEVICE)  # padding row
    qkv = 2 * torch.randn(len(ctx_lens), (heads + 2 * kv_heads) * head_dim, generator=gen)
    weights = [(1 + 0.2 * torch.randn(head_dim, generator=gen)).to(DEVICE, dtype) for _ in range(2)]
    scales = (
        [torch.tensor([s], device=DEVICE) for s in (0.02, 0.015)] if cache_dtype == FP8_DTYPE else [None] * 2
    )
    return dict(
        qkv=qkv.to(DEVICE, dtype),
        positions=positions,
        slots=slots,
        k_cache=k_cache,
        v_cache=v_cache,
        table=table,
        ctx=torch.tensor(ctx_lens, dtype=torch.int32, device=DEVICE),
        cos_sin=RotaryEmbedding(head_dim, 2048, 10000.0).cos_sin.to(DEVICE),
        qk_norm=(*weights, EPS) if norm else None,
        scales=scales,
        heads=heads,
        kv_heads=kv_heads,
    )


def two_launches(case, key_major=False, **decode_kw):
    k_cache, v_cache = case["k_cache"].clone(), case["v_cache"].clone()
    q_w, k_w, eps = case["qk_norm"] or (None, None, 0.0)
    q, _ = qk_norm_rope_store(
        case["qkv"],
        case["positions"],
        case["cos_sin"],
        q_w,
        k_w,
        eps,
        case["heads"],
        case["kv_heads"],
        k_cache,
        v_cache if not key_major else key_major_values(v_cache),
        case["slots"],
        k_scale=case["scales"][0],
        v_scale=case["scales"][1],
    )
    out = decode(case, q, k_cache, v_cache, key_major, **decode_kw)
    return out, k_cache, v_cache


def one_launch(case, key_major=False, **decode_kw):
    k_cache, v_cache = case["k_cache"].clone(), case["v_cache"].clone()
    q = qkv_queries(case["qkv"], case["heads"], case["cos_sin"].shape[1])
    from_qkv = FromQkv(case["positions"], case["cos_sin"], case["qk_norm"], case["slots"])
    out = decode(case, q, k_cache, v_cache, key_major, from_qkv=from_qkv, **decode_kw)
    return out, k_cache, v_cache


def decode(case, q, k_cache, v_cache, key_major, **kw):
    v_pages = key_major_values(v_cache) if key_major else v_cache
    k_scale, v_scale = case["scales"]
    scale = 1.5 / q.shape[-1] ** 0.5
    return paged_decode(
        q, k_cache, v_pages, case["table"], case["ctx"], scale, k_scale=k_scale, v_scale=v_scale, **kw
    )


def assert_same_step(got, want, dtype):
    """Output and both caches: bitwise in the interpreter; on the GPU within the rounding step the
    norm's reduction order moves (fp32: ~1e-6), and the caches hold the same stored tokens."""
    for g, w in zip(got, want):
        if DEVICE.type == "cpu":
            assert torch.equal(g, w)
        else:
            tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}[dtype]
            torch.testing.assert_close(g.float(), w.float(), atol=tol * 8, rtol=tol)


BF16 = torch.bfloat16
CASES = [  # ctx lens, heads, kv heads, head_dim, block size, dtype, num_splits
    ([5, 0, 37, 64], 4, 2, 64, 16, torch.float16, 3),  # a padding row (context 0, slot -1)
    ([130, 1, 17], 6, 2, 80, 16, torch.float32, 1),  # head_dim not a power of two, one split
    ([90, 33], 5, 1, 32, 8, BF16, 4),  # MQA, 5 query heads
    ([200], 16, 8, 128, 64, BF16, 16),  # Qwen3-0.6B's heads, many splits, new token in the last
]


@pytest.mark.parametrize("norm", [True, False], ids=["qwen3", "qwen2"])
@pytest.mark.parametrize(
    ("ctx_lens", "heads", "kv_heads", "head_dim", "block_size", "dtype", "splits"), CASES
)
def test_one_launch_matches_the_two_it_replaces(
    ctx_lens, heads, kv_heads, head_dim, block_size, dtype, splits, norm
):
    case = decode_case(
        ctx_lens, heads, kv_heads, head_dim, block_size, dtype, dtype, norm, seed=len(ctx_lens)
    )
    want = two_launches(case, num_splits=splits)
    got = one_launch(case, num_splits=splits)
    assert_same_step(got, want, dtype)
    written = case["slots"] >= 0
    changed = (got[1] != case["k_cache"]).flatten(0, 1).any(dim=(1, 2))
    assert changed.nonzero().flatten().tolist() == case["slots"][written].sort().values.tolist()


@pytest.mark.parametrize(
    ("heads", "cuda_cores", "key_major"),
    [(4, False, False), (4, True, False), (8, False, False), (4, False, True)],
)
@pytest.mark.parametrize("splits", [1, 4])
def test_fp8_cache_every_decode_kernel(heads, cuda_cores, key_major, splits):
    """fp8 stores through the scales on both paths; the CUDA-core kernel (1-2 query heads per kv
    head) and key-major V pages each prepare and store their own way."""
    case = decode_case([70, 0, 129], heads, 2, 64, 16, BF16, FP8_DTYPE, True, seed=heads + splits)
    kw = dict(num_splits=splits, cuda_cores=cuda_cores)
    want = two_launches(case, key_major, **kw)
    got = one_launch(case, key_major, **kw)
    assert_same_step(got[:1], want[:1], BF16)
    for g, w in zip(got[1:], want[1:]):
        same = (g.view(torch.uint8) == w.view(torch.uint8)).float().mean()
        assert same == 1 if DEVICE.type == "cpu" else same > 0.999


def test_the_engine_decodes_in_one_launch_and_matches_transformers(checkpoints, reference_outputs):
    """Decode through fused_decode (forced on, as on CUDA), with a cached prefix and two sequences;
    `engine.fuse_decode=false` keeps the separate launch, with the same tokens."""
    name = "qwen3_gqa4"
    shared = random_prompts([17], seed=21)[0]
    prompts = [shared + [5], shared + [6, 7]]
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    for fuse in (True, False):
        with LLM(
            checkpoints[name][0],
            attention_backend="triton",
            kvcache_block_size=16,
            num_kvcache_blocks=8,
            max_num_seqs=2,
            enable_prefix_caching=True,
            fuse_decode=fuse,
        ) as llm:
            backend = llm.engine.executor.runner.backend
            backend.fuse_qk_norm_rope = True
            calls = count_fused_decodes(backend)
            outs = llm.generate(prompts, params, use_tqdm=False)
        assert (calls["done"] > 0) == fuse
        for prompt, out in zip(prompts, outs, strict=True):
            assert out.token_ids == reference_outputs(name, prompt, 4), (fuse, len(prompt))


def count_fused_decodes(backend) -> dict[str, int]:
    calls = {"done": 0}
    fused = backend.fused_decode

    def counted(*args):
        out = fused(*args)
        calls["done"] += out is not None
        return out

    backend.fused_decode = counted
    return calls


def test_the_knob_is_a_boolean():
    from nanoexp.config import ExecutionConfig, KnobError

    with pytest.raises(KnobError, match="engine.fuse_decode"):
        ExecutionConfig(fuse_decode="yes")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("cache_dtype", [BF16, FP8_DTYPE], ids=["bf16", "fp8"])
@pytest.mark.parametrize("batch", [1, 8, 64, 256])
def test_gpu_one_launch_at_qwen3_shapes(batch, cache_dtype):
    """Qwen3-0.6B's heads at the engine's split counts and kernels (fp8 from 8 sequences: the
    CUDA-core kernel), block size 256, contexts up to 1,024."""
    gen = torch.Generator().manual_seed(batch)
    ctx_lens = torch.randint(1, 1025, (batch,), generator=gen).tolist()
    case = decode_case(ctx_lens, 16, 8, 128, 256, BF16, cache_dtype, True, seed=batch)
    want, got = two_launches(case, max_len=4096), one_launch(case, max_len=4096)
    assert_same_step(got[:1], want[:1], BF16)
    for g, w in zip(got[1:], want[1:]):
        assert (g.view(torch.uint8) == w.view(torch.uint8)).float().mean() > 0.999
