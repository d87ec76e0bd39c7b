"""The fp8 KV cache (`cache.kv_cache_dtype=fp8_e4m3`): the knob, sizing, the quantize convention
of kernels/base.py in the torch reference and the Triton kernels, start-up calibration, and the
engine on every cache path.

Without CUDA the Triton kernels run in the CPU interpreter (fp8 loads and stores work there; its
own fp32 -> fp8 cast does not round correctly, which the store kernel avoids by rounding first).
The `gpu` tests run the kernels at real shapes in bf16 and the engine with CUDA graphs.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from checkpoints import random_prompts
from helpers import compose_cfg, quick_first
from torch import nn
from transformers import Qwen3Config, Qwen3ForCausalLM

from nanoexp import LLM, SamplingParams
from nanoexp.config import CacheConfig, EngineConfig, KnobError
from nanoexp.experiment.schema import ConfigError, to_spec
from nanoexp.kernels import select, self_check
from nanoexp.kernels.base import FP8_DTYPE, FP8_MAX
from nanoexp.kernels.torch_ref import TorchAttentionBackend
from nanoexp.layers.attention import Attention, attention_layers
from nanoexp.runner import kv_scales
from nanoexp.runner.kv_cache import create_kv_cache

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the Triton interpreter's numpy use

ON_CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if ON_CUDA else "cpu")
needs_cuda = pytest.mark.skipif(not ON_CUDA, reason="needs a CUDA device")
HALF_ULP = 2.0**-4  # e4m3 keeps 3 mantissa bits: round to nearest is within 2^-4 relative


# ---------------------------------------------------------------- the knob


@pytest.mark.parametrize("value", ["auto", "fp8", "fp8_e4m3"])
def test_the_knob_takes_vllms_names(value):
    assert CacheConfig(kv_cache_dtype=value).kv_cache_dtype == value
    assert EngineConfig.from_kwargs("m", kv_cache_dtype=value).cache.kv_cache_dtype == value


@pytest.mark.parametrize("value", ["fp8_e5m2", "float16", "FP8", None, 8])
def test_other_values_are_one_line_errors_naming_the_knob(value):
    allowed = " is invalid: must be one of auto, fp8, fp8_e4m3$"
    with pytest.raises(KnobError, match=r"^cache\.kv_cache_dtype=.*" + allowed):
        CacheConfig(kv_cache_dtype=value)
    with pytest.raises(KnobError, match=r"^kv_cache_dtype=.*" + allowed):
        EngineConfig.from_kwargs("m", kv_cache_dtype=value)


def test_the_hydra_group_composes_the_knob():
    assert to_spec(compose_cfg("model=qwen3_tiny", "cache.kv_cache_dtype=fp8")).cache.kv_cache_dtype == "fp8"
    with pytest.raises(ConfigError, match="cache.kv_cache_dtype='int8' is invalid"):
        to_spec(compose_cfg("model=qwen3_tiny", "cache.kv_cache_dtype=int8"))


def test_flash_attn_with_an_fp8_cache_is_an_error_naming_both_knobs():
    message = "attention_backend='flash_attn' does not support kv_cache_dtype='fp8'"
    with pytest.raises(ValueError, match=message):
        select.make_attention_backend("flash_attn", DEVICE, 256, kv_cache_dtype="fp8")


def test_auto_never_offers_flash_attn_for_an_fp8_cache(monkeypatch):
    monkeypatch.setattr(select, "flash_attn_available", lambda: True)
    cuda = torch.device("cuda")
    assert "flash_attn" in [n for n, _ in select.auto_candidates(cuda, 256, torch.bfloat16)]
    assert "flash_attn" not in [n for n, _ in select.auto_candidates(cuda, 256, torch.bfloat16, True)]


# ---------------------------------------------------------------- sizing


def two_layer_model() -> nn.Module:
    return nn.ModuleList([Attention(4, 2, 32, 32**-0.5) for _ in range(2)])


def test_an_fp8_cache_holds_twice_the_blocks_of_bf16_in_the_same_budget():
    model = two_layer_model()
    caches = {}
    for kv_dtype in ("auto", "fp8"):
        config = EngineConfig.from_kwargs(
            "m", cpu_kv_cache_gib=1 / 64, kv_block_size=16, kv_cache_dtype=kv_dtype
        )
        caches[kv_dtype] = create_kv_cache(config, model, torch.bfloat16, torch.device("cpu"), lambda: 0, 0)
    auto, fp8 = caches["auto"], caches["fp8"]
    assert auto.dtype == torch.bfloat16 and fp8.dtype == FP8_DTYPE
    assert fp8.shape[2] == 2 * auto.shape[2] == 2 * (2**24 // (2 * 2 * 2 * 32 * 16 * 2))  # blocks
    assert fp8.nbytes == auto.nbytes
    assert all(layer.k_cache.dtype == FP8_DTYPE for layer in attention_layers(model))


# ---------------------------------------------------------------- the torch reference


def test_the_reference_stores_within_fp8_precision_and_saturates():
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(40, 2, 16, generator=gen) * 3
    v = torch.randn(40, 2, 16, generator=gen) * 3
    v[0, 0, :2] = torch.tensor([1e6, -1e6])  # far beyond 448 x scale: saturates
    k_cache = torch.zeros(5, 8, 2, 16, dtype=FP8_DTYPE)
    v_cache = torch.zeros_like(k_cache)
    k_scale, v_scale = torch.tensor([0.05]), torch.tensor([0.1])
    table = torch.tensor([3, 0, 4, 1, 2], dtype=torch.int32)
    slots = table.long()[torch.arange(40) // 8] * 8 + torch.arange(40) % 8
    TorchAttentionBackend().store_kv(k, v, k_cache, v_cache, slots, k_scale, v_scale)
    k_back, v_back = k_cache.flatten(0, 1)[slots], v_cache.flatten(0, 1)[slots]
    k_back, v_back = k_back.float() * k_scale, v_back.float() * v_scale
    normal = k.abs() > 2**-6 * 0.05  # below, e4m3 is subnormal: absolute error 2^-10 x scale
    assert ((k_back - k).abs() <= HALF_ULP * k.abs() + 1e-7)[normal].all()
    assert ((k_back - k).abs() <= 2**-10 * 0.05 + 1e-9).logical_or(normal).all()
    assert torch.equal(v_back[0, 0, :2], torch.tensor([FP8_MAX, -FP8_MAX]) * v_scale)
    assert ((v_back - v).abs() <= HALF_ULP * v.abs() + 2**-10 * 0.1)[1:].all()


def test_an_fp8_cache_without_scales_is_an_error():
    cache = torch.zeros(2, 4, 1, 8, dtype=FP8_DTYPE)
    x = torch.randn(1, 1, 8)
    with pytest.raises(ValueError, match="fp8 KV cache needs k_scale and v_scale"):
        TorchAttentionBackend().store_kv(x, x, cache, cache.clone(), torch.tensor([0]))


def test_the_reference_passes_its_own_fp8_check():
    result = self_check.check_backend(TorchAttentionBackend(), DEVICE, torch.float32, 16, 16, kv_fp8=True)
    assert result.ok, result.reason


class UnscaledStore(TorchAttentionBackend):
    """Stores without dividing by the scale (a plausible kernel bug)."""

    name = "unscaled_store"

    def store_kv(self, k, v, k_cache, v_cache, slot_mapping, k_scale=None, v_scale=None):
        one = torch.ones(1, device=k.device)
        super().store_kv(k, v, k_cache, v_cache, slot_mapping, one, one)


def test_the_fp8_self_check_rejects_a_store_that_ignores_the_scales(monkeypatch):
    monkeypatch.setattr(self_check, "_results", {})
    result = self_check.check_backend(UnscaledStore(), DEVICE, torch.float32, 16, 16, kv_fp8=True)
    assert not result.ok and "store_kv wrote different K/V" in result.reason


# ---------------------------------------------------------------- Triton kernels against the reference


def awkward_values(gen, shape, dtype) -> torch.Tensor:
    """Normal, subnormal (in e4m3 after scaling), saturating, signed zeros."""
    x = torch.randn(shape, generator=gen) * torch.logspace(-5, 2, shape[-1])
    x.view(-1)[:4] = torch.tensor([0.0, -0.0, 1e-12, -1e-12])
    return x.to(DEVICE, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_triton_store_quantizes_bit_for_bit_as_the_reference(dtype):
    from nanoexp.kernels.triton_kv import store_kv

    gen = torch.Generator().manual_seed(1)
    k, v = awkward_values(gen, (24, 2, 40), dtype), awkward_values(gen, (24, 2, 40), dtype)
    slots = torch.randperm(32, generator=gen)[:24].to(DEVICE)
    slots[5] = -1  # padding: stores nothing
    k_scale, v_scale = torch.tensor([0.07], device=DEVICE), torch.tensor([0.003], device=DEVICE)
    poison = torch.full((4, 8, 2, 40), float("nan")).to(DEVICE, FP8_DTYPE)
    caches = [poison.clone() for _ in range(4)]
    store_kv(k, v, caches[0], caches[1], slots, k_scale, v_scale)
    TorchAttentionBackend().store_kv(k, v, caches[2], caches[3], slots, k_scale, v_scale)
    for got, want in ((caches[0], caches[2]), (caches[1], caches[3])):
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


@pytest.mark.parametrize(
    ("dtype", "head_dim", "heads", "block_size"),
    [(torch.float32, 16, (8, 2), 16), (torch.float16, 24, (4, 1), 8)],  # GQA; MQA with head_dim not 2^k
)
def test_triton_fp8_decode_and_prefill_match_the_reference(dtype, head_dim, heads, block_size):
    from nanoexp.kernels.triton_backend import TritonAttentionBackend

    error = self_check.max_error(
        TritonAttentionBackend(), DEVICE, dtype, head_dim, block_size, heads=heads, kv_fp8=True
    )
    assert error <= self_check.TOLERANCE[dtype], error


# Decode batches of many sequences, long and short, some past a 256-key page and a 128-key tile.
CUDA_CORE_CASES = [([1, 300, 129, 128, 2, 257, 70, 600, 45], [1] * 9, False)]


@pytest.mark.slow  # the quick loop's cuda-core case: test_cuda_core_decode_gives_the_tensor_core_result...
@pytest.mark.parametrize(
    ("dtype", "head_dim", "heads", "block_size"),
    [(torch.float32, 16, (4, 2), 1), (torch.float16, 40, (3, 3), 16), (torch.float32, 128, (4, 2), 256)],
)  # GQA 2 and MHA; head_dim not 2^k; pages smaller and larger than a tile
def test_triton_cuda_core_decode_matches_the_reference(dtype, head_dim, heads, block_size):
    """kernels/triton_decode_fma.py through the backend, as paged_decode picks it (from 8 sequences);
    its products are fp16 whatever the model dtype, hence fp16's tolerance."""
    from nanoexp.kernels import triton_attention
    from nanoexp.kernels.triton_backend import TritonAttentionBackend

    assert triton_attention.uses_cuda_cores(True, heads[0] // heads[1], head_dim, 9)
    error = self_check.max_error(
        TritonAttentionBackend(), DEVICE, dtype, head_dim, block_size, CUDA_CORE_CASES, heads, kv_fp8=True
    )
    assert error <= self_check.TOLERANCE[torch.float16], error


@pytest.mark.parametrize(*quick_first("num_splits", [1, 3, 5], quick=1))
def test_cuda_core_decode_gives_the_tensor_core_result_at_any_split_count(num_splits):
    from nanoexp.kernels.triton_attention import paged_decode

    gen = torch.Generator().manual_seed(num_splits)
    lens, block_size, pages_per_seq = [1, 200, 77, 129], 16, 13
    pages = pages_per_seq * len(lens)
    shape = (pages, block_size, 2, 32)
    k_cache, v_cache = (torch.randn(shape, generator=gen).to(DEVICE, FP8_DTYPE) for _ in "kv")
    tables = torch.randperm(pages, generator=gen).to(DEVICE, torch.int32).view(len(lens), pages_per_seq)
    q = torch.randn(len(lens), 4, 32, generator=gen).to(DEVICE)
    scale = torch.full((1,), 0.5, device=DEVICE)
    args = (q, k_cache, v_cache, tables, torch.tensor(lens, dtype=torch.int32, device=DEVICE), 0.2)
    kw = dict(num_splits=num_splits, k_scale=scale, v_scale=scale)
    tensor_cores = paged_decode(*args, cuda_cores=False, **kw)
    cuda_cores = paged_decode(*args, cuda_cores=True, **kw)
    torch.testing.assert_close(cuda_cores, tensor_cores, atol=5e-3, rtol=0)


def test_the_cuda_core_decode_serves_only_fp8_caches_and_small_groups():
    from nanoexp.kernels.triton_attention import paged_decode, uses_cuda_cores

    assert uses_cuda_cores(True, 2, 128, 8)
    assert not uses_cuda_cores(True, 2, 128, 7)  # 1-7 sequences: the tensor-core kernel
    assert not uses_cuda_cores(True, 4, 128, 256)  # 4 query heads per kv head: slower
    assert not uses_cuda_cores(True, 2, 256, 256)  # its tiles would spill
    assert not uses_cuda_cores(False, 2, 128, 256)
    cache = torch.zeros(2, 16, 2, 32, device=DEVICE)
    table = torch.zeros(1, 2, dtype=torch.int32, device=DEVICE)
    args = (torch.zeros(1, 8, 32, device=DEVICE), cache, cache, table, table[:, 0] + 1, 1.0)
    needs = r"^paged_decode\(cuda_cores=True\) needs an fp8 cache.*4 heads per kv head, head_dim 32$"
    with pytest.raises(ValueError, match=needs):
        paged_decode(*args, cuda_cores=True)


# ---------------------------------------------------------------- calibration


class PassThrough(TorchAttentionBackend):
    def prefill(self, q, *args):
        return q


def test_calibration_sets_each_layers_scales_from_its_kv_amax():
    model = two_layer_model()
    k_amax = [3.0, 0.0]  # a layer that saw only zeros still gets a usable scale
    md = SimpleNamespace(has_prefill=True, num_decodes=0)

    def prefill():
        for layer, amax in zip(attention_layers(model), k_amax, strict=True):
            layer.backend = PassThrough()
            k = torch.zeros(5, 2, 32)
            k[2, 1, 3] = -amax
            layer(torch.zeros(5, 4, 32), k, torch.full((5, 2, 32), 0.5), md)

    scales_before = attention_layers(model)[0].k_scale
    kv_scales.calibrate_kv_scales(model, prefill)
    first, second = attention_layers(model)
    assert first.k_scale is scales_before  # updated in place: CUDA graphs hold the address
    assert first.k_scale.item() == pytest.approx(3.0 / FP8_MAX * kv_scales.HEADROOM)
    assert second.k_scale.item() == pytest.approx(kv_scales.MIN_AMAX / FP8_MAX * kv_scales.HEADROOM)
    assert first.v_scale.item() == pytest.approx(0.5 / FP8_MAX * kv_scales.HEADROOM)
    assert not any(layer._forward_pre_hooks for layer in attention_layers(model))


def test_calibration_tokens_are_fixed_and_fit_the_budget():
    assert kv_scales.calibration_tokens(384, 10**6) == kv_scales.calibration_tokens(384, 10**6)
    assert len(kv_scales.calibration_tokens(384, 100)) == 100
    assert max(kv_scales.calibration_tokens(384, 10**6)) < 384


# ---------------------------------------------------------------- the engine


@pytest.fixture(scope="module")
def peaked_checkpoint(tmp_path_factory):
    """A tiny Qwen3 with larger weights than conftest's, so its greedy tokens depend on the context
    (with the default init every prompt decodes one repeated token and any cache would pass)."""
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=384,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        eos_token_id=383,
        bos_token_id=382,
        initializer_range=0.1,
    )
    model = Qwen3ForCausalLM(config).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    path = tmp_path_factory.mktemp("peaked")
    model.save_pretrained(path)
    return str(path)


SHARED = random_prompts([48], seed=2)[0]
# The last two share three 16-token blocks (prefix-cache hits when they run one after the other).
PROMPTS = random_prompts([5, 30, 70, 17, 120, 9], seed=1) + [SHARED + [1], SHARED + [2, 3]]
AGREE_TOKENS = 4  # the first token comes from the prefill's fresh K/V; the next three read the cache
SMALL_BUDGET = dict(cpu_kv_cache_gib=1 / 64, num_kv_blocks=-1)


def generate(path, max_tokens=12, **kwargs):
    args = dict(device="cpu", kv_block_size=16, max_num_seqs=8, num_kv_blocks=256) | kwargs
    with LLM(path, **args) as llm:
        outs = llm.generate(
            PROMPTS, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True), use_tqdm=False
        )
        assert llm.engine.block_manager.num_used == 0  # no block leaked
        return outs, llm.stats()


def agreeing(outputs, reference) -> int:
    """Prompts whose first AGREE_TOKENS greedy tokens equal the reference's."""
    return sum(
        a.token_ids[:AGREE_TOKENS] == b.token_ids[:AGREE_TOKENS]
        for a, b in zip(outputs, reference, strict=True)
    )


@pytest.fixture(scope="module")
def auto_run(peaked_checkpoint):
    """The float32 cache's outputs; equal on every cache path (test_engine_parity.py)."""
    return generate(peaked_checkpoint, kv_cache_dtype="auto", **SMALL_BUDGET)


def test_fp8_greedy_tokens_mostly_follow_the_model_dtype_cache(peaked_checkpoint, auto_run, monkeypatch):
    reference, auto_stats = auto_run
    outputs, stats = generate(peaked_checkpoint, kv_cache_dtype="fp8_e4m3", **SMALL_BUDGET)
    assert agreeing(outputs, reference) >= 7
    assert stats["kv_cache_dtype"] == "float8_e4m3fn" and auto_stats["kv_cache_dtype"] == "float32"
    assert stats["num_kv_blocks"] == 4 * auto_stats["num_kv_blocks"]  # the same budget, a quarter the bytes
    assert 0 < stats["kv_k_scale_mean"] <= stats["kv_k_scale_max"] < 1 and auto_stats["kv_v_scale_max"] == 1.0
    # The criterion can fail: scales 32x too small saturate K/V and break agreement.
    monkeypatch.setattr(kv_scales, "HEADROOM", kv_scales.HEADROOM / 32)
    saturated, _ = generate(peaked_checkpoint, kv_cache_dtype="fp8_e4m3")
    assert agreeing(saturated, reference) <= 2


FP8_PATHS = {
    "prefix_cache": dict(enable_prefix_caching=True, max_num_seqs=1),
    "chunked": dict(max_num_batched_tokens=32, enable_prefix_caching=False),
    "preemption": dict(num_kv_blocks=14),
    "block1": dict(kv_block_size=1, num_kv_blocks=2048),
    "block256": dict(kv_block_size=256, num_kv_blocks=16),
}


@pytest.mark.parametrize(*quick_first("path_name", list(FP8_PATHS), quick=2))
def test_every_cache_path_runs_with_fp8(peaked_checkpoint, auto_run, path_name):
    outputs, _ = generate(peaked_checkpoint, kv_cache_dtype="fp8", **FP8_PATHS[path_name])
    assert all(len(o.token_ids) == 12 for o in outputs)
    assert agreeing(outputs, auto_run[0]) >= 6
    if path_name == "prefix_cache":
        assert outputs[-1].num_cached_tokens == 48
    if path_name == "preemption":
        assert sum(o.num_preemptions for o in outputs) > 0


@pytest.mark.slow  # tensor-parallel worker processes
def test_tp2_fp8_follows_tp1(peaked_checkpoint):
    """Each rank calibrates the scales of its own KV heads (TP=1's span all heads, so they may
    differ): the sharded fp8 cache must still follow the unsharded one."""
    tp1, _ = generate(peaked_checkpoint, max_tokens=6, kv_cache_dtype="fp8")
    tp2, stats = generate(peaked_checkpoint, max_tokens=6, kv_cache_dtype="fp8", tensor_parallel_size=2)
    assert agreeing(tp2, tp1) >= 7
    assert stats["kv_cache_dtype"] == "float8_e4m3fn"


# ---------------------------------------------------------------- GPU


@pytest.mark.parametrize(
    ("head_dim", "heads", "block_size"),
    [(128, (16, 8), 16), (128, (16, 8), 256), (96, (14, 2), 16), (80, (8, 1), 1), (64, (8, 1), 32)],
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.gpu
@pytest.mark.gpu_quick
@needs_cuda
def test_gpu_triton_fp8_matches_the_reference(dtype, head_dim, heads, block_size):
    from nanoexp.kernels.triton_backend import TritonAttentionBackend

    cases = [
        ([1, block_size + 3, 300, 1000], [1, 1, 1, 1], False),
        ([block_size + 130, 9, 700], [130, 9, 64], True),
        ([170, 5], [170, 5], True),
    ]
    error = self_check.max_error(
        TritonAttentionBackend(), DEVICE, dtype, head_dim, block_size, cases, heads, seed=3, kv_fp8=True
    )
    assert error <= self_check.TOLERANCE[dtype], error


@pytest.mark.parametrize(("heads", "block_size"), [((16, 8), 16), ((16, 8), 256), ((14, 14), 16)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.gpu
@needs_cuda
def test_gpu_cuda_core_decode_matches_the_reference(dtype, heads, block_size):
    from nanoexp.kernels.triton_backend import TritonAttentionBackend

    error = self_check.max_error(
        TritonAttentionBackend(), DEVICE, dtype, 128, block_size, CUDA_CORE_CASES, heads, seed=5, kv_fp8=True
    )
    assert error <= self_check.TOLERANCE[dtype], error


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.gpu
@needs_cuda
def test_gpu_triton_store_is_bit_exact(dtype):
    test_triton_store_quantizes_bit_for_bit_as_the_reference(dtype)


@pytest.mark.gpu
@needs_cuda
def test_gpu_engine_fp8_with_and_without_graphs(peaked_checkpoint):
    """float32 model, fp8 cache: auto picks the self-checked Triton backend, CUDA graphs replay the
    same kernels as eager, and the tokens mostly follow a float32 cache."""
    args = dict(device="cuda", kv_block_size=16, max_num_seqs=8, num_kv_blocks=256, dtype="float32")
    runs = {}
    for name, extra in {"graphs": {}, "eager": dict(enforce_eager=True)}.items():
        with LLM(peaked_checkpoint, kv_cache_dtype="fp8", **args, **extra) as llm:
            runs[name] = llm.generate(
                PROMPTS, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), use_tqdm=False
            )
            stats = llm.stats()
        assert stats["attention_backend"] == "triton" and stats["kv_cache_dtype"] == "float8_e4m3fn"
        assert stats["cuda_graphs"] == (name == "graphs")
    assert [o.token_ids for o in runs["graphs"]] == [o.token_ids for o in runs["eager"]]
    with LLM(peaked_checkpoint, **args) as llm:
        reference = llm.generate(
            PROMPTS, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), use_tqdm=False
        )
    assert agreeing(runs["graphs"], reference) >= 7


def warm_up_through_cache(runner) -> int:
    runner.run_prefill_through_cache(200)  # the cache's first 13 blocks filled with a warm-up's K/V
    runner.run_prefill_through_cache(200, cached_prefix=True)  # a prefix-cache hit's variant: 14 blocks
    return int(runner.kv_cache[:, :, :14].float().abs().sum() > 0)


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "auto"])
def test_the_warm_up_prefills_through_the_cache_leave_no_trace(peaked_checkpoint, kv_cache_dtype):
    """The warm-ups that compile the prefill variants reading the cache (an fp8 cache's, a prefix-cache
    hit's; on CUDA, at start-up) store their K/V in the cache's first blocks; requests that later get
    those blocks read only what they wrote."""
    args = dict(device="cpu", kv_block_size=16, max_num_seqs=8, num_kv_blocks=256)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    with LLM(peaked_checkpoint, kv_cache_dtype=kv_cache_dtype, **args) as llm:
        want = [o.token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]
        llm.engine.reset_prefix_cache()
        assert llm.engine.executor.call(warm_up_through_cache) == 1
        got = [o.token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    assert got == want
